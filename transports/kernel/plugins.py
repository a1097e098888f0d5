"""Plugins: what a package installed beside this one adds (a placement, a transport, an env family, cells of the
table), found through the entry-point group ``rl_services.plugins``.

A plugin is a module that registers what it declares when it is imported, the way the built-in host, transport and
env-family modules do. Its package names it in its own ``pyproject.toml``::

    [project.entry-points."rl_services.plugins"]
    my_family = "my_pkg.my_family"

Every interpreter of a run (the driver, each owner's process, actor or rank, a Slurm job) imports the plugins when it
first imports :mod:`components`, so a name a plugin registers means the same thing everywhere. A plugin that fails
to import is named in a :class:`PluginWarning` and left out; the run goes on without what it would have declared (a
config that names it is then refused, listing what is registered).
"""

from __future__ import annotations

import warnings
from importlib.metadata import entry_points

GROUP = "rl_services.plugins"
"""The entry-point group whose modules are imported as plugins."""

_loaded: dict[str, str | None] = {}  # entry point name -> why it failed, or None


class PluginWarning(UserWarning):
    """A plugin named in :data:`GROUP` could not be imported."""


def load_plugins() -> dict[str, str | None]:
    """Import every module named in :data:`GROUP` not imported yet (once per interpreter).

    Returns:
        Each plugin's entry-point name and ``None`` where it was imported, or why it could not be.
    """
    for point in entry_points(group=GROUP):
        if point.name in _loaded:
            continue
        _loaded[point.name] = None  # first: a plugin that imports components again is not loaded twice
        try:
            point.load()
        except Exception as exc:  # noqa: BLE001 - any error of a user's module: named, and the run goes on
            _loaded[point.name] = f"{type(exc).__name__}: {exc}"
            warnings.warn(f"plugin {point.name!r} ({point.value}, entry-point group {GROUP!r}) could not be imported, "
                          f"so what it declares is not registered: {_loaded[point.name]}", PluginWarning,
                          stacklevel=2)
    return dict(_loaded)
