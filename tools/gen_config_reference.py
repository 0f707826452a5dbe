"""Regenerate the settings reference in docs/configuration.md from the config models.

Usage: ``python tools/gen_config_reference.py`` (``--check`` exits 1 when the docs are stale).
The reference sits between two ``<!-- config-reference -->`` markers; the rest of the page is
hand-written.
"""

from __future__ import annotations

import collections.abc
import sys
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from pydantic import BaseModel  # noqa: E402

from agentguard.config import GuardConfig  # noqa: E402

MARKER = "<!-- config-reference -->"
PAGE = ROOT / "docs" / "configuration.md"


def _type_name(annotation: Any) -> str:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return " / ".join(f"`{a}`" for a in args)
    if typing.get_origin(annotation) is collections.abc.Callable:
        return "callable"
    if typing.get_origin(annotation) is list:
        return f"list of {_type_name(args[0])}"
    if args:
        return " or ".join(_type_name(a) for a in args)
    if annotation is type(None):
        return "null"
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _default(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "(section)"
    if isinstance(value, list):
        return "`[" + ", ".join(str(v) for v in value) + "]`"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value!r}`" if isinstance(value, str) else f"`{value}`"


def reference() -> str:
    """The generated Markdown reference of every section and key."""
    lines: list[str] = []
    top = [(n, f) for n, f in GuardConfig.model_fields.items() if _section_of(f.annotation) is None]
    lines += ["### Top level", "", "| key | type | default | meaning |", "|---|---|---|---|"]
    for name, field in top:
        lines.append(
            f"| `{name}` | {_type_name(field.annotation)} | {_default(field.default)} "
            f"| {field.description or ''} |"
        )
    lines.append("")
    for name, field in GuardConfig.model_fields.items():
        model = _section_of(field.annotation)
        if model is None:
            continue
        is_map = typing.get_origin(field.annotation) is dict
        title = f"{name}.<name>" if is_map else name
        doc = (field.description if is_map else None) or _first_line(model)
        _section(lines, title, doc, model)
    return "\n".join(lines)


def _first_line(model: type[BaseModel]) -> str:
    return (model.__doc__ or "").strip().splitlines()[0]


def _section(lines: list[str], title: str, doc: str, model: type[BaseModel]) -> None:
    """One section's table, then its nested sections (``tools.breaker`` ...)."""
    lines += [f"### `{title}`", "", doc, ""]
    lines += ["| key | type | default | meaning |", "|---|---|---|---|"]
    nested = []
    for key, sub in model.model_fields.items():
        default = (
            "required"
            if sub.is_required()
            else _default(sub.get_default(call_default_factory=True))
        )
        inner = sub.annotation if typing.get_origin(sub.annotation) is not dict else None
        inner = _section_of(inner)
        meaning = _describe(key, sub.description)
        if inner is not None:
            nested.append((key, inner))
            meaning = f"{meaning} See `{title}.{key}` below."
        lines.append(f"| `{key}` | {_type_name(sub.annotation)} | {default} | {meaning} |")
    lines.append("")
    for key, inner in nested:
        _section(lines, f"{title}.{key}", _first_line(inner), inner)


def _section_of(annotation: Any) -> type[BaseModel] | None:
    """The section model behind a field: a model, or the values of a dict of models."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) is dict:
        value = typing.get_args(annotation)[1]
        if isinstance(value, type) and issubclass(value, BaseModel):
            return value
    return None


def _describe(key: str, description: str | None) -> str:
    if key == "enabled" and not description:
        return "Switch this component on or off."
    return (description or "").replace("|", "/")


def render(page: str) -> str:
    """``page`` with the text between the markers replaced by the generated reference."""
    head, _, rest = page.partition(MARKER)
    _, _, tail = rest.partition(MARKER)
    return f"{head}{MARKER}\n{reference()}\n{MARKER}{tail}"


def main() -> int:
    page = PAGE.read_text(encoding="utf-8")
    new = render(page)
    if "--check" in sys.argv:
        return 0 if new == page else 1
    PAGE.write_text(new, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
