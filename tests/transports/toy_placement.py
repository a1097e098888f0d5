"""A placement written outside the project, the way a user adds one: its module (a host class and its declaration) in
a folder of its own, plus cells that take it. Nothing of the project is edited; :func:`toy_placement` writes the
module, imports it (which registers the placement), adds a ``toy`` cell beside the ``thread`` cell of inference and
replay, and takes all of that back afterwards."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys

TOY_MODULE = '''
"""``toy``: owners on a thread of the driver's process, under a placement of their own."""

from components.hosts.thread import ThreadHost
from transports.kernel.placements import Placement, Reach, register


class ToyHost(ThreadHost):
    placement = "toy"


PLACEMENT = register(Placement("toy", ToyHost, Reach.PROCESS, aliases=("toy_box",),
                               summary="a thread of the driver's process, named otherwise"))
'''

TAKES_TOY = ("inference", "replay")
"""The components given a ``toy`` cell: a copy of their ``thread`` cell."""


@contextlib.contextmanager
def toy_placement(folder: str):
    """Write the toy placement's module into ``folder``, import it and add its cells; on exit, everything is as it
    was. Yields the module."""
    from components import compat
    from transports.kernel import placements

    name = f"toy_placement_{os.getpid()}"
    with open(os.path.join(folder, f"{name}.py"), "w") as f:
        f.write(TOY_MODULE)
    sys.path.insert(0, folder)
    saved = {component: compat.DECLARATIONS[component] for component in TAKES_TOY}
    try:
        module = importlib.import_module(name)
        for component in TAKES_TOY:
            declared = compat.DECLARATIONS[component]
            thread = next(c for c in declared.cells if c.placement == "thread")
            compat.DECLARATIONS[component] = dataclasses.replace(
                declared, cells=(*declared.cells, dataclasses.replace(thread, placement="toy")))
        yield module
    finally:
        compat.DECLARATIONS.update(saved)
        placements.unregister("toy")
        sys.path.remove(folder)
        sys.modules.pop(name, None)
