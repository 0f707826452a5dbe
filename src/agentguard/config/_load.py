"""Loading a configuration: files, the ``reliability:`` wrapper, ``AGENTGUARD_*`` overrides.

Everything here works on any pydantic model class handed in (``GuardConfig`` in practice), so
the models beside it import this module and not the other way round. Every failure becomes a
:class:`~agentguard.ConfigError` naming the key path, the value and what is allowed.

Errors never leak and never explode: a value is shown redacted (by the configured secrets'
values and by pattern) and bounded (a few items, a few levels, 80 characters), never by
``repr()`` of the whole; a file that does not parse is named with the line and column, never
with the offending line (it may hold a key); YAML aliases may expand to at most
:data:`MAX_ALIAS_NODES` nodes (a 615-byte "billion laughs" would otherwise cost gigabytes).
"""

from __future__ import annotations

import functools
import itertools
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

__all__ = ["ENV_PREFIX", "MAX_ALIAS_NODES", "ROOT", "load_file", "validate"]

#: Environment variables with this prefix override configuration keys.
ENV_PREFIX = "AGENTGUARD_"
#: The one top-level key of a configuration file.
ROOT = "reliability"
#: How many nodes YAML aliases may add by expansion, all aliases of a document together (a
#: real configuration's anchors add a few dozen; a "billion laughs" adds billions).
MAX_ALIAS_NODES = 10_000
#: A validator's error type that means "this value is a secret": its value is never shown.
SECRET_VALUE = "secret_value"

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
    try:
        body = _unwrap(data or {}, source)
        body = _apply_env(model, body, os.environ if env is None else env, source)
        return model.model_validate(body)
    except ValidationError as exc:
        raise ConfigError(_problems(exc, model), source=source) from None
    except RecursionError:  # mappings nested thousands deep, or a mapping that holds itself
        problem = {"path": ROOT, "value": "{...}", "allowed": "mappings nested a few levels deep"}
        raise ConfigError([problem], source=source) from None


def load_file(model: type[M], path: str | os.PathLike[str], *, env: Mapping[str, str] | None) -> M:
    """A YAML (``.yaml``/``.yml``), TOML (``.toml``) or JSON (``.json``) file, validated.

    Raises:
        ConfigError: the file cannot be read or parsed, or a value is invalid.
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise ConfigError(
            [{"path": "(file)", "value": str(p), "allowed": f"a readable file ({exc.strerror})"}]
        ) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        allowed = f"UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line} is not UTF-8)"
        raise ConfigError([{"path": "(file)", "value": str(p), "allowed": allowed}]) from None
    return validate(model, _parse(text, p), env=env, source=str(p))


def _parse(text: str, path: Path) -> Any:
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            return tomllib.loads(text)
        if suffix == ".json":
            return json.loads(text)
        if suffix in {".yaml", ".yml", ""}:
            return load_yaml(text) or {}
    except Exception as exc:  # every parser has its own error type
        allowed = f"valid {suffix or 'YAML'} ({_syntax_error(exc)})"
        raise ConfigError([{"path": "(file)", "value": str(path), "allowed": allowed}]) from None
    raise ConfigError(
        [{"path": "(file)", "value": str(path), "allowed": "a .yaml, .yml, .toml or .json file"}]
    )


def load_yaml(text: str) -> Any:
    """YAML text as data, safely: no Python tags, and aliases expanding to at most
    :data:`MAX_ALIAS_NODES` nodes (a YAML error past that).
    """
    import yaml  # noqa: PLC0415 - ~20 ms, only for YAML files and overrides

    return yaml.load(text, Loader=_bounded_loader())  # a SafeLoader subclass: no Python tags


@functools.cache
def _bounded_loader() -> type[Any]:
    """A ``yaml.SafeLoader`` that counts what aliases expand to while it composes.

    Composing shares an anchored node among its aliases, so the document costs memory linear
    in its size; what explodes is every consumer that walks it as a tree (validation, copies,
    a message showing it). Each node's expanded size is known when it is composed, so each
    alias adds its target's size to a running total, checked before going on.
    """
    import yaml  # noqa: PLC0415

    class BoundedLoader(yaml.SafeLoader):
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.expanded = 0
            self.sizes: dict[int, int] = {}  # id(collection node) -> nodes once expanded

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()  # type: ignore[no-untyped-call]
                target = self.anchors.get(event.anchor)
                if target is not None:
                    self.expanded += self.sizes.get(id(target), 1)
                    if self.expanded > MAX_ALIAS_NODES:
                        raise yaml.MarkedYAMLError(
                            problem=f"aliases expand to more than {MAX_ALIAS_NODES} nodes",
                            problem_mark=event.start_mark,
                        )
                return super().compose_node(parent, index)
            node = super().compose_node(parent, index)
            if isinstance(node, yaml.SequenceNode):
                self.sizes[id(node)] = 1 + sum(self.sizes.get(id(n), 1) for n in node.value)
            elif isinstance(node, yaml.MappingNode):
                self.sizes[id(node)] = 1 + sum(
                    self.sizes.get(id(k), 1) + self.sizes.get(id(v), 1) for k, v in node.value
                )
            return node

    return BoundedLoader


def _syntax_error(exc: BaseException) -> str:
    """What a parser said, and where: never the offending line, which may hold a secret."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None)
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if isinstance(exc, RecursionError):
        problem = "nested too deeply"
    elif problem is None:
        # JSON and TOML say where in their message and never quote the line; PyYAML's reader
        # errors name the character and its position
        problem = str(exc).replace("\n", " ")
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{_clip(redact(str(problem)), 120)}{where}"


def _unwrap(data: Any, source: str | None) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise ConfigError(
            [{"path": ROOT, "value": _shown(data), "allowed": "a mapping of sections"}],
            source=source,
        )
    if ROOT in data:
        extra = sorted(set(data) - {ROOT})
        inner = data[ROOT]
        if inner is None:
            inner = {}
        if not isinstance(inner, Mapping):
            raise ConfigError(
                [{"path": ROOT, "value": _shown(inner), "allowed": "a mapping of sections"}],
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
        try:
            value = load_yaml(env[var]) if env[var].strip() else None
        except Exception:  # not YAML (or not sane YAML): the plain string
            value = env[var]
        if not _known_path(model, keys):
            problems.append(
                {
                    "path": var,
                    "value": REDACTED if is_secret_key(var) else _shown(env[var]),
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
        if err["type"] == SECRET_VALUE or is_secret_key(key):
            value = REDACTED
        elif isinstance(value, Mapping):  # a rule over a whole section: the keys say enough
            value = "{...}"
        problems.append({"path": path, "value": _shown(value), "allowed": allowed})
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


class _Shown(str):
    """A value rendered for a message: shown as it is by ``repr()`` (no quotes around it)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str(self)


#: A shown value: at most this many characters, items per collection, levels of collections.
_SHOWN_CHARS, _SHOWN_ITEMS, _SHOWN_LEVELS = 80, 4, 2


def _shown(value: Any) -> Any:
    """``value`` as an error shows it: redacted and bounded, whatever its size or shape.

    Scalars stay themselves (strings redacted and clipped); a collection becomes its first
    items, a few levels deep: never a ``repr()`` of the whole, which for a YAML alias bomb or
    a cyclic structure is unbounded.
    """
    if value is None or isinstance(value, (bool, float)):
        return value
    if isinstance(value, int):
        return value if value.bit_length() <= 64 else _Shown(f"<{value.bit_length()}-bit integer>")
    if isinstance(value, str):
        return _clip(redact(value), _SHOWN_CHARS)
    return _Shown(_clip(_render(value, _SHOWN_LEVELS), _SHOWN_CHARS))


def _render(value: Any, levels: int) -> str:
    if isinstance(value, Mapping):
        if not value or levels <= 0:
            return "{...}" if value else "{}"
        items = [
            f"{_render(k, 0)}: {_render(v, levels - 1)}"
            for k, v in itertools.islice(value.items(), _SHOWN_ITEMS)
        ]
        more = ", ..." if len(value) > _SHOWN_ITEMS else ""
        return "{" + ", ".join(items) + more + "}"
    if isinstance(value, (list, tuple, set, frozenset)):
        if not value or levels <= 0:
            return "[...]" if value else "[]"
        items = [_render(v, levels - 1) for v in itertools.islice(value, _SHOWN_ITEMS)]
        more = ", ..." if len(value) > _SHOWN_ITEMS else ""
        return "[" + ", ".join(items) + more + "]"
    if isinstance(value, str):
        return repr(_clip(redact(value), 40))
    if value is None or isinstance(value, (bool, int, float)):
        return repr(_shown(value))
    return f"<{type(value).__name__}>"  # a date, bytes ...: the kind says enough


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
