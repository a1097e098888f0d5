"""The serving loop: drain, top up, collate, one forward, stamp ``policy_version``, split, answer.

One ``ServingCore`` runs wherever the server lives (a thread of the owner's process, or the main thread of a
child process) over any request/reply transport's server endpoint. A batch that fails fails only its own
callers (with the remote error); weight updates are applied between batches.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable, Mapping

import torch
from tensordict import TensorDict, TensorDictBase

from transports.base import Batch, ServerEndpoint
from transports.kernel.errors import RemoteError

from .config import InferenceServerConfig
from .modes import MODE_KEY, modes_of, serving
from .staging import DeviceStaging
from .static import StaticBatches

POLL = 0.05
"""Seconds the loop waits for a first request before it checks for stop and weight updates."""


def default_collate(requests: list[TensorDictBase]) -> TensorDictBase:
    """Stack the requests along a new leading dimension: one row per request."""
    return torch.stack(requests, dim=0)


def copy_weights(policy: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``policy`` in place (storage kept, so views and captured graphs stay valid)."""
    with torch.no_grad():
        own = policy.state_dict()
        missing = set(own) - set(state)
        if missing:
            raise ValueError(f"weight update lacks parameters {sorted(missing)!r}")
        for name, tensor in own.items():
            tensor.copy_(state[name])


class Stats:
    """Batch sizes, queue waits and forward times over the last ``window`` batches."""

    def __init__(self, window: int):
        self.sizes: collections.deque = collections.deque(maxlen=window)
        self.waits: collections.deque = collections.deque(maxlen=window * 4)
        self.forwards: collections.deque = collections.deque(maxlen=window)
        self.batches = 0
        self.requests = 0
        self.lock = threading.Lock()

    def record(self, batch: Batch, started: float, forward: float) -> None:
        """Count one served batch.

        Args:
            batch: the batch served (its size and its requests' enqueue times).
            started: ``time.monotonic()`` when serving it began (the end of each request's queue wait).
            forward: seconds the forward took.
        """
        n, enqueued = len(batch), batch.enqueued
        waits = [max(0.0, started - enqueued[0])] if len(enqueued) == 1 else [max(0.0, started - t) for t in enqueued]
        with self.lock:
            self.batches += 1
            self.requests += n
            self.sizes.append(n)
            self.waits.extend(waits)
            self.forwards.append(forward)

    def snapshot(self) -> dict:
        """Counts, mean batch size, batch-size histogram and p50/p95 of queue waits and forward times."""
        with self.lock:
            sizes, waits, forwards = list(self.sizes), list(self.waits), list(self.forwards)
            batches, requests = self.batches, self.requests
        return {
            "batches": batches,
            "requests": requests,
            "mean_batch_size": sum(sizes) / len(sizes) if sizes else 0.0,
            "batch_size_histogram": dict(sorted(collections.Counter(sizes).items())),
            "queue_wait_p50": _quantile(waits, 0.5),
            "queue_wait_p95": _quantile(waits, 0.95),
            "forward_p50": _quantile(forwards, 0.5),
            "forward_p95": _quantile(forwards, 0.95),
        }


def _quantile(values: list, q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class ServingCore:
    """Serves one policy over one server endpoint until ``stop`` is set.

    Args:
        policy: the TensorDict policy (already on ``config.policy_device``).
        endpoint: the transport's server endpoint.
        config: batching settings and devices.
        weight_sync: a weight-sync client polled between batches (or ``None``).
        collate_fn: combines request TensorDicts into one batch (default: stack along a new dimension).
        static: serves batches at a fixed size from a captured graph (``config.static_batch_size``), or ``None``.
        staging: stage fixed-layout batches through host buffers and a persistent device batch
            (`DeviceStaging`); ``None``: for a CUDA policy with ``pin_memory``.
    """

    def __init__(
        self,
        policy: torch.nn.Module,
        endpoint: ServerEndpoint,
        config: InferenceServerConfig,
        weight_sync: Any = None,
        collate_fn: Callable[[list], TensorDictBase] | None = None,
        static: StaticBatches | None = None,
        staging: bool | None = None,
    ):
        self.policy = policy
        self.static = static
        self.mode = config.interaction_mode
        self.endpoint = endpoint
        self.config = config
        self.device = torch.device(config.policy_device)
        self.output_device = torch.device(config.output_device or "cpu")
        self.weight_sync = weight_sync
        self.collate = collate_fn or default_collate
        self.version = 0
        self.stats = Stats(config.stats_window)
        self._updates: queue.SimpleQueue = queue.SimpleQueue()
        # A fixed-layout endpoint (see ServerEndpoint.fixed_keys) tells the input keys up front, and which of them
        # must still be dropped from the output (those that are also response keys).
        fixed = getattr(endpoint, "fixed_keys", None)
        self._fixed = None if fixed is None else (frozenset(fixed[0]), tuple(sorted(fixed[0] & fixed[1])))
        self._private = bool(getattr(endpoint, "private_copies", False))  # see ServerEndpoint.private_copies
        self._stamps = bool(getattr(endpoint, "stamps_version", False))  # see ServerEndpoint.stamps_version
        self._versions: dict = {}  # (batch size, device) -> (version, policy_version tensor), for those endpoints
        # fixed-layout batches for a CUDA policy: pinned staging and a persistent device batch (built on the first)
        self._stages = self._fixed is not None and (self.device.type == "cuda" and config.pin_memory
                                                     if staging is None else staging)
        self.staging: DeviceStaging | None = None

    # ------------------------------------------------------------------ weights
    def request_update(self, state: Mapping[str, torch.Tensor], version: int | None) -> Future:
        """Queue an update for the loop to apply between batches; the future holds the new version."""
        done: Future = Future()
        self._updates.put((state, version, done))
        return done

    def apply_updates(self) -> None:
        """Apply the queued weight updates and a newer version the weight sync has (the loop does between
        batches)."""
        before = self.version
        while not self._updates.empty():  # checked first: a get_nowait that raises Empty costs more, every batch
            try:
                state, version, done = self._updates.get_nowait()
            except queue.Empty:
                break
            try:
                copy_weights(self.policy, state)
            except Exception as exc:  # noqa: BLE001 - raised again in the caller of update_weights
                done.set_exception(exc)
                continue
            self.version = self.version + 1 if version is None else int(version)
            done.set_result(self.version)
        if self.weight_sync is not None:
            update = self.weight_sync.poll(self.version, into=self.policy)
            if update is not None:
                self.version = update
        if self.static is not None and self.version != before:
            self.static.check_weights()

    # ------------------------------------------------------------------ serving
    def run(self, stop: threading.Event) -> None:
        """Collect and serve batches until ``stop`` is set, applying weight updates between them.

        On the way out the pending updates are answered and the endpoint fails what is still waiting.
        """
        cfg = self.config
        if self.device.type == "cuda":  # this thread's current device: its streams are the ones copies run on
            torch.cuda.set_device(self.device)
        try:
            with torch.no_grad():  # once for the loop (each forward would otherwise switch grad mode on and off)
                while not stop.is_set():
                    batch = self.endpoint.collect(cfg.max_batch_size, cfg.min_batch_size, cfg.timeout, POLL)
                    # after the wait, not before it: a request sent after a weight push returned is served with
                    # those weights (what sync collection relies on), even if the push came while the loop waited
                    self.apply_updates()
                    if batch is not None:
                        self.serve(batch)
        finally:
            self.apply_updates()  # release anyone waiting on an update
            self.endpoint.close("the server was shut down")

    def serve(self, batch: Batch) -> None:
        """Run the policy on one collected batch and answer its requests.

        Requests that do not stack together are served one by one, so only the bad ones fail.
        """
        started = time.monotonic()
        if batch.stacked is not None:
            self._forward(batch, batch.stacked)
        else:
            try:
                td = self._collate_one(batch.requests) if len(batch) == 1 else None
                if td is None:
                    td = self.collate(batch.requests)
            except Exception:  # mismatched requests: serve each alone so only the bad ones fail
                for i in range(len(batch)):
                    single = Batch([batch.handles[i]], [batch.requests[i]], enqueued=[batch.enqueued[i]])
                    try:
                        self._forward(single, self.collate(single.requests))
                    except Exception as exc:  # noqa: BLE001 - the caller gets it
                        self.endpoint.fail(single, RemoteError.from_exception(exc))
                return
            self._forward(batch, td)
        if self.config.collect_stats:
            self.stats.record(batch, started, time.monotonic() - started)

    def _collate_one(self, requests: list) -> TensorDictBase | None:
        """What the default collate, then the move to the policy device, make of one plain request whose tensors
        are on the policy device already, built directly (stacking and moving a TensorDict of one cost several
        times the copies); ``None`` for anything else (a custom collate_fn, nested or non-tensor entries...)."""
        td = requests[0]
        if self.collate is not default_collate or type(td) is not TensorDict or td.is_locked or td._has_names():
            return None
        device, source = self.device, {}
        for key, value in td.items():
            if type(value) is not torch.Tensor or value.device != device:
                return None
            one = value.unsqueeze(0)
            source[key] = one if self._private else one.clone(memory_format=torch.contiguous_format)  # as stack makes
        return TensorDict._new_unsafe(source, batch_size=torch.Size((1, *td.batch_size)), device=device)

    def _forward(self, batch: Batch, td: TensorDictBase) -> None:
        if torch.is_grad_enabled():
            with torch.no_grad():
                self._forward(batch, td)
            return
        codes = td.get(MODE_KEY, None)
        if codes is None:
            self._forward_in(self.mode, batch, td)
            return
        try:
            groups = modes_of(codes)
        except Exception as exc:  # noqa: BLE001 - stamps that name no mode fail their callers
            self.endpoint.fail(batch, RemoteError.from_exception(exc))
            return
        if len(groups) == 1:
            self._forward_in(groups[0][0] or self.mode, batch, td)
            return
        for mode, rows in groups:  # requests stamped with different modes: each mode's rows in a forward of its own
            index = rows.tolist()
            part = td[rows]
            sub = Batch([batch.handles[i] for i in index], None if batch.requests is None else
                        [batch.requests[i] for i in index], stacked=part if td is batch.stacked else None,
                        enqueued=[batch.enqueued[i] for i in index] if batch.enqueued else [])
            self._forward_in(mode or self.mode, sub, part)

    def _forward_in(self, mode: str, batch: Batch, td: TensorDictBase) -> None:
        """One forward of ``td`` (the rows of ``batch``) in interaction ``mode``, answered."""
        try:
            fixed = self._fixed if td is batch.stacked else None
            keys_in = set(td.keys(True, True)) if fixed is None else fixed[0]
            staging = self._staging_for(td) if fixed is not None else None
            src = staging.load(td) if staging is not None else td.to(self.device) if td.device != self.device else td
            with serving(mode):
                if self.static is not None:
                    self.static.check_mode(mode)
                    out = self.static(src, check_keys=fixed is None)
                else:
                    out = self.policy(src)
            if fixed is not None and out is src:
                # The policy wrote into the batch (the loop's own copy), and the endpoint copies only the response
                # keys back: of the inputs, only those that are also response keys need dropping, and the version
                # tensor is only read, so one per batch size serves until the version changes.
                out, shared_version = (out.exclude(*fixed[1]) if fixed[1] else out), True
            else:  # an endpoint that encodes its answers never hands the version tensor out either
                out, shared_version = (out.exclude(*keys_in) if keys_in else out), self._private
            batch.version = self.version
            if not self._stamps:
                out.set("policy_version", self._version_tensor(out) if shared_version else
                        torch.full(out.batch_size, self.version, dtype=torch.long, device=out.device))
            if out.device != self.output_device:
                out = staging.unload(out) if staging is not None and self.output_device.type == "cpu" else \
                    out.to(self.output_device)
        except Exception as exc:  # noqa: BLE001 - a failing batch fails only its callers
            self.endpoint.fail(batch, RemoteError.from_exception(exc))
            return
        try:
            self.endpoint.reply(batch, out)
        except Exception as exc:  # noqa: BLE001 - answers the endpoint could not write fail their callers, not the loop
            self.endpoint.fail(batch, RemoteError.from_exception(exc))

    def _staging_for(self, td: TensorDictBase) -> DeviceStaging | None:
        """The staging of fixed-layout batches for a CUDA policy (built for the first batch, with the endpoint
        gathering into its pinned buffers from then on), or ``None``."""
        if not self._stages:
            return None
        if self.staging is None:
            from transports.layout import Layout

            rows = self.static.rows if self.static is not None else self.config.max_batch_size
            request = Layout.from_tensordict(td[0])
            same = self.static is not None and {leaf.key for leaf in request} == set(self.static.keys)
            device_batch = self.static.input if same else None  # copied once: straight into the graph's input
            self.staging = DeviceStaging(request, rows, self.device, device_batch)
            self.endpoint.gather_into(self.staging.host_views())
        return self.staging

    def _version_tensor(self, out: TensorDictBase) -> torch.Tensor:
        key = (out.batch_size, out.device)
        cached = self._versions.get(key)
        if cached is None or cached[0] != self.version:
            cached = self._versions[key] = (self.version, torch.full(out.batch_size, self.version, dtype=torch.long,
                                                                     device=out.device))
        return cached[1]
