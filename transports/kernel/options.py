"""Typed options with declared ranges: the one mechanism every config dataclass of the project checks with.

A dataclass field declares what it accepts with `bounded` (a numeric range), `one_of` (a choice) or
`device_option` (a torch device's name);
`check_fields` checks a mapping of values (a transport's options, a component's config, a composed YAML node)
against the dataclass: unknown keys, then each declared range, naming the config path, the value and what is
allowed. The launcher's preflight, the plan, the owners built from Python and the generated configuration reference
read the same metadata. Plain data: nothing heavy is imported.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from typing import Any, Iterable, Mapping

from .errors import ConfigurationError


def bounded(default: Any, *, ge: float | None = None, gt: float | None = None, le: float | None = None,
            lt: float | None = None, unit: str = "") -> Any:
    """A dataclass field whose value must lie within the given bounds (``None`` passes an ``Optional`` field).

    Args:
        default: the field's default.
        ge: the least value allowed (``>=``).
        gt: a value the field must exceed (``>``).
        le: the greatest value allowed (``<=``).
        lt: a value the field must stay below (``<``).
        unit: what the value counts (``"seconds"``), shown in messages and in the configuration reference.

    Examples:
        >>> @dataclasses.dataclass
        ... class Conf:
        ...     lr: float = bounded(1e-3, gt=0)
    """
    bounds = {k: v for k, v in {"ge": ge, "gt": gt, "le": le, "lt": lt}.items() if v is not None}
    return dataclasses.field(default=default, metadata={"bounds": bounds, "unit": unit})


def one_of(default: Any, choices: Iterable[str]) -> Any:
    """A dataclass field whose value must be one of ``choices`` (``None`` passes an ``Optional`` field)."""
    return dataclasses.field(default=default, metadata={"choices": tuple(choices)})


DEVICES = ("cpu", "cuda", "cuda:<index>")
"""The devices a ``*_device`` option names: the CPU, or a CUDA device (the current one, or by index)."""

_DEVICE = re.compile(r"cpu|cuda(:[0-9]+)?")


def device_option(default: str | None) -> Any:
    """A dataclass field naming a torch device, one of `DEVICES` (``None`` passes an ``Optional`` field).

    Only the name is checked here: whether a machine has the device is checked where the device is used (the
    launcher's `check_here`, the owner's host), since a plan may be made for another node.
    """
    return dataclasses.field(default=default, metadata={"device": True})


def is_device(f: dataclasses.Field) -> bool:
    """Whether field ``f`` names a torch device (`device_option`)."""
    return bool(f.metadata.get("device"))


def fields_of(kind: Any) -> dict[str, dataclasses.Field]:
    """The fields of a dataclass type (an empty dict for anything else)."""
    if isinstance(kind, type) and dataclasses.is_dataclass(kind):
        return {f.name: f for f in dataclasses.fields(kind)}
    return {}


def allowed(f: dataclasses.Field, optional: bool = False) -> str | None:
    """What field ``f`` accepts, in words (``>= 1``, ``> 0 seconds``, ``in [0, 1]``, ``one of a, b``), or ``None``
    when it declares no range."""
    if "choices" in f.metadata:
        text = "one of " + ", ".join(f.metadata["choices"])
    elif is_device(f):
        text = "a device (" + ", ".join(DEVICES[:-1]) + " or " + DEVICES[-1] + ")"
    elif f.metadata.get("bounds"):
        text = _describe(f.metadata["bounds"], f.metadata.get("unit", ""))
    else:
        return None
    return text + (" or null" if optional else "")


def is_optional(hint: Any) -> bool:
    """Whether the type hint ``hint`` admits ``None`` (``X | None``, ``Optional[X]``)."""
    return type(None) in typing.get_args(hint)


def within(f: dataclasses.Field, value: Any) -> bool:
    """Whether ``value`` lies within what field ``f`` declares (a field without a range accepts anything)."""
    if "choices" in f.metadata:
        return value in f.metadata["choices"]
    if is_device(f):
        return isinstance(value, str) and _DEVICE.fullmatch(value) is not None
    bounds = f.metadata.get("bounds")
    if not bounds:
        return True
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    checks = {"ge": lambda b: value >= b, "gt": lambda b: value > b, "le": lambda b: value <= b,
              "lt": lambda b: value < b}
    return all(checks[op](bound) for op, bound in bounds.items())


def check_value(f: dataclasses.Field, value: Any, path: str, hint: Any = None) -> None:
    """Raise `ConfigurationError` naming ``path`` unless ``value`` is within what field ``f`` declares."""
    if value is None and is_optional(hint):
        return
    if not within(f, value):
        raise ConfigurationError(f"{path} must be {allowed(f, is_optional(hint))}, got {value!r}", path=path,
                                 alternatives=f.metadata.get("choices", ()))


def check_fields(kind: type, values: Mapping[str, Any], *, path: str, what: str | None = None) -> None:
    """Check ``values`` against dataclass ``kind``: every key one of its fields, every value within its range.

    Args:
        kind: the dataclass.
        values: field name -> value (a subset of the fields; the others keep their defaults).
        path: the config path of ``values`` (messages name ``<path>.<field>``).
        what: what takes these options, in messages (default: ``path``).

    Raises:
        ConfigurationError: an unknown key (naming the fields there are) or a value out of range.
    """
    fields = fields_of(kind)
    hints = typing.get_type_hints(kind)
    for key, value in values.items():
        full = f"{path}.{key}" if path else str(key)
        if key not in fields:
            raise ConfigurationError(f"{what or path or 'the config'} takes no option {key!r}", path=full,
                                     alternatives=tuple(fields))
        check_value(fields[key], value, full, hints.get(key))


def check_instance(obj: Any, *, path: str) -> None:
    """Check every field of the dataclass instance ``obj`` against its declared range (for ``__post_init__``)."""
    hints = typing.get_type_hints(type(obj))
    for name, f in fields_of(type(obj)).items():
        check_value(f, getattr(obj, name), f"{path}.{name}" if path else name, hints.get(name))


def _describe(bounds: dict, unit: str) -> str:
    low = next(((op, b) for op, b in bounds.items() if op in ("ge", "gt")), None)
    high = next(((op, b) for op, b in bounds.items() if op in ("le", "lt")), None)
    signs = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}
    if low and high:
        text = f"in {'[' if low[0] == 'ge' else '('}{low[1]}, {high[1]}{']' if high[0] == 'le' else ')'}"
    else:
        op, bound = low or high
        text = f"{signs[op]} {bound}"
    return text + (f" {unit}" if unit else "")
