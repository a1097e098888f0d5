"""Lazy exports: a service package names its public classes without importing them, so reading the
compatibility table (its ``declaration`` module) never imports torch."""

from __future__ import annotations

import importlib
from typing import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__`` that imports ``package.<exports[name]>`` on first access to ``name``."""

    def __getattr__(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
