"""Every process of ours starts faster: importing tensordict no longer imports torch's compiler frontend.

tensordict marks a few of its functions for ``torch.compile`` when it is imported (``torch.compiler.allow_in_graph``,
``torch.compiler.assume_constant_result``), and each mark imports ``torch._dynamo``: about 1.3 s of CPU in every
interpreter that imports tensordict (the driver, the forkserver, each Ray actor, each Monarch proc, each worker rank),
for a compiler nothing here uses unless a policy is compiled. Both marks only register the function with Dynamo and
return it unchanged (torch 2.13), so from the moment tensordict is imported they are recorded instead (tensordict's
and anyone's), and made, exactly as asked for, the moment ``torch._dynamo`` is imported (which compiling anything
does first); the originals are then put back. `install` itself imports nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from typing import Any, Callable

_MARKS = ("allow_in_graph", "assume_constant_result")
_deferred: list[tuple[str, Any]] = []
_originals: dict[str, Callable] = {}


class _AroundImport(importlib.abc.MetaPathFinder):
    """A one-shot finder: runs ``before()`` when module ``name`` is about to execute and ``after()`` once it did."""

    def __init__(self, name: str, before: Callable[[], None] | None = None, after: Callable[[], None] | None = None):
        self.name, self.before, self.after = name, before, after

    def find_spec(self, fullname: str, path: Any = None, target: Any = None):
        if fullname != self.name:
            return None
        sys.meta_path[:] = [f for f in sys.meta_path if f is not self]
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        execute, before, after = spec.loader.exec_module, self.before, self.after

        def exec_module(module: Any) -> None:
            if before is not None:
                before()
            try:
                execute(module)
            finally:
                if after is not None:
                    after()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _record_marks() -> None:
    """Before tensordict runs: record the compiler marks instead of importing the compiler for them."""
    try:
        import torch.compiler as compiler
    except ImportError:  # pragma: no cover - tensordict needs torch
        return
    if "torch._dynamo" in sys.modules or not all(hasattr(compiler, mark) for mark in _MARKS):
        return

    def deferring(mark: str) -> Callable:
        def record(fn: Any) -> Any:
            if "torch._dynamo" in sys.modules:  # the compiler is here already: mark at once
                return _originals[mark](fn)
            _deferred.append((mark, fn))
            return fn

        return record

    for mark in _MARKS:
        _originals[mark] = getattr(compiler, mark)
        setattr(compiler, mark, deferring(mark))
    sys.meta_path.insert(0, _AroundImport("torch._dynamo", after=_apply_marks))


def _apply_marks() -> None:
    """Once ``torch._dynamo`` is imported: the originals back, and every recorded mark made as it was asked for."""
    import torch.compiler as compiler

    for mark, original in _originals.items():
        setattr(compiler, mark, original)
    marks, _deferred[:] = list(_deferred), []
    for mark, fn in marks:
        _originals[mark](fn)


def install() -> None:
    """Record tensordict's compiler marks until ``torch._dynamo`` is imported (idempotent; imports nothing)."""
    if "tensordict" in sys.modules or any(isinstance(f, _AroundImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _AroundImport("tensordict", before=_record_marks))
