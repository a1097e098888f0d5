"""Whether a peer's process still runs: what a caller waiting on a local peer checks between its polls."""

from __future__ import annotations


def pid_runs(pid: int | None) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has)."""
    if pid is None:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
