"""The configuration reference and the transports' table, generated from the code that the checks read.

Every row comes from a schema dataclass (`launcher.schema` and the config dataclasses it registers) or a
transport's descriptor: a field's type, the range it declares (`transports.kernel.options.bounded`,
`one_of`), its default, and its meaning (the comment on the field's line, or the class
docstring's ``Attributes:`` entry). The documentation site renders these (``docs/hooks.py``);
``python -m launcher.reference`` prints the configuration reference.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import sys
import tokenize
import typing
from functools import lru_cache
from typing import Any, Iterator, Union

from transports.kernel import options as field_options

MISSING_TEXT = "(required)"


# ---------------------------------------------------------------------------------------------- reading a dataclass
@lru_cache(maxsize=None)
def _comments(cls: type) -> dict[str, str]:
    """``field -> the comment on its line`` in the class's source (empty where it has none)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found, line_of = {}, {}
    for i, line in enumerate(source.splitlines(), 1):
        match = re.match(r"\s+(\w+)\s*:", line)
        if match:
            line_of[i] = match.group(1)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in line_of:
            found.setdefault(line_of[tok.start[0]], tok.string.lstrip("#").strip())
    return found


@lru_cache(maxsize=None)
def _attributes(cls: type) -> dict[str, str]:
    """``field -> its entry`` in the ``Attributes:`` section of the class docstring (and its bases')."""
    out: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        doc = inspect.cleandoc(klass.__dict__.get("__doc__") or "")
        section = re.split(r"^Attributes:\s*$", doc, maxsplit=1, flags=re.M)
        if len(section) < 2:
            continue
        name, lines = None, []
        for line in section[1].splitlines():
            entry = re.match(r"^    (\w+):\s*(.*)$", line)
            if entry:
                if name:
                    out[name] = " ".join(lines)
                name, lines = entry.group(1), [entry.group(2)]
            elif name and line.startswith("        "):
                lines.append(line.strip())
            elif line.strip() and not line.startswith(" "):
                break
        if name:
            out[name] = " ".join(lines)
    return out


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union:
        inner = [a for a in args if a is not type(None)]
        text = " or ".join(_type_name(a) for a in inner)
        return f"{text} or null" if len(inner) < len(args) else text
    if origin in (dict, typing.Dict):
        return "mapping"
    if origin in (list, typing.List, tuple):
        return "list"
    if hint is Any:
        return "any"
    return getattr(hint, "__name__", str(hint))


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
        value = f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(value):
            return "see below"
    else:
        return MISSING_TEXT
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return value if value else '""'
    return repr(value) if isinstance(value, (dict, list)) else f"{value:,}" if isinstance(value, int) else str(value)


@dataclasses.dataclass(frozen=True)
class Row:
    """One field of a config node."""

    path: str
    type: str
    default: str
    allowed: str
    meaning: str


def rows(cls: type, path: str, *, nested: bool = True, skip: tuple[str, ...] = ()) -> Iterator[Row]:
    """Every field of dataclass ``cls`` at config path ``path`` (but ``skip``), nested dataclasses after their parent's
    fields (``nested=False``: left out)."""
    hints = typing.get_type_hints(cls)
    inner = []
    attributes = _attributes(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        hint = hints.get(f.name, Any)
        full = f"{path}.{f.name}" if path else f.name
        if dataclasses.is_dataclass(hint):
            inner.append((hint, full))
            continue
        owner = next(k for k in cls.__mro__ if f.name in k.__dict__.get("__annotations__", {}))  # where it is declared
        meaning = _comments(owner).get(f.name) or attributes.get(f.name, "")
        yield Row(full, _type_name(hint), _default(f), field_options.allowed(f) or "", meaning)
        optional = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) is Union else []
        if len(optional) == 1 and dataclasses.is_dataclass(optional[0]):  # an optional node: its fields when set
            inner.append((optional[0], full))
    for kind, full in inner if nested else ():
        yield from rows(kind, full)


def table(cls: type, path: str, heading: str | None = None, **which: Any) -> str:
    """The fields of ``cls`` as a Markdown table (``which``: `rows`' ``nested`` and ``skip``)."""
    lines = [f"{heading}\n" if heading else "", "| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for row in rows(cls, path, **which):
        lines.append(f"| `{row.path}` | {row.type} | `{row.default}` | {row.allowed or '-'} | "
                     f"{_escape(row.meaning) or '-'} |")
    return "\n".join(line for line in lines if line != "")


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


# ---------------------------------------------------------------------------------------------- the reference
def configuration() -> str:
    """Every YAML key of ``python -m launcher``, node by node, as Markdown."""
    from components import compat
    from components.hosts.settings import settings_classes

    from . import schema

    parts = ["## Top level", table(schema.Config, "", nested=False,
                                   skip=("service", "transport", "env", "logger", "recipe"))]
    parts.append("## Components (`components.<name>`)")
    parts.append("Each component's node is its config dataclass, the one its owner is built from. A recipe states what "
                 "it needs of some fields (both recipes: the collector's `frames_per_batch`, `total_frames` and "
                 "`num_envs`; PPO: the replay buffer's `capacity`, `sampler` and `batch_size`; DQN: those and `alpha`, "
                 "`beta`, `max_policy_lag`); another value set here is a configuration error.")
    for name in compat.COMPONENTS:
        cls = compat.declaration(name).config
        parts.append(table(cls, f"components.{name}", f"### `components.{name}` ({cls.__name__})"))
    parts.append("## Placement settings")
    for name, cls in (*settings_classes().items(), ("launcher", schema.LauncherConf)):
        parts.append(table(cls, name, f"### `{name}`"))
    parts.append("## Groups")
    for group, options in schema.SCHEMAS.items():
        for option, cls in options.items():
            label = option.removeprefix("base_")
            parts.append(table(cls, group, f"### `{group}={label}` ({cls.__name__})"))
    return "\n\n".join(parts) + "\n"


def transports_table() -> str:
    """Every registered transport: what it is, how far its clients reach, whether it needs fixed layouts, its wire
    and its options."""
    from transports import registry

    lines = ["| transport | what it is | clients reach | fixed layouts | wire option | options |",
             "|---|---|---|---|---|---|"]
    for d in registry.descriptors():
        opts = ", ".join(f"`{name}`" for name in d.option_names) or "-"
        lines.append(f"| [`{d.kind}`](transports/{d.kind}.md) | {d.summary} | {d.reach.words} | "
                     f"{'yes' if d.fixed_layout else 'no'} | {f'`{d.wire}`' if d.wire else '-'} | {opts} |")
    return "\n".join(lines)


def transport(kind: str) -> str:
    """One transport's descriptor and options as Markdown."""
    from transports import registry

    d = registry.describe(kind)
    head = (f"| kind | clients reach | fixed layouts | wire option | aliases | class |\n|---|---|---|---|---|---|\n"
            f"| `{d.kind}` | {d.reach.words} | {'yes' if d.fixed_layout else 'no'} | "
            f"{f'`{d.wire}`' if d.wire else '-'} | {', '.join(f'`{a}`' for a in d.aliases) or '-'} | "
            f"`{d.implementation.replace(':', '.')}` |")
    if not d.option_names:
        return head + "\n\nIt takes no options."
    return head + "\n\n" + table(d.options, "transport_options", "Options (`components.<name>.transport_options`, "
                                                                  "or `transport.options` for the plan-wide default):")


def main() -> None:
    sys.stdout.write(configuration())


if __name__ == "__main__":
    main()
