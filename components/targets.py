"""User code named in YAML by ``_target_``: built with ``hydra.utils.instantiate``, failures mapped to ours.

A config node such as ``{_target_: my_pkg.nets.make_net, hidden: 128}`` names a callable and its keyword
arguments. `instantiate_target` builds it where it is used (a collector process, a Ray actor: only the
picklable node travels) and turns every way it can fail (no ``_target_``, a name that does not import, a
call that raises, a result of the wrong type) into a `ConfigurationError` naming the config path.
Hydra is imported on first use.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from transports.kernel.errors import ConfigurationError


def target_name(node: Mapping[str, Any] | None, path: str) -> str:
    """The dotted name in ``node["_target_"]``.

    Raises:
        ConfigurationError: ``node`` is not a mapping with a non-empty string ``_target_``.
    """
    target = node.get("_target_") if isinstance(node, Mapping) or hasattr(node, "get") else None
    if not isinstance(target, str) or not target:
        raise ConfigurationError(f"{path} must be a mapping with _target_ naming a callable, got {node!r}",
                                 path=f"{path}._target_")
    return target


def locate(node: Mapping[str, Any], path: str) -> Callable:
    """Import and return the callable that ``node["_target_"]`` names.

    Raises:
        ConfigurationError: no ``_target_``, or it does not name an importable callable.
    """
    # hydra's own lookup (instantiate uses it); hydra.utils.get_object would log each failure as an error first
    from hydra._internal.utils import _locate

    target = target_name(node, path)
    try:
        obj = _locate(target)
    except Exception as exc:
        raise ConfigurationError(f"cannot import {target!r}: {' '.join(str(exc).split())}",
                                 path=f"{path}._target_") from exc
    if not callable(obj):
        raise ConfigurationError(f"{target!r} is a {type(obj).__name__}, not a callable", path=f"{path}._target_")
    return obj


def instantiate_target(node: Mapping[str, Any], path: str, *, expect: type | tuple[type, ...] | None = None,
                       **kwargs: Any) -> Any:
    """``hydra.utils.instantiate(node, **kwargs)`` with plain Python containers as arguments.

    Args:
        node: a mapping (or DictConfig) with ``_target_`` and the callable's keyword arguments.
        path: where ``node`` sits in the config (``recipe.network``), for error messages.
        expect: the type(s) the result must have.
        **kwargs: arguments the caller adds (``in_features=4``); they win over the node's.

    Returns:
        What the callable returned.

    Raises:
        ConfigurationError: the target does not import, the call raises, or the result is not an ``expect``.
    """
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    locate(node, path)  # a name that does not import fails here, with its own message
    target = target_name(node, path)
    try:
        obj = instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise ConfigurationError(f"{target}(...) failed: {type(cause).__name__}: {cause}", path=path) from exc
    if expect is not None and not isinstance(obj, expect):
        names = " or ".join(_name(t) for t in (expect if isinstance(expect, tuple) else (expect,)))
        raise ConfigurationError(f"{target}(...) returned a {_name(type(obj))}, "
                                 f"not a {names}", path=f"{path}._target_")
    return obj


def _name(cls: type) -> str:
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
