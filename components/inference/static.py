"""Static batches: every forward at one fixed size, replayed from a captured CUDA graph
(``components.inference.static_batch_size``).

A replay runs the whole forward with one launch, so the Python dispatch and the kernel launches of each layer are
paid once, at capture. The graph reads its input from one persistent batch of ``rows`` rows: a batch of ``n`` rows
fills the first ``n``; the rest are copies of the batch's last request, whose answers are dropped. What the capture
fixed holds for as long as the graph serves:

- the input keys: every request must bring each of them (a missing key would leave the previous batch's values in
  the graph's input: checked on the first request, and on every batch of a transport without a fixed layout);
- the interaction mode (`components.inference.modes`): requests stamped with another are refused;
- the policy's tensors: weight updates copy into them in place, which the graph sees. An update that replaces them
  (a new storage: a module moved, parameters reassigned) leaves the graph reading the old ones: it is given up, the
  server says so once in its log and serves eagerly from then on.

``capture`` is `cuda_graph` on a CUDA device; any callable ``(policy, example, keys) -> callable`` stands in
for it (tests on machines without CUDA run the same padding and checks with the eager policy).
"""

from __future__ import annotations

import logging
from typing import Callable

import torch
from tensordict import TensorDictBase

from transports.layout import Layout

from .modes import MODE_KEY, serving

log = logging.getLogger(__name__)

WARMUP = 3
"""Forwards on a side stream before the capture (cuDNN and cuBLAS pick their kernels and workspaces there)."""


def cuda_graph(policy: torch.nn.Module, example: TensorDictBase, keys: list) -> Callable:
    """Capture ``policy`` on ``example`` as a CUDA graph (`tensordict.nn.CudaGraphModule`): warm-up forwards,
    then the capture, done here (on the caller's thread, before the server takes requests).

    Returns:
        The callable that copies a batch into the graph's input and replays it.
    """
    from tensordict.nn import CudaGraphModule

    graph = CudaGraphModule(policy, warmup=WARMUP, in_keys=list(keys), device=example.device)
    with torch.no_grad():
        for _ in range(WARMUP + 1):  # the last call records the graph
            graph(example)
    torch.cuda.synchronize(example.device)
    return graph


def eager(policy: torch.nn.Module, example: TensorDictBase, keys: list) -> Callable:
    """The policy itself, in place of a graph: the padding, checks and fallbacks of static batches without CUDA."""
    return policy


def tensor_pointers(module: torch.nn.Module) -> tuple:
    """Where each parameter and buffer of ``module`` lives: what a captured graph reads."""
    return tuple(t.data_ptr() for t in (*module.parameters(), *module.buffers()))


class StaticBatches:
    """Serves batches of up to ``rows`` requests as forwards of exactly ``rows`` rows.

    Args:
        policy: the policy (on ``device``).
        request: the layout of one request.
        rows: the static batch size.
        device: the policy device.
        mode: the interaction mode the graph is captured in.
        capture: builds the graph (`cuda_graph`, or `eager` as a stand-in).
    """

    def __init__(self, policy: torch.nn.Module, request: Layout, rows: int, device: torch.device | str, mode: str,
                 capture: Callable = cuda_graph):
        self.policy = policy
        self.rows = rows
        self.mode = mode
        self.keys = [leaf.key for leaf in request if leaf.key != (MODE_KEY,)]
        self._key_set = frozenset(k[0] if len(k) == 1 else k for k in self.keys)
        self.input = request.zeros(rows).to(device)
        if (MODE_KEY,) in request.keys:
            self.input = self.input.exclude(MODE_KEY)
        self._capture = capture
        self.graph: Callable | None = None
        self.given_up: str | None = None  # why the graph was given up
        self._pointers: tuple = ()
        self._checked = False

    def capture(self) -> None:
        """Warm up and capture the graph on the (zero) input batch, in the graph's mode."""
        with torch.no_grad(), serving(self.mode):
            self.graph = self._capture(self.policy, self.input, self.keys)
        self._pointers = tensor_pointers(self.policy)
        log.info("inference: forwards of %d rows captured (%s) in interaction mode %s", self.rows,
                 getattr(self._capture, "__name__", "graph"), self.mode)

    def check_weights(self) -> None:
        """After a weight update: give the graph up if the update replaced the policy's tensors."""
        if self.graph is None or tensor_pointers(self.policy) == self._pointers:
            return
        self.graph = None
        self.given_up = ("a weight update replaced the policy's tensors (not an in-place copy), which the captured "
                         "graph would no longer read")
        log.warning("inference: CUDA graph given up, serving eagerly from now on: %s", self.given_up)

    def check_keys(self, td: TensorDictBase) -> None:
        """Refuse a batch that lacks one of the captured input keys.

        Raises:
            KeyError: naming the missing keys and what the graph was captured with.
        """
        missing = self._key_set - set(td.keys(True, True))
        if missing:
            raise KeyError(f"this request lacks {sorted(map(str, missing))}, captured as inputs of the server's CUDA "
                           f"graph (static_batch_size={self.rows}, input keys {sorted(map(str, self._key_set))}): "
                           "every request must bring each of them")

    def check_mode(self, mode: str | None) -> None:
        """Refuse requests stamped with a mode other than the graph's (unstamped ones are served in it).

        Raises:
            ValueError: naming both modes.
        """
        if mode is not None and mode != self.mode and self.graph is not None:
            raise ValueError(f"this request is stamped interaction mode {mode!r}, and the server's CUDA graph was "
                             f"captured in {self.mode!r} (components.inference.interaction_mode): send it to a server "
                             "in that mode, or to one without static_batch_size")

    def __call__(self, src: TensorDictBase, check_keys: bool) -> TensorDictBase:
        """The policy's answers for the ``n`` rows of ``src`` (on the device), from one forward of ``rows`` rows.

        Args:
            src: the batch, on the policy device; may be the first ``n`` rows of `input` already.
            check_keys: check the batch's keys (always done on the first batch).
        """
        if self.graph is None:
            return self.policy(src)
        if check_keys or not self._checked:
            self.check_keys(src)
            self._checked = True
        n = src.batch_size[0]
        rows = self.input
        for key in self.keys:
            buffer = rows.get(key)
            value = src.get(key)
            if value.data_ptr() != buffer.data_ptr():
                buffer[:n].copy_(value)
            if n < self.rows:  # pad rows: the last request again, its answers dropped below
                buffer[n:].copy_(buffer[n - 1 : n].expand_as(buffer[n:]))
        return self.graph(rows)[:n]
