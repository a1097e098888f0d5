"""What runs where a collector worker lives: one rollout loop over one vector env."""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from transports.kernel.errors import ConfigurationError

from ..envs import NEXT_KEYS, VectorEnvStepper, next_storage
from .handoff import Handoff, RolloutSlots
from ..inference.sampling import SAMPLE_SEED, env_streams, mix, step_seeds


class _Group:
    """Envs of a worker stepped together: one vector env, its columns of the rollout, its reusable request."""

    def __init__(self, stepper: VectorEnvStepper, columns: slice, policy):
        self.stepper, self.columns = stepper, columns
        # the request's observation is the stepper's own array (the env writes it after each answer, never while a
        # request is in flight), its seeds a buffer refilled before each request: built once, sent every step
        self._seed = torch.empty(stepper.num_envs, dtype=torch.int64)
        self.request = TensorDict({"observation": torch.from_numpy(stepper.obs), SAMPLE_SEED: self._seed},
                                  batch_size=[stepper.num_envs], device="cpu")  # on the policy's device: not moved
        self._seed_np = self._seed.numpy()
        # an owner in this thread (a direct server) answers at once: called, without a future per step
        inline = getattr(policy, "inline", False) is True
        self._submit = policy.submit if hasattr(policy, "submit") and not inline else _Immediate.wrapping(policy)

    def ask(self, seeds: np.ndarray):
        """Send the current observations (and this step's sampling seeds, a row of the rollout's) to the policy; a
        future of its answer."""
        self._seed_np[...] = seeds[self.columns]
        return self._submit(self.request)


class _Immediate:
    """The future of a plain callable policy's answer (computed at once)."""

    def __init__(self, value):
        self.value = value

    def result(self, timeout=None):
        return self.value

    @staticmethod
    def wrapping(policy):
        return lambda td: _Immediate(policy(td))


class Worker:
    """Steps its vector envs with ``policy`` and hands back ``[time, env]`` rollouts (or writes them to replay).

    A rollout is written into storage allocated once per rollout (a TensorDict built once, numpy views for the
    per-step writes): no TensorDict, stack or clone per step. With ``env_groups=2`` the worker makes two vector
    envs and keeps one group's policy request in flight while it steps the other, so env stepping overlaps a
    policy served elsewhere (double buffering); the rollout is the same as with one group of all the envs.

    Args:
        create_env_fn: picklable callable returning a vector env with same-step autoreset (called once per group).
        policy: a callable TensorDict policy (an inference client...), or one per group; a policy with ``submit``
            (inference clients and owners) is asked through it, so groups overlap.
        frames: frames per rollout (a multiple of the worker's total env count).
        seed: seeds env ``i`` (over all groups) with ``seed + i``; its policy requests carry sampling seeds from a
            stream keyed by ``seed + i`` too (see `components.inference.sampling`), so its actions depend
            neither on batching nor on the grouping.
        replay_buffer: a replay client; rollouts are written there and `collect` returns the count.
        rollouts_done: rollouts this worker's place in the run made before it started (a resumed run, a restarted
            worker): the sampling streams continue from there, and the envs reset from a seed drawn from ``seed``
            and that count, so they do not replay the run's first episodes.
        env_groups: vector envs (each from ``create_env_fn``) stepped in turn.
        handoff: hand rollouts over through shared memory (`handoff`): for a worker in
            another process of the driver's machine; a `Probe`: when it finds
            this process on the driver's machine.
        prefetch: rollouts in flight, the one the driver asked for included. 1: a rollout starts when the driver
            asks for it; more: a thread of the worker's own collects up to ``prefetch - 1`` beyond the asks
            (`Ahead`), each into a slot of its own.
    """

    def __init__(self, create_env_fn, policy, frames: int, seed: int, replay_buffer=None, rollouts_done: int = 0,
                 env_groups: int = 1, handoff: Any = False, prefetch: int = 1):
        envs = [create_env_fn() for _ in range(env_groups)]
        num_envs = sum(env.num_envs for env in envs)
        if frames % num_envs:
            for env in envs:
                env.close()
            raise ConfigurationError(
                f"frames per worker ({frames}) is not a multiple of the worker's {num_envs} envs",
                path="components.collector",
            )
        policies = list(policy) if isinstance(policy, (list, tuple)) else [policy] * env_groups
        self.steps, self.replay, self.num_envs = frames // num_envs, replay_buffer, num_envs
        first, self.groups = reset_seed(seed, rollouts_done), []
        for env, group_policy in zip(envs, policies):
            start = sum(g.stepper.num_envs for g in self.groups)
            stepper = VectorEnvStepper(env, first + start)
            self.groups.append(_Group(stepper, slice(start, start + stepper.num_envs), group_policy))
        self.stepper = self.groups[0].stepper
        self.streams = env_streams(range(seed, seed + num_envs))
        self.step_count = rollouts_done * self.steps
        self._outputs: list | None = None  # (key, shape of one row, dtype) of what the policy answers
        self.handoff, self.slots = (handoff if isinstance(handoff, bool) else handoff.here()), None
        self.prefetch, self.ahead = prefetch, (Ahead(self._produce, prefetch) if prefetch > 1 else None)
        self._made = 0  # rollouts produced: rollout ``j`` goes into slot ``j % prefetch``
        self._stopping = threading.Event()  # set by close: a rollout collected ahead stops at its next step

    def rollout(self, into: TensorDictBase | None = None) -> TensorDictBase:
        """One rollout, written into ``into`` (a ``[time, env]`` TensorDict of this worker's rollout layout, as a
        `RolloutSlots` slot) or into storage allocated for it."""
        steps, groups = self.steps, self.groups
        seeds = step_seeds(self.streams, self.step_count, steps).numpy()
        self.step_count += steps
        pending = [group.ask(seeds[0]) for group in groups]
        buf = nxt = outputs = None
        for t in range(steps):
            if self._stopping.is_set():
                raise Stopped("the worker is closing")
            for i, group in enumerate(groups):
                out = pending[i].result()
                if buf is None:
                    buf, observation, action, outputs, nxt = self._allocate(out, into)
                index = (t, group.columns)
                observation[index] = group.stepper.obs  # what the policy saw
                for key, array, tensor in outputs:
                    value = out.get(key)
                    if array is not None and value.device.type == "cpu":
                        array[index] = value.numpy()
                    else:  # another device, or a dtype numpy lacks
                        tensor[index].copy_(value)
                group.stepper.step_into(action[index], nxt, index)
                if t + 1 < steps:
                    pending[i] = group.ask(seeds[t + 1])
        return buf

    def _allocate(self, out: TensorDict, into: TensorDictBase | None):
        """Storage for one rollout: the observations, the policy's outputs (as the first answer shows them) and the
        env's ``next``; numpy views of the observations, the actions and ``next``, torch views of the outputs."""
        if self._outputs is None:
            skip = {"observation", SAMPLE_SEED}
            self._outputs = [(key, out.get(key).shape[1:], out.get(key).dtype)
                             for key in out.keys(include_nested=True, leaves_only=True) if key not in skip]
            if "action" not in [key for key, _, _ in self._outputs]:
                raise ValueError(f"the policy answered without an 'action' (keys: {sorted(map(str, out.keys()))})")
        spec, shape = self.stepper.spec, (self.steps, self.num_envs)
        buf = into
        if buf is None:
            buf = TensorDict({"observation": torch.empty((*shape, *spec.observation_shape),
                                                         dtype=spec.observation_dtype),
                              "next": next_storage(spec, shape)}, batch_size=shape)
            for key, row, dtype in self._outputs:
                buf.set(key, torch.empty((*shape, *row), dtype=dtype))
        nxt = {key: buf.get(("next", key)).numpy() for key in NEXT_KEYS}
        outputs = [(key, _numpy(buf.get(key)), buf.get(key)) for key, _, _ in self._outputs]
        return buf, buf.get("observation").numpy(), buf.get("action").numpy(), outputs, nxt

    def collect(self) -> TensorDict | Handoff | int:
        """One rollout (or its `Handoff`), or (with a replay buffer) the number
        of frames written there: the next one collected ahead, if the worker collects ahead."""
        return self._produce() if self.ahead is None else self.ahead.take()

    def _produce(self) -> TensorDict | Handoff | int:
        index = self._made % self.prefetch
        self._made += 1
        if self.replay is not None:
            return len(self.replay.extend(self.rollout().reshape(-1)))
        if not self.handoff:
            return self.rollout()
        if self.slots is None:  # the first rollout shows the layout: the slots are made after it, and travel once
            first = self.rollout()
            self.slots = RolloutSlots(first, self.prefetch)
            self.slots.slot(0).update_(first)
            return Handoff(0, self.slots)
        # the driver copied out the rollout this slot held before it asked for the one after it (see Ahead)
        self.rollout(into=self.slots.slot(index))
        return Handoff(index)

    def spec(self):
        """The environment's `EnvSpec`."""
        return self.stepper.spec

    def close(self) -> None:
        """Stop collecting ahead, close every env group's environments and the rollout slots."""
        self._stopping.set()
        if self.ahead is not None:
            self.ahead.close()
        for group in self.groups:
            group.stepper.close()
        if self.slots is not None:
            self.slots.close()


class Stopped(RuntimeError):
    """A rollout collected ahead, cut short because its worker is closing."""


class Ahead:
    """Rollouts a worker collects on a thread of its own ahead of the driver's asks: ``depth`` in flight, the one
    asked for included.

    The driver asks for rollout ``n`` only after it copied out rollout ``n - 1``; so when ask ``n`` (counted from 1)
    has come, rollouts ``0 .. n - 2`` are out of their slots, and rollout ``j`` may go into slot ``j % depth`` as soon
    as ``j <= n - 2 + depth``. The thread starts with the first ask (the driver has pushed its first weights by
    then). A rollout that raised ends the thread: that ask, and every later one, raises its error.

    Args:
        produce: collects the next rollout (into its slot) and returns what the ask answers.
        depth: rollouts in flight (the worker's ``prefetch``, its number of slots).
    """

    def __init__(self, produce: Callable[[], Any], depth: int):
        self.produce, self.depth = produce, depth
        self._cond = threading.Condition()
        self._ready: collections.deque = collections.deque()
        self.asked = self.made = 0
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="collect-ahead", daemon=True)

    def take(self) -> Any:
        """The next rollout, once collected."""
        with self._cond:
            self.asked += 1
            if self.asked == 1:
                self._thread.start()
            self._cond.notify_all()
            self._cond.wait_for(lambda: self._ready or self._error is not None or self._closed)
            if self._ready:
                return self._ready.popleft()
            raise self._error if self._error is not None else Stopped("the worker is closing")

    def _loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self.made <= self.asked - 2 + self.depth)
                if self._closed:
                    return
            try:
                value = self.produce()
            except BaseException as exc:  # noqa: BLE001 - the ask that waits for this rollout raises it
                with self._cond:
                    self._error = exc
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready.append(value)
                self.made += 1
                self._cond.notify_all()

    def close(self, timeout: float = 10.0) -> None:
        """Stop collecting ahead (the worker's ``close`` has already cut short a rollout in progress)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout)


def _numpy(tensor: torch.Tensor):
    try:
        return tensor.numpy()
    except (TypeError, RuntimeError):  # bfloat16 and other dtypes numpy has no view of
        return None


def reset_seed(seed: int, rollouts_done: int) -> int:
    """The seed a worker's envs reset from: ``seed`` on a fresh start, else one drawn from ``seed`` and the rollouts
    done (non-negative, as gymnasium wants)."""
    if not rollouts_done:
        return seed
    return int(mix(mix(torch.tensor(seed, dtype=torch.int64)) + rollouts_done)) & 0x7FFFFFFF
