"""What a logger writes into: a *backend*, one object the `Logger` owner holds and opens where
the logger lives.

A backend is one class with the small protocol `LoggerBackend`; its constructor's keywords are its options
(``logger.*`` in YAML besides ``_target_``), so a dataclass is the natural shape, and the built-in backends'
dataclasses are also their YAML schemas (``logger=csv``, ``logger=tensorboard``). A user's backend is selected by
``logger._target_=my_pkg.my_module.MyBackend``. Plain data: nothing heavy is imported here, nor by a backend until it
opens.
"""

from __future__ import annotations

import inspect
import os
import threading
from typing import Any, Mapping, Protocol, runtime_checkable

from transports.kernel.errors import NO_SPACE, ConfigurationError

REQUIRED = ("open", "close", "write_scalar", "write_hparams")
"""The methods every backend has (``flush`` is optional)."""


@runtime_checkable
class LoggerBackend(Protocol):
    """The protocol of a logger backend.

    The owner calls these methods one at a time, where the logger lives, between one ``open`` and one ``close``.
    Optional members: ``flush()`` (push buffered values to disk), ``flush_seconds`` (the owner then calls ``flush`` at
    least this often, so a logger killed outright loses only its last seconds), ``resume_step`` (a keyword the launcher
    sets on resume: what was logged after that step is dropped), ``run_config`` (a keyword the launcher sets: the
    run's resolved config as a nested dict, to record as hyperparameters when it opens), ``write_metrics(values,
    step)`` (several scalars of one step at once: ``log_metrics`` calls it instead of ``write_scalar`` for each),
    ``write_video(name, path, step, fps)`` (the video file the logger wrote, to carry into the backend's own store),
    a class method ``check_config(options, path)`` (called while the run is planned, with the YAML options: raise
    `ConfigurationError` for what cannot work, such as a missing package) and methods named ``log_*``
    (callable through the logger's client, like its own operations).

    Attributes:
        log_dir: the directory it writes into (created before ``open``; relative to the run directory in YAML).
    """

    log_dir: str

    def open(self) -> None:
        """Build the SDK or files (called where the logger lives)."""

    def close(self) -> None:
        """Flush and release what ``open`` built."""

    def write_scalar(self, name: str, value: float, step: int | None) -> None:
        """Write one scalar.

        Args:
            name: its tag.
            value: the value, a float.
            step: its step, or ``None``.
        """

    def write_hparams(self, hparams: Mapping[str, Any]) -> None:
        """Record hyperparameters (numbers, strings and booleans)."""


def as_float(name: str, value: Any) -> float:
    """``value`` (a number or a one-element tensor) as a float.

    Raises:
        TypeError: naming ``name``, for anything else.
    """
    try:
        return float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"log value for {name!r} must be a number or a one-element tensor, got {value!r}") from exc


def check_backend(backend: Any) -> None:
    """Refuse an object that lacks a method of `REQUIRED` or ``log_dir``.

    Raises:
        ConfigurationError: naming what is missing.
    """
    missing = [name for name in REQUIRED if not callable(getattr(backend, name, None))]
    if missing or not isinstance(getattr(backend, "log_dir", None), str):
        what = ", ".join(missing + ([] if isinstance(getattr(backend, "log_dir", None), str) else ["log_dir"]))
        raise ConfigurationError(f"{type(backend).__name__} is no logger backend: it lacks {what} (see "
                                 "components.logger.LoggerBackend)", path="logger._target_")


def backend_class(node: Mapping[str, Any], path: str = "logger") -> type:
    """The backend class a logger config names by ``_target_``, checked against the config's other keys, so a wrong
    backend fails before anything starts.

    Args:
        node: the ``logger`` node (``_target_``, ``log_dir`` and the backend's options).
        path: its config path.

    Raises:
        ConfigurationError: no ``_target_``, it does not import or lacks a method of the protocol, there is no
            ``log_dir`` (relative to the run directory), the class does not take the config's keys, or its
            ``check_config`` refuses them (a package it needs is missing, a URI it cannot use).
    """
    from ..targets import locate

    cls = locate(node, path)
    missing = [name for name in REQUIRED if not callable(getattr(cls, name, None))] if isinstance(cls, type) else []
    if not isinstance(cls, type) or missing:
        raise ConfigurationError(f"{node['_target_']!r} is not a logger backend (a class with "
                                 f"{', '.join(REQUIRED)}: see components.logger.LoggerBackend)",
                                 path=f"{path}._target_")
    options = {k: v for k, v in node.items() if k != "_target_"}
    if "log_dir" not in options:
        raise ConfigurationError(f"{path}.log_dir is missing: the directory the logger writes, relative to the run "
                                 "directory (e.g. log_dir: .)", path=f"{path}.log_dir")
    try:
        inspect.signature(cls).bind(**options)
    except TypeError as exc:
        raise ConfigurationError(f"{node['_target_']} does not take the options {sorted(options)}: {exc}",
                                 path=path) from exc
    check = getattr(cls, "check_config", None)
    if callable(check):
        check(options, path)
    return cls


def installed(package: str) -> bool:
    """Whether ``package`` (a top-level module) can be imported here, without importing it (for ``check_config``:
    the SDKs of some backends take seconds to import)."""
    import importlib.util

    try:
        return importlib.util.find_spec(package) is not None  # None also where sys.modules blocks it (holds None)
    except ValueError:  # imported already, without a spec
        return True


def takes(cls: type, name: str) -> bool:
    """Whether backend class ``cls`` takes the keyword ``name`` (or any keyword)."""
    params = inspect.signature(cls).parameters
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def quiet_writer_threads() -> None:
    """TensorBoard's writer thread keeps a failed write for the writer, which raises it at its next call (named by the
    owner), and then re-raises it in the thread as well: a full disk is said once, at the call, not as a thread's
    traceback too. Installed once per process, before the first writer opens."""
    previous = threading.excepthook
    if getattr(previous, "quiet_full_disk", False):
        return

    def hook(args) -> None:
        if not (isinstance(args.exc_value, OSError) and args.exc_value.errno in NO_SPACE
                and type(args.thread).__module__.startswith("tensorboard")):
            previous(args)

    hook.quiet_full_disk = True
    threading.excepthook = hook


def saved_run_id(log_dir: str, name: str) -> str | None:
    """The run id a tracking backend (W&B, MLflow) saved in file ``name`` of ``log_dir`` when it first opened there, so
    opening again (a resumed run) continues that run; ``None`` before."""
    try:
        with open(os.path.join(log_dir, name)) as f:
            return f.read().strip() or None
    except FileNotFoundError:
        return None


def save_run_id(log_dir: str, name: str, run_id: str) -> None:
    """Save ``run_id`` in file ``name`` of ``log_dir`` (read back by `saved_run_id`)."""
    with open(os.path.join(log_dir, name), "w") as f:
        f.write(run_id)
