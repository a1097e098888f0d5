"""The launcher's own YAML package, ``conf``, imported from where this installation keeps it.

Hydra finds the launcher's configs as the package ``conf`` (``pkg://conf``). A working directory that holds a
``conf/`` folder of its own (Hydra's usual name for a project's configs) is first on ``sys.path`` under
``python -m launcher``, and where the launcher is installed in editable mode that folder would be imported as a
namespace package ``conf`` ahead of the launcher's: Hydra would then read the user's folder as the launcher's
configs. `import_own_conf` imports the launcher's ``conf`` by its location first.
"""

from __future__ import annotations

import importlib.util
import os
import sys

OWN_CONF = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "conf")
"""The folder of the launcher's YAML configs, beside the ``launcher`` package."""


def import_own_conf() -> None:
    """Make ``conf`` the launcher's config package (idempotent; a ``conf`` module already imported from elsewhere
    that is a namespace package, a user's folder, is replaced)."""
    current = sys.modules.get("conf")
    if current is not None and getattr(current, "__file__", None) is not None:
        return  # a regular package: the launcher's (or one the user imported on purpose, left alone)
    init = os.path.join(OWN_CONF, "__init__.py")
    spec = importlib.util.spec_from_file_location("conf", init, submodule_search_locations=[OWN_CONF])
    module = importlib.util.module_from_spec(spec)
    sys.modules["conf"] = module
    spec.loader.exec_module(module)
