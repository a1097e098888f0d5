"""The configuration reference, the config groups, the recipe x env settings and the transports' table, generated
from the code and the YAML files that the checks read.

Every row of the configuration reference comes from a schema dataclass (`launcher.schema` and the config dataclasses
it registers) or a transport's descriptor: a field's type, the range it declares (`transports.kernel.options.bounded`,
`one_of`), its default, and its meaning (the comment on the field's line, or the class docstring's ``Attributes:``
entry). The groups table comes from the files under ``conf/`` (each option's leading comment, its ``defaults:`` list
and the keys it sets), the recipe x env table from ``conf/recipe_env/``. The documentation site renders these
(``docs/hooks.py``); ``python -m launcher.reference`` prints the configuration reference.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import os
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
    """``text`` for a Markdown table cell: ``|`` escaped, and names that begin or end with an underscore outside code
    spans (``_target_``, ``__init__``) put in one, so that Markdown does not read their underscores as emphasis, and
    ``<`` outside code spans written as an entity (``<run dir>`` is text, not an HTML tag)."""
    parts = re.split(r"(`[^`]*`)", text.replace("|", "\\|"))
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;")  # <run dir> is text, not a tag
        parts[i] = re.sub(r"(?<![\w`\\])(_\w*_|_\w+|\w+_)(?![\w`])", r"`\1`", parts[i])
    return "".join(parts)


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
                 "it needs of some fields (every recipe: the collector's `frames_per_batch`, `total_frames` and "
                 "`num_envs`; IMPALA and APPO: its `sync` and `prefetch`; PPO: the replay buffer's `capacity`, "
                 "`sampler` and `batch_size`; DQN: those and `alpha`, `beta`, `max_policy_lag`, `frames`); another "
                 "value set here is a configuration error.")
    for name in compat.COMPONENTS:
        cls = compat.declaration(name).config
        parts.append(table(cls, f"components.{name}", f"### `components.{name}` ({cls.__name__})"))
    parts.append("## Placement settings")
    for name, cls in (*settings_classes().items(), ("launcher", schema.LauncherConf)):
        parts.append(table(cls, name, f"### `{name}`"))
    parts.append("## Group options")
    files = config_groups()
    for group, options in schema.SCHEMAS.items():
        for cls in dict.fromkeys(options.values()):  # each schema once, with the options of conf/ it types
            bases = {name for name, c in options.items() if c is cls}
            typed = [f"`{group}={o.name}`" for o in files.get(group, ()) if bases & set(o.extends)]
            parts.append(table(cls, group, f"### {cls.__name__} (`{group}`)\n\nTypes " +
                               (", ".join(typed) if typed else "no option of `conf/`") + "."))
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------------------------- config groups
CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")


@dataclasses.dataclass(frozen=True)
class Option:
    """One option of a config group: a file under ``conf/``, or one that a plugin or Hydra provides.

    Attributes:
        group: the group, as an override names it (``service``, ``hydra/launcher``).
        name: the option (``direct``, ``slurm``).
        description: the first sentence of the file's leading comment (empty where it has none).
        extends: the entries of its ``defaults:`` list other than ``_self_`` (the schema or option it builds on).
        sets: every key the file sets (besides ``defaults``), dotted, with its value.
        provider: ``conf`` (a file under ``conf/``), ``plugin`` (an option a ``conf/`` file extends that no file
            under ``conf/`` is: a Hydra plugin's) or ``hydra`` (Hydra's own default of the group).
        package: the node the option writes (``# @package`` where the file has one, else the group's path).
    """

    group: str
    name: str
    description: str = ""
    extends: tuple = ()
    sets: tuple = ()
    provider: str = "conf"
    package: str = ""


def _leading_comment(text: str) -> tuple[str, str]:
    """The ``# @package`` of a YAML file ("" without one) and its one-line description: the first sentence of the first
    line of its leading comment, without a ``group=option:`` prefix or a trailing "e.g." (which an example follows)."""
    package, first = "", ""
    for line in text.splitlines():
        body = line[1:].strip() if line.startswith("#") else None
        if body and body.startswith("@package"):
            package = body.split(None, 1)[1]
            continue
        first = body or ""
        break
    first = re.sub(r"^[\w/]+=\w+:\s*", "", first)
    first = re.sub(r",?\s+e\.g\.$", ".", first)
    sentence = re.match(r"(.+?[.!?])(?=\s+[A-Z(`]|$)", first)
    first = sentence.group(1) if sentence else first
    return package, first[:1].upper() + first[1:]


def _flatten(node: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(node, dict) and (node or not prefix):
        for key, value in node.items():
            yield from _flatten(value, f"{prefix}.{key}" if prefix else str(key))
    else:
        yield prefix, node


def _value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (dict, list)):
        return re.sub(r"'", "", str(value)) if value else ("{}" if isinstance(value, dict) else "[]")
    return str(value)


@lru_cache(maxsize=None)
def config_groups() -> dict[str, tuple[Option, ...]]:
    """Every config group under ``conf/`` and its options: the files of each folder that holds YAML files (walked,
    so ``hydra/launcher`` is one), the options those files extend that no file is (a plugin's: ``submitit_slurm``,
    ``optuna``), and for Hydra's own groups Hydra's default (``basic``). Groups in the order the primary config's
    ``defaults:`` list names them, then the others by name."""
    import yaml

    found: dict[str, list[Option]] = {}
    for parent, dirs, files in os.walk(CONF):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        group = os.path.relpath(parent, CONF).replace(os.sep, "/")
        for file in sorted(f for f in files if f.endswith(".yaml")):
            if group == ".":
                continue  # the primary config
            text = open(os.path.join(parent, file)).read()
            package, description = _leading_comment(text)
            data = yaml.safe_load(text) or {}
            extends = tuple(str(d) for d in data.pop("defaults", []) if d != "_self_")
            found.setdefault(group, []).append(Option(group, file[:-len(".yaml")], description, extends,
                                                      tuple(_flatten(data)), "conf",
                                                      package or group.replace("/", ".")))
    for group, options in found.items():
        names = {o.name for o in options}
        parents = sorted({e for o in options for e in o.extends if not e.startswith("base_") and e not in names})
        options.extend(Option(group, name, provider="plugin", package=group.replace("/", ".")) for name in parents)
        hydra_default = _hydra_defaults().get(group)
        if hydra_default and hydra_default not in names:
            options.append(Option(group, hydra_default, provider="hydra",
                                  package=group.replace("/", ".")))
    order = list(_primary_defaults())
    return {g: tuple(found[g]) for g in sorted(found, key=lambda g: (order.index(g) if g in order else len(order), g))}


@lru_cache(maxsize=None)
def _primary_defaults() -> dict[str, str]:
    """``group -> default`` from the ``defaults:`` list of ``conf/config.yaml`` (``null``: none; an ``optional``
    entry keeps its interpolation)."""
    import yaml

    out = {}
    for entry in yaml.safe_load(open(os.path.join(CONF, "config.yaml")))["defaults"]:
        if isinstance(entry, dict):
            (key, value), = entry.items()
            out[key.removeprefix("optional ")] = value
    return out


def _hydra_defaults() -> dict[str, str]:
    """Hydra's own default option of each of its groups (``hydra/launcher -> basic``)."""
    from hydra.conf import HydraConf

    defaults = next(f for f in dataclasses.fields(HydraConf) if f.name == "defaults").default_factory()
    return {f"hydra/{k}": v for entry in defaults for k, v in entry.items() if v is not None}


def group_options() -> dict[str, set[str]]:
    """``group -> every option it offers`` (the files under ``conf/``, the plugins' options they extend, Hydra's
    default): what a page may offer as ``group=option``."""
    return {group: {o.name for o in options} for group, options in config_groups().items()}


def _default_text(group: str) -> str:
    default = {**_hydra_defaults(), **_primary_defaults()}.get(group, "")
    if group in _primary_defaults() and default is None:
        return f"none: choose one (`+{group}=NAME`)"
    if default and "${" in default:
        return f"`{default}` where such a file exists"
    if group in _hydra_defaults() and group not in _primary_defaults():
        return f"`{default}` (Hydra's own)"
    return f"`{default}`" if default else "-"


def _schemas(group: str, options: tuple[Option, ...]) -> str:
    from . import schema

    registered = schema.SCHEMAS.get(group, {})
    names = sorted({registered[e].__name__ for o in options for e in o.extends if e in registered})
    return ", ".join(f"`{n}`" for n in names)


def groups() -> str:
    """Every config group under ``conf/`` as Markdown: a table of the groups (default, options, the dataclass that
    types them), then one table per group of its options (what each is, from the file's leading comment, and the keys
    it sets), but ``recipe_env``'s, which `recipe_envs` shows (on the configuration page, which links to it)."""
    table_ = ["| group | default | options | typed by |", "|---|---|---|---|"]
    parts = []
    for group, options in config_groups().items():
        listed = ", ".join(f"`{o.name}`" + {"conf": "", "plugin": " (a plugin's)", "hydra": " (Hydra's)"}[o.provider]
                           for o in options)
        table_.append(f"| `{group}` | {_default_text(group)} | {listed} | {_schemas(group, options) or '-'} |")
        if group == "recipe_env":  # one file per recipe and env: the recipe x env table shows them
            parts.append(f"### `{group}`\n\nOne option per recipe and env, chosen by them: the "
                         "[recipe x env table](#recipe-x-env-settings) shows each and what it changes.")
            continue
        lines = [f"### `{group}`", "", "| option | what it is | sets |", "|---|---|---|"]
        for o in options:
            users = ", ".join(f"`{u.name}`" for u in options if o.name in u.extends)
            what = _escape(o.description) or {"plugin": f"A Hydra plugin's option, which {users} extends.",
                                              "hydra": "Hydra's own default."}.get(o.provider, "-")
            parents = [e for e in o.extends if not e.startswith("base_")]
            what += "".join(f" Extends `{e}`." for e in parents)
            sets = ", ".join(f"`{key}={_value(value)}`" for key, value in o.sets) or "-"
            lines.append(f"| `{o.name}` | {what} | {_escape(sets)} |")
        parts.append("\n".join(lines))
    return "\n".join(table_) + "\n\n" + "\n\n".join(parts) + "\n"


def recipe_envs() -> str:
    """Every file of ``conf/recipe_env/`` as a Markdown table: the recipe and the env it applies to (the file is
    ``<recipe>_<env>.yaml``, chosen when ``+recipe=<recipe> env=<env>``), what it is (its leading comment's first
    sentence) and each setting it changes, with the recipe's own value beside it."""
    groups_ = config_groups()
    recipes = {o.name: o for o in groups_.get("recipe", ())}
    envs = {o.name for o in groups_.get("env", ())}
    lines = ["| recipe | env | what it is | settings (the recipe's own value) |", "|---|---|---|---|"]
    for o in groups_.get("recipe_env", ()):
        pair = next(((r, o.name[len(r) + 1:]) for r in sorted(recipes, key=len, reverse=True)
                     if o.name.startswith(r + "_") and o.name[len(r) + 1:] in envs), None)
        if pair is None:
            raise ValueError(f"conf/recipe_env/{o.name}.yaml names no recipe and env of conf/ (<recipe>_<env>.yaml)")
        recipe, env = pair
        own = _recipe_values(recipes[recipe])
        settings = ", ".join(f"`{key}={_value(value)}`" + (f" ({_value(own[key])})" if key in own else "")
                             for key, value in o.sets)
        what = re.sub(r"^.*?\(env=[^)]*\)[:,]\s*", "", o.description)  # the columns name the recipe and env
        lines.append(f"| `{recipe}` | `{env}` | {_escape(what[:1].upper() + what[1:]) or '-'} | "
                     f"{_escape(settings) or '-'} |")
    return "\n".join(lines) + "\n"


def _recipe_values(option: Option) -> dict[str, Any]:
    """A recipe option's values: its schema dataclass's defaults, then the keys its file sets."""
    from . import schema

    values: dict[str, Any] = {}
    for base in option.extends:
        cls = schema.SCHEMAS["recipe"].get(base)
        for f in dataclasses.fields(cls) if cls else ():
            if f.default is not dataclasses.MISSING:
                values[f.name] = f.default
    values.update(dict(option.sets))
    return values


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
