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
import logging
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

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CHAIN",
    "ENV_PREFIX",
    "MAX_ALIAS_NODES",
    "PROVIDERS",
    "ROOT",
    "load",
    "load_file",
    "suggest",
    "validate",
]

#: Environment variables with this prefix override configuration keys.
ENV_PREFIX = "AGENTGUARD_"
#: The environment variable naming the configuration file read when none is given.
CONFIG_ENV = f"{ENV_PREFIX}CONFIG"
#: The one top-level key of a configuration file.
ROOT = "reliability"
#: ``escalation.cloud_fallback.provider``: the OpenAI-compatible endpoint of each known provider.
PROVIDERS = {
    "anthropic": "https://api.anthropic.com/v1/",
    "deepseek": "https://api.deepseek.com/v1",
    "fireworks": "https://api.fireworks.ai/inference/v1",
    "groq": "https://api.groq.com/openai/v1",
    "mistral": "https://api.mistral.ai/v1",
    "openai": "https://api.openai.com/v1",
    "openrouter": "https://openrouter.ai/api/v1",
    "together": "https://api.together.xyz/v1",
}

#: The default ``escalation.chain``, cheapest tier first.
DEFAULT_CHAIN = ("fast", "standard", "longctx", "premium")

_log = logging.getLogger("agentguard.config")

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
        body = _canonical(_unwrap(data or {}, source), source)
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


def load(
    model: type[M],
    source: M | Mapping[str, Any] | str | os.PathLike[str] | None,
    *,
    env: Mapping[str, str] | None,
) -> M:
    """Whatever a caller handed in as a configuration, as ``model``.

    ``None`` reads the file named by ``AGENTGUARD_CONFIG`` (the defaults when unset); a mapping
    or a path is validated with the ``AGENTGUARD_*`` overrides; a ``model`` instance is used as
    it is (built in code, it is final).

    Raises:
        ConfigError: the file or a value is invalid.
        TypeError: ``source`` is none of these.
    """
    if isinstance(source, model):
        return source
    environ = os.environ if env is None else env
    if source is None:
        path = environ.get(CONFIG_ENV)
        return (
            load_file(model, path, env=environ)
            if path
            else validate(model, None, env=environ, source=None)
        )
    if isinstance(source, Mapping):
        return validate(model, source, env=environ, source=None)
    if isinstance(source, (str, os.PathLike)):
        return load_file(model, source, env=environ)
    raise TypeError(
        f"a configuration must be a {model.__name__}, a dict or a file path "
        f"(str or os.PathLike), not {type(source).__name__}"
    )


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


# -- the seed's own names ---------------------------------------------------------------------
# The ``reliability:`` block users already have (see docs/configuration.md, "Names from the
# reliability block you already have") says a few things under other names or in other units.
# They are accepted here, translated once to the canonical keys, so everything downstream (the
# models, `config show`, the guard) sees one vocabulary.

#: Section by section (``()``: top level), another name of a key and its canonical name.
_RENAMES: dict[tuple[str, ...], dict[str, str]] = {
    (): {"memory_monitor": "memory_pressure"},
    ("token_budget",): {"per_request_output": "max_output_tokens", "on_exceed": "policy"},
}
#: Inside ``memory_monitor``, where thresholds are fractions of 1 (``memory_pressure``: percent).
_MONITOR_RENAMES = {
    "warning_threshold": "percent_warning",
    "critical_threshold": "percent_critical",
}
_PERCENT_KEYS = frozenset(
    {"psi_some_warning", "psi_some_critical", "psi_full_critical", *_MONITOR_RENAMES.values()}
)
_FALLBACK_KEYS = ("provider", "model", "base_url", "api_key_env", "timeout")
#: The other names each (canonical) section accepts, for "did you mean".
_OTHER_NAMES: dict[tuple[str, ...], list[str]] = {
    **{where: list(names) for where, names in _RENAMES.items()},
    ("memory_pressure",): list(_MONITOR_RENAMES),
    ("escalation",): ["cloud_fallback"],
}


def suggest(key: str, choices: list[str]) -> str | None:
    """The choice ``key`` was most likely meant to be (a typo, a missing ``_``), or ``None``."""
    from rapidfuzz import fuzz, process  # noqa: PLC0415 - only for a config that has an error

    squashed = {c.replace("_", ""): c for c in choices}
    if key.replace("_", "") in squashed:  # windowsize -> window_size
        return squashed[key.replace("_", "")]
    found = process.extractOne(key, choices, scorer=fuzz.ratio, score_cutoff=75)
    return None if found is None else str(found[0])


def _canonical(body: dict[str, Any], source: str | None) -> dict[str, Any]:
    """``body`` with every other name renamed to the canonical one, in the canonical units."""
    problems: list[dict[str, Any]] = []

    def rename(node: Any, where: tuple[str, ...], names: Mapping[str, str]) -> None:
        if not isinstance(node, dict):
            return  # not a mapping: the models report it
        for old, new in names.items():
            if old not in node:
                continue
            if new in node:
                path = ".".join([ROOT, *where, old])
                allowed = f"'{old}' is '{new}': give one of them"
                problems.append({"path": path, "value": "...", "allowed": allowed})
                continue
            node[new] = node.pop(old)

    monitor = body.get("memory_monitor")
    if not isinstance(monitor, dict):
        monitor = {}  # absent, or not a mapping (the models report that)
    rename(monitor, ("memory_monitor",), _MONITOR_RENAMES)
    for key in _PERCENT_KEYS & monitor.keys():
        value = monitor[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            problems.append(
                {
                    "path": f"{ROOT}.memory_monitor.{key}",
                    "value": _shown(value),
                    "allowed": "a fraction between 0 and 1 (memory_monitor takes fractions, "
                    "memory_pressure percent)",
                }
            )
        else:
            monitor[key] = round(value * 100, 9)
    rename(body, (), _RENAMES[()])
    rename(body.get("token_budget"), ("token_budget",), _RENAMES[("token_budget",)])
    escalation = body.get("escalation")
    if isinstance(escalation, dict) and "cloud_fallback" in escalation:
        problems += _cloud_fallback(body, escalation)
    if problems:
        raise ConfigError(problems, source=source)
    return body


def _cloud_fallback(body: dict[str, Any], escalation: dict[str, Any]) -> list[dict[str, Any]]:
    """``escalation.cloud_fallback`` as the tier its chain ends with (``premium`` by default)."""
    path = f"{ROOT}.escalation.cloud_fallback"
    fallback = escalation.pop("cloud_fallback")
    if not isinstance(fallback, Mapping):
        return [{"path": path, "value": _shown(fallback), "allowed": "a mapping"}]
    problems = []
    for key in sorted(set(fallback) - set(_FALLBACK_KEYS)):
        near = suggest(str(key), list(_FALLBACK_KEYS))
        hint = f"did you mean {near!r}? " if near else ""
        allowed = f"unknown key; {hint}allowed keys here: {', '.join(sorted(_FALLBACK_KEYS))}"
        problems.append({"path": f"{path}.{key}", "value": "...", "allowed": allowed})
    tier = {k: fallback[k] for k in _FALLBACK_KEYS if k in fallback and k != "provider"}
    provider = fallback.get("provider")
    if provider is not None and "base_url" not in tier:
        url = PROVIDERS.get(str(provider).lower())
        if url is None:
            near = suggest(str(provider).lower(), list(PROVIDERS))
            hint = f"did you mean {near!r}? " if near else ""
            problems.append(
                {
                    "path": f"{path}.provider",
                    "value": _shown(provider),
                    "allowed": f"{hint}one of {', '.join(sorted(PROVIDERS))}, or give base_url",
                }
            )
        tier["base_url"] = url
    chain = escalation.get("chain")
    if isinstance(chain, list) and chain and isinstance(chain[-1], str):
        name = chain[-1]
    else:
        name = DEFAULT_CHAIN[-1]
    tiers = body.setdefault("tiers", {})
    if not isinstance(tiers, dict):
        return problems  # the model reports a bad tiers value
    if name in tiers:
        problems.append(
            {
                "path": path,
                "value": "{...}",
                "allowed": f"tier {name!r} (the last of the chain) is already defined in tiers: "
                "give it once",
            }
        )
    else:
        tiers[name] = tier
    return problems


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
        if keys[0] not in model.model_fields:
            # Not a configuration path at all (a user's own AGENTGUARD_WRAP=1 switch): never
            # fatal. Its value is not logged: it may be a secret.
            near = suggest(keys[0], list(model.model_fields))
            hint = f" (did you mean {ENV_PREFIX}{near.upper()}?)" if near else ""
            _log.warning("%s is not a configuration key; ignored%s", var, hint)
            continue
        if not _known_path(model, keys):
            allowed = "an existing key: AGENTGUARD_<SECTION>__<KEY> or AGENTGUARD_<TOP_LEVEL_KEY>"
            near = suggest(keys[-1], _fields_at(model, keys[:-1]))
            if near:
                name = f"{ENV_PREFIX}{'__'.join([*keys[:-1], near]).upper()}"
                allowed = f"did you mean {name}? {allowed}"
            problems.append(
                {
                    "path": var,
                    "value": REDACTED if is_secret_key(var) else _shown(env[var]),
                    "allowed": allowed,
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
            fields = _fields_at(model, loc[:-1])
            near = suggest(key, [*fields, *_OTHER_NAMES.get(tuple(loc[:-1]), [])])
            allowed = f"unknown key; did you mean {near!r}? " if near else "unknown key; "
            allowed += f"allowed keys here: {', '.join(fields)}"
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
