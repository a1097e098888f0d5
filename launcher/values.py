"""A composed config against its schema: every key known, every value within the range its field declares
(`transports.kernel.options.bounded`, `one_of`), then each dataclass's
``rules()`` between its fields. The preflight runs it on the command line's config, `launcher.plan.build_plan`
on any config."""

from __future__ import annotations

import typing
from typing import Any, Iterator

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from transports.kernel import options
from transports.kernel.errors import ConfigurationError


def kind_text(hint: Any) -> str:
    """What a field of this type accepts, in words."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) is typing.Union and len(args) < len(typing.get_args(hint)):
        return (kind_text(args[0]) if len(args) == 1 else "a value") + " or null"
    if hint is Any:
        return "a value"
    if hint is bool:
        return "true or false"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    if hint is str:
        return "a string"
    if typing.get_origin(hint) in (dict, list, tuple):
        return "a mapping" if typing.get_origin(hint) is dict else "a list"
    if options.fields_of(hint):
        return f"a mapping of {', '.join(options.fields_of(hint))}"
    return f"a {getattr(hint, '__name__', hint)}"


def check_values(cfg: DictConfig, *, strict: bool = True) -> None:
    """Check a composed config against its schema: every key known, every value within the range its field
    declares (`transports.kernel.options.bounded`, `one_of`), then each
    dataclass's ``rules()`` between its fields.

    Args:
        cfg: the composed config.
        strict: a value whose interpolation does not resolve is an error (``False``: skip it; the preflight runs
            outside Hydra's app, where ``${hydra:...}`` does not resolve yet).

    Raises:
        ConfigurationError: the first mistake, naming its config path, the value and what is allowed.
    """
    nodes = list(_typed_nodes(cfg, ""))
    for path, node, kind in nodes:
        _check_fields(path, node, kind, strict)
    for path, node, kind in nodes:
        if not hasattr(kind, "rules"):
            continue
        try:
            obj = OmegaConf.to_object(node)
        except OmegaConfBaseException as exc:
            if strict:
                raise ConfigurationError(f"{path} cannot be read: {str(exc).splitlines()[0]}", path=path) from None
            continue
        for name, holds, wrong in obj.rules():
            if not holds:
                raise ConfigurationError(wrong, path=_join(path, name))


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _typed_nodes(node: DictConfig, path: str) -> Iterator[tuple[str, DictConfig, type]]:
    """Every node of ``node`` typed by a schema dataclass, as ``(path, node, dataclass)``, parents first."""
    kind = OmegaConf.get_type(node)
    if options.fields_of(kind):
        yield path, node, kind
    for key in node.keys():
        if OmegaConf.is_interpolation(node, key) or OmegaConf.is_missing(node, key):
            continue
        child = node[key]
        if isinstance(child, DictConfig):
            yield from _typed_nodes(child, _join(path, key))


def _check_fields(path: str, node: DictConfig, kind: type, strict: bool) -> None:
    fields = options.fields_of(kind)
    for key in node.keys():
        if key not in fields:
            raise ConfigurationError(f"{path or 'the config'} has no key {key!r}", path=_join(path, key),
                                     alternatives=tuple(fields))
    hints = typing.get_type_hints(kind)
    for name, f in fields.items():
        full = _join(path, name)
        if name not in node or OmegaConf.is_missing(node, name):
            raise ConfigurationError(f"{full} has no value: set one ({kind_text(hints.get(name, Any))})", path=full)
        if not options.allowed(f):
            continue
        try:
            value = node[name]
        except OmegaConfBaseException as exc:
            if strict:
                raise ConfigurationError(f"{full} cannot be resolved: {str(exc).splitlines()[0]}", path=full) from None
            continue
        options.check_value(f, value, full, hints.get(name))
