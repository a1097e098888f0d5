"""Plugins: what a package installed beside this one adds (a placement, a transport, an env family, cells of the
table), found through the entry-point group ``rl_services.plugins``.

A plugin is a module that registers what it declares when it is imported, the way the built-in host, transport and
env-family modules do. Its package names it in its own ``pyproject.toml``:

    [project.entry-points."rl_services.plugins"]
    my_family = "my_pkg.my_family"

Every interpreter of a run (the driver, each owner's process, actor or rank, a Slurm job) imports the plugins when it
first imports `components`, so a name a plugin registers means the same thing everywhere. The launcher's command
line reads the installed packages' entry points and hands the list down in the environment variable
``RLSVC_PLUGINS`` (`hand_down`): the processes of its run import those modules without reading every installed
package again. A process outside a run (a notebook, a script) reads them itself each time. A plugin that fails to
import is named in a `PluginWarning` and left out; the run goes on without what it would have declared (a
config that names it is then refused, listing what is registered).
"""

from __future__ import annotations

import importlib
import os
import warnings

GROUP = "rl_services.plugins"
"""The entry-point group whose modules are imported as plugins."""

VARIABLE = "RLSVC_PLUGINS"
"""The environment variable that hands the plugins found (``name=module[:attribute]``, comma-separated) down to the
processes of a run."""

_loaded: dict[str, str | None] = {}  # entry point name -> why it failed, or None
_found_here: list[tuple[str, str]] | None = None  # what this interpreter found, as (name, module[:attribute])


class PluginWarning(UserWarning):
    """A plugin named in `GROUP` could not be imported."""


def _found() -> list[tuple[str, str]]:
    """``(name, module[:attribute])`` of every plugin: as handed down, or read from the installed packages."""
    global _found_here
    handed = os.environ.get(VARIABLE)
    if handed is not None:
        _found_here = [tuple(item.split("=", 1)) for item in handed.split(",") if "=" in item]
    else:
        from importlib.metadata import entry_points

        _found_here = [(point.name, point.value) for point in entry_points(group=GROUP)]
    return _found_here


def hand_down() -> None:
    """Name the plugins this interpreter found in ``RLSVC_PLUGINS``, for the processes it starts from now on."""
    os.environ[VARIABLE] = ",".join(f"{name}={value}" for name, value in (_found() if _found_here is None
                                                                           else _found_here))


def load_plugins() -> dict[str, str | None]:
    """Import every plugin module not imported yet (once per interpreter).

    Returns:
        Each plugin's entry-point name and ``None`` where it was imported, or why it could not be.
    """
    for name, value in _found():
        if name in _loaded:
            continue
        _loaded[name] = None  # first: a plugin that imports components again is not loaded twice
        module, _, attribute = value.partition(":")
        try:
            imported = importlib.import_module(module.strip())
            if attribute:
                getattr(imported, attribute.strip())
        except Exception as exc:  # noqa: BLE001 - any error of a user's module: named, and the run goes on
            _loaded[name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"plugin {name!r} ({value}, entry-point group {GROUP!r}) could not be imported, so what it "
                          f"declares is not registered: {_loaded[name]}", PluginWarning, stacklevel=2)
    return dict(_loaded)
