"""What a recipe is: a config dataclass, a policy factory, the services it needs, and ``run``; and what every ``run``
does around its training loop (`Loop`).

A recipe never starts, stops or chooses anything about placement or transport: the launcher reads its
`Recipe` declaration, builds the services, and calls ``run(config, clients)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol


class Progress(Protocol):
    """A live progress display the launcher hands to recipes."""

    def update(self, frames: int, **metrics: float) -> None:
        """Show ``frames`` collected so far and the latest ``metrics``."""


class Checkpoint(Protocol):
    """What a recipe calls on the run's checkpoint (the launcher's `launcher.checkpointing.Checkpoint`)."""

    def restore(self) -> Any | None:
        """The recipe's state as it was saved, or ``None`` for a fresh start."""

    def step(self, frames: int, state: Callable[[], Any], *, policy_version: int | None = None) -> bool:
        """A batch boundary: keep a copy of ``state()`` (written every so many frames).

        Args:
            frames: frames collected so far.
            state: returns the recipe's state (tensors and plain data).
            policy_version: the weight-sync version of the weights in ``state``.

        Returns:
            Whether a checkpoint was written.
        """


class NoCheckpoint:
    """The checkpoint of a recipe run without the launcher: it restores nothing and never writes."""

    def restore(self) -> None:
        """Always ``None``: a fresh start."""
        return None

    def step(self, frames: int, state: Callable[[], Any], *, policy_version: int | None = None) -> bool:
        """Never writes.

        Returns:
            ``False``.
        """
        return False


@dataclass
class Clients:
    """Everything a recipe gets: clients of the running services and the facts it needs.

    Attributes:
        policy: the inference client: a callable TensorDict policy (``observation`` -> ``action``, ...).
        collector: iterable of ``[time, env]`` batches collected with ``policy``.
        replay: the replay-buffer client (``extend``, ``sample``, ``len``...).
        logger: the logger client (``log_scalar``, ``log_metrics``, ``log_hparams``).
        weight_sync: the weight-sync client (``push``), wired to the inference server.
        env_spec: the environment's spaces as data (`components.envs.EnvSpec`).
        progress: the live progress line.
        seed: the run's seed.
        checkpoint: the run's `Checkpoint`: ``restore()`` once, ``step(...)`` after each batch. The default
            (`NoCheckpoint`) never saves and restores nothing.
    """

    policy: Callable
    collector: Iterable
    replay: Any
    logger: Any
    weight_sync: Any
    env_spec: Any
    progress: Progress
    seed: int = 0
    checkpoint: Checkpoint = field(default_factory=NoCheckpoint)


@dataclass(frozen=True)
class Recipe:
    """A recipe's declaration.

    Attributes:
        name: the recipe's name (``conf/recipe/<name>.yaml``).
        config: its config dataclass (every field documented).
        make_policy: ``make_policy(config, env_spec) -> nn.Module``, the behaviour policy the inference
            server owns (built where the server lives).
        services: ``services(config, env_spec) -> {component: options}``: what the recipe needs of each service
            (collector frames per batch, replay capacity and sampler...).
        run: ``run(config, clients) -> dict`` trains and returns the result (see `result`). It pushes its
            (initial or restored) weights once before training; a resumed run's weight sync counts that push as the
            checkpoint's own version, so versions go on with no gap.

    The services it needs are its config's (`needs_of`), so the launcher checks where they go before it
    imports the recipe's module (torch).
    """

    name: str
    config: type
    make_policy: Callable
    services: Callable[[Any, Any], Mapping[str, Mapping[str, Any]]]
    run: Callable[[Any, Clients], Mapping[str, Any]]

    @property
    def needs(self) -> tuple[str, ...]:
        """The services it needs (`needs_of` its config class)."""
        return needs_of(self.config)


EVERY_SERVICE = ("logger", "weight_sync", "replay", "inference", "collector")
"""What a recipe needs unless its config class says otherwise (a class attribute ``needs``)."""


def needs_of(config_type: type) -> tuple[str, ...]:
    """The services a recipe with this config class needs, read from the torch-free config class alone."""
    return tuple(getattr(config_type, "needs", EVERY_SERVICE))


class EpisodeStats:
    """Bookkeeping every recipe shares: frames, finished episodes, the recent mean return, the learning curve.

    Args:
        window: how many recent episodes the mean return covers.
    """

    def __init__(self, window: int):
        import collections
        import time

        self._clock = time.perf_counter
        self.window = window
        self.returns: collections.deque = collections.deque(maxlen=window)
        self.curve: list[tuple[int, float]] = []
        self.frames = 0
        self.episodes = 0
        self.solved_at: int | None = None
        self.start = self._clock()
        self._batches = 0
        self._second: tuple[float, int] = (0.0, 0)  # (clock, frames) when the second batch was counted
        self._latest: tuple[float, int] = (0.0, 0)  # and when the latest was

    def update(self, batch) -> float:
        """Count a collected ``[time, env]`` batch; returns the mean return of the recent episodes."""
        self.frames += batch.numel()
        self._batches += 1
        self._latest = (self._clock(), self.frames)
        if self._batches == 2:  # the start is behind: the first batch collected and learned from
            self._second = self._latest
        finished = batch["next", "episode_return"][batch["next", "done"]].tolist()
        self.returns.extend(finished)
        self.episodes += len(finished)
        if self.returns:
            self.curve.append((self.frames, self.mean_return))
        return self.mean_return

    @property
    def mean_return(self) -> float:
        """The mean return of the recent episodes (NaN before the first)."""
        return sum(self.returns) / len(self.returns) if self.returns else float("nan")

    @property
    def fps(self) -> float:
        """Frames per second since the start (training time only, on a resumed run)."""
        elapsed = self._clock() - self.start
        return self.frames / elapsed if elapsed > 0 else 0.0

    def state_dict(self) -> dict:
        """What a checkpoint keeps: frames, episodes, the recent returns, the curve, the solving frame, and the
        seconds spent so far (a resumed run's frames/s counts only time spent training)."""
        return {"frames": self.frames, "episodes": self.episodes, "returns": list(self.returns),
                "curve": [list(point) for point in self.curve], "solved_at": self.solved_at,
                "elapsed": self._clock() - self.start}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from `state_dict`'s values."""
        self.frames, self.episodes, self.solved_at = int(state["frames"]), int(state["episodes"]), state["solved_at"]
        self.returns.clear()
        self.returns.extend(state["returns"])
        self.curve = [(int(f), float(r)) for f, r in state["curve"]]
        self.start = self._clock() - float(state["elapsed"])

    def reached(self, target: float | None) -> bool:
        """Whether a full window of episodes averages at least ``target`` (recorded as the solving frame)."""
        if target is not None and len(self.returns) >= self.window and self.mean_return >= target:
            self.solved_at = self.frames
            return True
        return False

    def result(self) -> dict:
        """What ``run`` returns: frames, wall seconds, frames/s, episodes, final mean return, solved, curve.

        ``fps`` counts the whole run; ``steady_fps`` the rate between the second batch counted and the last, once
        the first was collected (which nothing overlaps) and learned from (torch's first passes warm up): whole
        rounds of learning from a batch and collecting the next, the rate of a longer run, as ``benchmarks/``
        compare it with a peer's rate after its first training iteration. ``None`` before a third batch; a resumed
        run's counts from its second batch after the resume."""
        elapsed = self._clock() - self.start
        (t0, f0), (t1, f1) = self._second, self._latest
        steady = (f1 - f0) / (t1 - t0) if self._batches > 2 and t1 > t0 else None
        return {
            "frames": self.frames,
            "wall_seconds": elapsed,
            "fps": self.frames / elapsed if elapsed else 0.0,
            "steady_fps": steady,
            "episodes": self.episodes,
            "final_mean_return": self.mean_return,
            "solved": self.solved_at is not None,
            "solved_at_frames": self.solved_at,
            "curve": self.curve,
        }


def host_values(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """``metrics`` with each value that is a one-element tensor read as a Python float: those of one device stacked
    and read in one copy (one wait for a CUDA device per batch logged, not one per value), the rest as they are.

    Args:
        metrics: values by name: numbers, or one-element tensors anywhere (a learner's losses, kept on its device).
    """
    import torch

    out = dict(metrics)
    by_device: dict[Any, list[str]] = {}
    for name, value in out.items():
        if isinstance(value, torch.Tensor):
            by_device.setdefault(value.device, []).append(name)
    for names in by_device.values():
        read = torch.stack([out[n].detach().reshape(()).double() for n in names]).tolist()
        out.update(zip(names, read))
    return out


RESERVED = ("stats", "rng")
"""Names the checkpoint keeps for `Loop` itself: the episode statistics and torch's generator."""


class Loop:
    """What every recipe does around its training loop, so that ``run`` holds the algorithm only.

    Built first (it seeds torch's generator, which the networks are then built from); `start` restores a
    resumed run, pushes the first weights and logs the hyperparameters; `batches` counts every collected batch
    (frames, episodes, the recent mean return: `stats`); `end_batch` logs, shows progress, keeps the
    checkpoint's snapshot and says whether training is done; `result` is what ``run`` returns.

    Args:
        cfg: the recipe's config (a `RecipeConfig`: ``window``, ``target_return`` and
            ``total_frames`` are read).
        clients: the run's clients.

    Examples:
        >>> loop = Loop(cfg, clients)
        >>> net = make_net(cfg, clients.env_spec)
        >>> optimizer = torch.optim.Adam(net.parameters())
        >>> updates = loop.start(net, net=net, optimizer=optimizer).get("updates", 0)
        >>> for batch in loop.batches():
        ...     updates += learn(batch)
        ...     loop.push(net)
        ...     if loop.end_batch({"train/mean_return": loop.stats.mean_return}, updates=updates):
        ...         break
        >>> return loop.result()
    """

    def __init__(self, cfg: Any, clients: Clients):
        import torch

        torch.manual_seed(clients.seed)
        self.cfg, self.clients = cfg, clients
        self.stats = EpisodeStats(cfg.window)
        self.version = 0
        self._kept: dict[str, Any] = {}

    def start(self, policy: Any, /, **kept: Any) -> dict:
        """Restore a resumed run's state, push ``policy`` (the inference server starts from the learner's initial
        or restored weights) and log the config as the run's hyperparameters.

        Args:
            policy: the module weight sync publishes.
            **kept: what the checkpoint keeps by name: objects with ``state_dict`` and ``load_state_dict``
                (modules, optimizers); ``None`` is left out.

        Returns:
            The values the resumed run last gave `end_batch` (counters, a pending tail...), by name; empty
            for a fresh start.

        Raises:
            ValueError: a kept object named like what the loop keeps itself (`RESERVED`).
        """
        import torch

        if clash := sorted(set(kept) & set(RESERVED)):
            raise ValueError(f"Loop.start: {', '.join(clash)} name what the checkpoint keeps for the loop itself (the "
                             "episode statistics, torch's generator): keep your objects under other names")
        self._kept = {name: obj for name, obj in kept.items() if obj is not None}
        self.stats = EpisodeStats(self.cfg.window)  # its clock starts with training, once the networks are built
        restored = self.clients.checkpoint.restore()  # None for a fresh start
        values: dict = {}
        if restored is not None:
            for name, obj in self._kept.items():
                obj.load_state_dict(restored[name])  # onto the object's device
            self.stats.load_state_dict(restored["stats"])
            torch.set_rng_state(restored["rng"])
            values = {k: v for k, v in restored.items() if k not in self._kept and k not in ("stats", "rng")}
        self.push(policy)
        self.clients.logger.log_hparams({k: getattr(self.cfg, k) for k in self.cfg.__dataclass_fields__})
        return values

    def batches(self) -> Iterator[Any]:
        """The collector's batches, each counted in `stats` before it is handed over."""
        for batch in self.clients.collector:
            self.stats.update(batch)
            yield batch

    def push(self, policy: Any) -> int:
        """Publish ``policy``'s weights through weight sync; their version (also `version`)."""
        self.version = self.clients.weight_sync.push(policy)
        return self.version

    def end_batch(self, metrics: Mapping[str, Any] | None, /, *, progress: Mapping[str, float] | None = None,
                  **values: Any) -> bool:
        """A batch boundary: log ``metrics`` at the frames collected so far (``None``: nothing this batch), update
        the progress line, and keep the checkpoint's snapshot of the kept objects, the episode statistics, torch's
        generator and ``values``.

        Args:
            metrics: the batch's metrics, or ``None``; values that are tensors (on the learner's device) are read
                here, in one copy to the host per device (`host_values`).
            progress: more figures for the progress line beside the mean return.
            **values: tensors and plain data the checkpoint keeps beside the objects (counters, a pending tail),
                handed back by `start` when the run resumes.

        Returns:
            Whether training is done: ``target_return`` reached or ``total_frames`` spent.

        Raises:
            ValueError: a value named like a kept object or like what the loop keeps itself (`RESERVED`): it
                would overwrite it in the checkpoint.
        """
        import torch

        if clash := sorted(set(values) & {*RESERVED, *self._kept}):
            raise ValueError(f"Loop.end_batch: values named {', '.join(clash)} would overwrite what the checkpoint "
                             "keeps under those names: give them other names")
        frames = self.stats.frames
        if metrics is not None:
            self.clients.logger.log_metrics(host_values(metrics), step=frames)
        self.clients.progress.update(frames, mean_return=self.stats.mean_return, **(progress or {}))
        done = self.stats.reached(self.cfg.target_return) or frames >= self.cfg.total_frames

        def state() -> dict:  # read only when the checkpoint keeps a snapshot
            return {**{name: obj.state_dict() for name, obj in self._kept.items()}, "stats": self.stats.state_dict(),
                    "rng": torch.get_rng_state(), **values}

        self.clients.checkpoint.step(frames, state, policy_version=self.version)
        return done

    def result(self) -> dict:
        """What ``run`` returns (`EpisodeStats.result`)."""
        return self.stats.result()

