"""Checkpointing, in one place: the file (`launcher.checkpointing.files`), the `Checkpoint` the launcher hands a recipe
(`launcher.checkpointing.checkpoint`), and resuming a run (`launcher.checkpointing.resume`).

A checkpoint flows one way: the launcher reads it (`resolve`), hands the recipe's part to the recipe through
`Checkpoint` (a recipe sees only `recipes.base.Checkpoint`: ``restore`` and ``step``), puts the
services' part back (`restore_services`), and writes the last snapshot when the run ends (`save`).
"""

from .checkpoint import Checkpoint
from .files import FORMAT, decode, encode, load, remove_leftovers, write_atomically
from .resume import (CHECKPOINT, Resumed, changed_settings, checkpoint_for, resolve, restore_services, save,
                     saved_summary)

__all__ = ["CHECKPOINT", "FORMAT", "Checkpoint", "Resumed", "changed_settings", "checkpoint_for", "decode", "encode",
           "load", "remove_leftovers", "resolve", "restore_services", "save", "saved_summary", "write_atomically"]
