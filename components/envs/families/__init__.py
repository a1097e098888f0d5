"""The built-in env families, one module each, every one registering itself with `components.envs.family`:
importing this package loads them all (a module dropped here is a family, with nothing to list)."""

import importlib
import pkgutil

BUILT_IN = tuple(info.name for info in pkgutil.iter_modules(__path__))
"""The modules of this package, each one family."""

for _name in BUILT_IN:
    importlib.import_module(f"{__name__}.{_name}")
