"""Checkpointing, in one place: the file (:mod:`.files`), the :class:`Checkpoint` the launcher hands a recipe
(:mod:`.checkpoint`), and resuming a run (:mod:`.resume`).

A checkpoint flows one way: the launcher reads it (:func:`resolve`), hands the recipe's part to the recipe through
:class:`Checkpoint` (a recipe sees only :class:`recipes.base.Checkpoint`: ``restore`` and ``step``), puts the
services' part back (:func:`restore_services`), and writes the last snapshot when the run ends (:func:`save`).
"""

from .checkpoint import Checkpoint
from .files import FORMAT, decode, encode, load, remove_leftovers, write_atomically
from .resume import (CHECKPOINT, Resumed, changed_settings, checkpoint_for, resolve, restore_services, save,
                     saved_summary)

__all__ = ["CHECKPOINT", "FORMAT", "Checkpoint", "Resumed", "changed_settings", "checkpoint_for", "decode", "encode",
           "load", "remove_leftovers", "resolve", "restore_services", "save", "saved_summary", "write_atomically"]
