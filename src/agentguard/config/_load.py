"""Loading a configuration: files, the ``reliability:`` wrapper, ``AGENTGUARD_*`` overrides.

Everything here works on any pydantic model class handed in (``GuardConfig`` in practice), so
the models beside it import this module and not the other way round. Every failure becomes a
:class:`~agentguard.ConfigError` naming the key path, the value and what is allowed.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from agentguard._redact import REDACTED, is_secret_key, redact
from agentguard.exceptions import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

__all__ = ["ENV_PREFIX", "ROOT", "load_file", "validate"]

#: Environment variables with this prefix override configuration keys.
ENV_PREFIX = "AGENTGUARD_"
#: The one top-level key of a configuration file.
ROOT = "reliability"

M = TypeVar("M", bound=BaseModel)


def validate(
    model: type[M],
    data: Mapping[str, Any] | None,
    *,
    env: Mapping[str, str] | None,
    source: str | None,
) -> M:
    """``data`` (with or without the ``reliability`` key) plus overrides from ``env``, validated.

    Args:
        model: the configuration class to build.
        data: the configuration; ``None`` or ``{}`` gives the defaults.
        env: where ``AGENTGUARD_*`` overrides are read; ``None`` means ``os.environ``, ``{}``
            disables overrides.
        source: a name for error messages (a file name).

    Raises:
        ConfigError: naming every bad key path, its value and what is allowed.
    """
    body = _unwrap(data or {}, source)
    body = _apply_env(model, body, os.environ if env is None else env, source)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise ConfigError(_problems(exc, model), source=source) from None


def load_file(model: type[M], path: str | os.PathLike[str], *, env: Mapping[str, str] | None) -> M:
    """A YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON (``.json``) file, validated.

    Raises:
        ConfigError: the file cannot be read or parsed, or a value is invalid.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            [{"path": "(file)", "value": str(p), "allowed": f"a readable file ({exc.strerror})"}]
        ) from None
    return validate(model, _parse(text, p), env=env, source=str(p))


def _parse(text: str, path: Path) -> Any:
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            return tomllib.loads(text)
        if suffix == ".json":
            return json.loads(text)
        if suffix in {".yaml", ".yml", ""}:
            import yaml  # noqa: PLC0415 - ~20 ms, only for YAML files and overrides

            return yaml.safe_load(text) or {}
    except Exception as exc:  # every parser has its own error type
        raise ConfigError(
            [{"path": "(file)", "value": str(path), "allowed": f"valid {suffix or 'YAML'} ({exc})"}]
        ) from None
    raise ConfigError(
        [{"path": "(file)", "value": str(path), "allowed": "a .yaml, .yml, .toml or .json file"}]
    )


def _unwrap(data: Any, source: str | None) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(
            [{"path": ROOT, "value": _short(data), "allowed": "a mapping of sections"}],
            source=source,
        )
    if ROOT in data:
        extra = sorted(set(data) - {ROOT})
        inner = data[ROOT]
        if inner is None:
            inner = {}
        if not isinstance(inner, Mapping):
            raise ConfigError(
                [{"path": ROOT, "value": _short(inner), "allowed": "a mapping of sections"}],
                source=source,
            )
        if extra:
            raise ConfigError(
                [
                    {
                        "path": extra[0],
                        "value": "...",
                        "allowed": f"only the '{ROOT}' key at top level",
                    }
                ],
                source=source,
            )
        return _deep_copy(inner)
    return _deep_copy(data)


def _deep_copy(data: Mapping[str, Any]) -> dict[str, Any]:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in data.items()}


def _apply_env(
    model: type[BaseModel], body: dict[str, Any], env: Mapping[str, str], source: str | None
) -> dict[str, Any]:
    problems: list[dict[str, Any]] = []
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var == f"{ENV_PREFIX}CONFIG":
            continue
        keys = [k.lower() for k in var[len(ENV_PREFIX) :].split("__")]
        import yaml  # noqa: PLC0415 - ~20 ms, only when an override is set

        try:
            value = yaml.safe_load(env[var]) if env[var].strip() else None
        except yaml.YAMLError:
            value = env[var]
        if not _known_path(model, keys):
            problems.append(
                {
                    "path": var,
                    "value": REDACTED if is_secret_key(var) else redact(env[var]),
                    "allowed": "an existing key: AGENTGUARD_<SECTION>__<KEY> or "
                    "AGENTGUARD_<TOP_LEVEL_KEY>",
                }
            )
            continue
        node = body
        for k in keys[:-1]:
            child = node.get(k)
            if not isinstance(child, dict):
                child = {}
                node[k] = child
            node = child
        node[keys[-1]] = value
    if problems:
        raise ConfigError(problems, source=source)
    return body


def _known_path(model: type[BaseModel], keys: list[str]) -> bool:
    current: Any = model
    for k in keys:
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            # below a model, free-form mappings (e.g. a dict field) accept any key
            return current is dict
        field = current.model_fields.get(k)
        if field is None:
            return False
        current = _model_of(field.annotation)
    return True


def _model_of(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    origin = getattr(annotation, "__origin__", None)
    if origin is dict:
        return dict
    return annotation


def _problems(exc: ValidationError, model: type[BaseModel]) -> list[dict[str, Any]]:
    problems = []
    for err in exc.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        path = ".".join([ROOT, *loc])
        key = loc[-1] if loc else ""
        value = err.get("input")
        if err["type"] == "extra_forbidden":
            allowed = f"unknown key; allowed keys here: {', '.join(_fields_at(model, loc[:-1]))}"
        else:
            allowed = _allowed_text(err["msg"])
        if is_secret_key(key):
            value = REDACTED
        elif isinstance(value, Mapping):  # a rule over a whole section: the keys say enough
            value = "{...}"
        if isinstance(value, str):
            value = redact(value)
        problems.append({"path": path, "value": _short(value), "allowed": allowed})
    return problems


def _fields_at(model: type[BaseModel], loc: list[str]) -> list[str]:
    current: Any = model
    for k in loc:
        is_model = isinstance(current, type) and issubclass(current, BaseModel)
        field = current.model_fields.get(k) if is_model else None
        if field is None:
            return []
        current = _model_of(field.annotation)
    if isinstance(current, type) and issubclass(current, BaseModel):
        return sorted(current.model_fields)
    return []


def _allowed_text(msg: str) -> str:
    # pydantic says "Input should be ..." / "Value error, ..."; keep the substance.
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            return msg[len(prefix) :]
    return msg.replace("Input should be", "must be", 1)


def _short(value: Any) -> Any:
    if isinstance(value, (dict, list)) and len(repr(value)) > 80:
        return repr(value)[:77] + "..."
    if isinstance(value, str) and len(value) > 80:
        return value[:77] + "..."
    return value
