"""The inference server's config (``components.inference`` in YAML): where it runs, batching, instrumentation and
devices. Constructing one checks its values, so the plan (which builds it from YAML) and a user building a server from
Python get the same errors, naming ``components.inference.<field>``, the value and the allowed range."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from transports.kernel.errors import ConfigurationError
from transports.kernel.options import bounded, device_option, one_of

from ..config import ComponentConfig, check_devices


@dataclass
class InferenceServerConfig(ComponentConfig):
    """Where the server runs, how it batches, what it measures, and its devices.

    Attributes:
        max_batch_size: most requests combined into one forward pass.
        min_batch_size: fewest requests to wait for (up to ``timeout``) before a forward pass.
        timeout: seconds to wait for ``min_batch_size`` requests before serving what is there.
        collect_stats: keep batch-size, queue-wait and forward-time statistics.
        stats_window: number of recent batches the statistics cover.
        policy_device: device of the policy forward pass (``cpu``, ``cuda``, ``cuda:<index>``; checked against the
            machine where the policy is built).
        output_device: device of the tensors handed back to callers (``None``: the request's device).
        static_batch_size: serve every batch as a CUDA graph captured for this many rows (``None``: eager forwards of
            the batch's own size). Pad rows are copies of the batch's last request, their answers discarded. Needs an
            explicit CUDA ``policy_device``, the request layout (the launcher derives it), and at least
            ``max_batch_size`` rows. The graph is captured when the server starts; in-place weight updates keep it, an
            update that replaces the policy's tensors gives it up (the server says so and serves eagerly).
        pin_memory: with a CUDA ``policy_device``, stage fixed-slot batches (``shared_memory``, ``process_slot``) in
            pinned host memory, so copies to and from the device run asynchronously and one CUDA event per batch
            waits for them.
        interaction_mode: the mode forwards run in, ``random`` (sample actions) or ``deterministic`` (the most likely
            ones), for requests a client did not stamp with a mode of their own (`components.inference.modes`).
            A CUDA graph is captured in this mode, and refuses requests stamped with another.

    Examples:
        >>> InferenceServerConfig(placement="process", max_batch_size=32)
    """

    component: ClassVar[str] = "inference"

    max_batch_size: int = bounded(64, ge=1)  # most requests combined into one forward pass
    min_batch_size: int = bounded(1, ge=1)  # fewest requests to wait for, up to `timeout`
    timeout: float = bounded(0.002, ge=0, unit="seconds")  # to wait for min_batch_size requests
    collect_stats: bool = True  # keep batch-size and latency statistics
    stats_window: int = bounded(1000, ge=1)  # batches the statistics cover
    policy_device: str = device_option("cpu")  # device of the policy forward pass
    output_device: Optional[str] = device_option(None)  # device of returned tensors (None: the request's)
    static_batch_size: Optional[int] = bounded(None, ge=1)  # rows of each captured CUDA graph (None: eager)
    pin_memory: bool = True  # pinned host staging of fixed-slot batches for a CUDA policy device
    interaction_mode: str = one_of("random", ("random", "deterministic"))  # for unstamped requests

    def rules(self) -> tuple[tuple[str, bool, str], ...]:
        static = self.static_batch_size
        return (("min_batch_size", self.min_batch_size <= self.max_batch_size,
                 f"{self.path}.min_batch_size must be in [1, max_batch_size={self.max_batch_size}], got "
                 f"{self.min_batch_size!r}"),
                ("static_batch_size", static is None or str(self.policy_device).startswith("cuda"),
                 f"{self.path}.static_batch_size captures CUDA graphs: it needs an explicit CUDA policy_device (cuda or "
                 f"cuda:<index>), got policy_device={self.policy_device!r}; set {self.path}.policy_device=cuda, or "
                 "leave static_batch_size unset (eager batches)"),
                ("static_batch_size", static is None or static >= self.max_batch_size,
                 f"{self.path}.static_batch_size must be at least max_batch_size={self.max_batch_size} (a batch never "
                 f"outgrows its graph), got {static!r}"))

    def check_placement(self, placement: str, *, inline: bool) -> None:
        """Refuse static batches for an owner without a serving loop (one called in the caller's thread, `direct`):
        checked while planning and again when the server is built.

        Raises:
            ConfigurationError: naming `components.inference.static_batch_size`.
        """
        if inline and self.static_batch_size is not None:
            path = f"{self.path}.static_batch_size"
            raise ConfigurationError(
                f"{path}={self.static_batch_size}: static batches are what a serving loop forwards, and placement "
                f"{placement!r} has none (each call is a forward in the caller's thread); place the server in a "
                "thread or process (components.inference.placement=process), or leave static_batch_size unset",
                path=path)

    def check_devices(self) -> None:
        """Refuse a device this machine does not have (imports torch: called where the policy is built, not when a
        config is composed or planned: a plan may be made for another node).

        Raises:
            ConfigurationError: naming ``components.inference.policy_device`` (or ``output_device``).
        """
        check_devices(self, self.path)
