"""The run's checkpoint as the launcher hands it to a recipe: it gives back what was saved and keeps a snapshot at each
batch boundary.

A recipe calls `Checkpoint.restore` once (``None``: a fresh start) and `Checkpoint.step` after each
batch with a function that returns its state (the interface is `recipes.base.Checkpoint`). ``step`` copies
that state at once (tensors cloned), so the snapshot is consistent at that boundary however training goes on, and
writes it every ``every`` frames; the launcher calls `Checkpoint.save` at the end or when the run stops early,
which writes the last snapshot (`launcher.checkpointing.files`).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping

from .files import FORMAT, copy_state, encode, write_atomically

log = logging.getLogger(__name__)


class Checkpoint:
    """Saves a recipe's state at batch boundaries and hands it back when the run resumes.

    Without ``path`` it never writes, and ``restore`` returns ``None``.

    Args:
        path: the checkpoint file (``None``: never write).
        every: frames between writes (``0``: only when `save` is called).
        restored: the checkpoint this run continues from (what `load`
            returned), or ``None``.
        extras: more state read when a checkpoint is written, by name (``{"replay": replay.state_dict}``); an
            extra that cannot be read stops that write (the previous checkpoint stays).
        before_write: called before each write (the launcher flushes the logger there, so every value logged up to
            the checkpoint's frame is on disk when the checkpoint is).

    Examples:
        >>> state = clients.checkpoint.restore()
        >>> if state is not None:
        ...     net.load_state_dict(state["net"])
        >>> for batch in clients.collector:
        ...     ...
        ...     clients.checkpoint.step(frames, lambda: {"net": net.state_dict()}, policy_version=version)
    """

    def __init__(self, path: str | None = None, every: int = 0, *, restored: Mapping[str, Any] | None = None,
                 extras: Mapping[str, Callable[[], Any]] | None = None, before_write: Callable[[], None] | None = None):
        if every < 0:
            raise ValueError(f"every must be >= 0 frames, got {every!r}")
        self.path, self.every = path, every
        self.restored = dict(restored) if restored is not None else None
        self.extras = dict(extras or {})
        self.before_write = before_write
        self._last: tuple[int, int, Any] | None = None  # (frames, policy version, state) of the last step()
        start = int(self.restored["frames"]) if self.restored else 0
        self._next = self._after(start)

    @property
    def enabled(self) -> bool:
        """Whether this checkpoint writes files."""
        return self.path is not None

    def restore(self) -> Any | None:
        """The recipe's state as it was saved, or ``None`` for a fresh start."""
        return None if self.restored is None else self.restored.get("recipe")

    def step(self, frames: int, state: Callable[[], Any], *, policy_version: int | None = None) -> bool:
        """A batch boundary: keep a copy of ``state()`` and write it if ``every`` frames have passed.

        Args:
            frames: frames collected so far (the logger's step of this batch's values).
            state: returns the recipe's state (module and optimizer state dicts, counters, RNG state...).
            policy_version: the weight-sync version of the weights in ``state`` (a resumed run's pushes continue
                from it).

        Returns:
            Whether a checkpoint was written.

        Raises:
            TypeError: the state holds something other than tensors and plain data (see `encode`).
        """
        if not self.enabled:
            return False
        # one assignment, once the copy is complete: an interrupt before it keeps the previous snapshot whole
        version = policy_version if policy_version is not None else (self._last[1] if self._last else self._version())
        self._last = (int(frames), int(version), copy_state(encode(state())))
        if self.every and self._last[0] >= self._next:
            self._next = self._after(self._last[0])
            return self.save()
        return False

    def save(self, *, finished: Mapping[str, Any] | None = None) -> bool:
        """Write the last snapshot to ``path`` (atomically); nothing is written before the first `step`.

        Args:
            finished: how the run ended when it ended on its own (``{"solved": ..., "frames": ...}``); a resumed
                run that had finished does not train again.

        Returns:
            Whether a checkpoint was written.

        Raises:
            TypeError: an extra holds something other than tensors and plain data (nothing is written).
            OSError: the file could not be written (the previous checkpoint is intact).
        """
        last = self._last
        if not self.enabled or last is None:
            return False
        frames, version, state = last
        payload = {"format": FORMAT, "frames": frames, "policy_version": version,
                   "finished": dict(finished) if finished is not None else None, "recipe": state}
        if self.before_write is not None:
            self.before_write()
        for name, read in self.extras.items():
            payload[name] = encode(read(), name)
        write_atomically(payload, self.path)
        log.info("checkpoint at %d frames written to %s", frames, self.path)
        return True

    @property
    def frames(self) -> int:
        """The frame count of the last snapshot (of the restored checkpoint before the first `step`)."""
        if self._last is not None:
            return self._last[0]
        return int(self.restored["frames"]) if self.restored else 0

    def _version(self) -> int:
        return int(self.restored.get("policy_version") or 0) if self.restored else 0

    def _after(self, frames: int) -> int:
        return (frames // self.every + 1) * self.every if self.every else 0
