"""Where shared-memory segments live, and how much room is left there.

Every segment (`transports.segments`) is a file in the *segment directory*: ``/dev/shm`` unless the environment
variable ``RLSVC_SHM_DIR`` names another directory, preferably on a tmpfs (files elsewhere work, but their pages go
through that file system). The variable is read whenever a segment is made, and every process a run starts inherits
it, so set it before the run starts: a container's ``/dev/shm`` is often small (Docker's default is 64 MB), and a
directory on a larger tmpfs gives the run's segments the room it lacks. A segment is attached in the directory it was
made in, whatever the attaching process's variable says.

Imports nothing heavy: planning reads the room left (`room`), and failure reports name it (`shortage`).
"""

from __future__ import annotations

import math
import os

VARIABLE = "RLSVC_SHM_DIR"
"""The environment variable naming the segment directory."""
DEFAULT = "/dev/shm"
"""The segment directory where `VARIABLE` is unset or empty: POSIX shared memory on Linux."""


def segment_dir() -> str:
    """The directory new segments are made in: ``$RLSVC_SHM_DIR``, else ``/dev/shm``."""
    return os.path.abspath(os.environ.get(VARIABLE) or DEFAULT)


def room(directory: str | None = None) -> tuple[int, int] | None:
    """``(free, total)`` bytes of the file system holding ``directory`` (default: `segment_dir`), as an
    unprivileged process may use them; ``None`` where it cannot be read (the directory does not exist)."""
    try:
        st = os.statvfs(directory or segment_dir())
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def size_text(nbytes: float) -> str:
    """``nbytes`` in binary units, to one decimal: ``512 B``, ``68.4 MiB``, ``256.0 GiB``."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def room_text(directory: str | None = None) -> str:
    """How much room ``directory`` has, in words: ``12.0 MiB free of 64.0 MiB``."""
    space = room(directory)
    return "free space unknown" if space is None else f"{size_text(space[0])} free of {size_text(space[1])}"


def remedy(directory: str | None = None, need: int = 0) -> str:
    """What to do when the segment directory has too little room for ``need`` more bytes (0: unknown)."""
    directory = directory or segment_dir()
    size = f"{max(1, math.ceil(1.5 * need / 2**30))}g"  # room to spare for what else uses it
    return (f"give {directory} more room (a container: docker run --shm-size={size}; a tmpfs: mount -o remount,"
            f"size={size} {directory}) or set {VARIABLE} to a directory on a tmpfs with more, before the run starts")


def shortage(directory: str | None = None) -> str:
    """A process that died of SIGBUS touched a page of a shared mapping that could not be backed: on Linux, shared
    memory ran out. The words for it, naming the directory and its room now."""
    directory = directory or segment_dir()
    return f"it ran out of shared memory in {directory} ({room_text(directory)})"
