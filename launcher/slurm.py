"""A Slurm job's resources, from the plan it runs: what ``hydra/launcher=slurm`` asks ``sbatch`` for.

One job runs one whole plan: the driver (it runs the recipe, the learner) and every owner the plan places on its
machine. `job_resources` counts, for one composed config and its `LaunchPlan`:

- ``cpus_per_task``: the driver's ``launcher.torch_threads``; owners in the driver's process (``direct``,
  ``thread``) share those. Every other host on the job's machine is a process of its own (``process`` and
  ``distributed``; ``ray`` actors when the job starts its own local Ray cluster, i.e. ``ray.address`` is unset;
  one per collector worker) and takes its ``resources.num_cpus``, or 1 when unset. Actors of a joined cluster
  (``ray.address``) run on that cluster's machines and count nothing. The sum, rounded up.
- ``gpus_per_node``: the sum of those hosts' ``resources.num_gpus``, rounded up, and at least one more than the
  highest index a ``cuda`` device option of the learner or of those owners names (``recipe.device=cuda`` and
  ``policy_device: cuda`` need one).
- ``mem_gb``: 0.6 GB for the driver, each host's ``process_memory_gb`` per process of its own (process and
  distributed 0.35, Ray actors 0.45), what each placement starts besides (the forkserver 0.35, a local Ray
  cluster's daemons 0.6), all measured on CartPole runs and rounded up; plus the replay buffer's capacity times a
  row's bytes estimated from the plan's layouts (twice the observation, the policy's outputs, 16 bytes). The sum,
  rounded up to whole GB.
- ``tasks_per_node``: 1 (the driver starts everything else itself).

``timeout_min`` is not derived: a plan does not say how long training takes. The dry run prints the line
(`JobResources.line`); `submission_parameters` fills the ones a sweep's launcher leaves unset with the
largest over the sweep's jobs (submitit submits one array with one set of parameters) and refuses, before
anything is submitted, a job that no node of the partition can hold (`partition_nodes` reads ``sinfo``).
"""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from omegaconf import DictConfig

from components.config import device_options
from components.hosts.submitit import SlurmUnavailable, sinfo
from transports.kernel.errors import ConfigurationError, NotImplementedYetError

DRIVER_MEMORY_GB = 0.6
"""``python -m launcher`` with torch imported, training CartPole with PPO or DQN: 0.34-0.40 GB peak RSS measured."""
ROW_EXTRA_BYTES = 16
"""A replay row beside its observation, next observation and the policy's outputs: reward, done flags, a discount."""
DERIVED = ("cpus_per_task", "mem_gb", "gpus_per_node")
"""The launcher fields a plan sizes where they are unset (``tasks_per_node`` is 1 by the plugin's default)."""


@dataclass(frozen=True)
class JobResources:
    """What one job running a plan needs from its node.

    Attributes:
        cpus_per_task: CPUs for the one task.
        mem_gb: memory, in GB.
        gpus_per_node: GPUs.
        tasks_per_node: always 1.
        why: how each number was counted, by field name (for messages).

    Examples:
        >>> JobResources(2, 1, 0).line()
        'slurm job: cpus_per_task=2 mem_gb=1 gpus_per_node=0 tasks_per_node=1 (from the plan)'
    """

    cpus_per_task: int
    mem_gb: int
    gpus_per_node: int
    tasks_per_node: int = 1
    why: Mapping[str, str] = field(default_factory=dict, compare=False)

    def line(self, note: str = "from the plan") -> str:
        """The line the dry run prints under the plan."""
        return (f"slurm job: cpus_per_task={self.cpus_per_task} mem_gb={self.mem_gb} gpus_per_node="
                f"{self.gpus_per_node} tasks_per_node={self.tasks_per_node} ({note})")

    @classmethod
    def largest(cls, jobs: Iterable["JobResources"]) -> "JobResources":
        """Each field's largest value over ``jobs`` (and how the job with it counted it)."""
        jobs = list(jobs)
        top = {name: max(jobs, key=lambda job: getattr(job, name)) for name in (*DERIVED, "tasks_per_node")}
        return cls(**{name: getattr(job, name) for name, job in top.items()},
                   why={name: job.why.get(name, "") for name, job in top.items()})


def _device_count(value: Any) -> int:
    """GPUs a device option needs on the node: ``cuda`` 1, ``cuda:2`` 3, anything else 0."""
    match = re.fullmatch(r"cuda(?::(\d+))?", str(value).strip())
    return 0 if match is None else int(match[1] or 0) + 1


def _row_bytes(plan) -> int | None:
    """A replay row's bytes, estimated from the plan's request/response layouts (per environment): twice the
    request (observation and next observation), the response (action, log-prob...) and ``ROW_EXTRA_BYTES``."""
    for c in plan.components:
        request, response = c.layouts.get("request"), c.layouts.get("response")
        if request is not None and response is not None:
            per_env = [layout.nbytes // max(1, math.prod(layout.batch_size)) for layout in (request, response)]
            return 2 * per_env[0] + per_env[1] + ROW_EXTRA_BYTES
    return None


def job_resources(plan) -> JobResources:
    """What a job running ``plan`` needs: see the module's docstring for the rules.

    Args:
        plan: the `LaunchPlan` (its components, ``launcher.torch_threads`` and each placement's
            session settings, ``ray.*``).
    """
    threads = int(plan.launcher.torch_threads)
    cpus, gpus, memory, device_gpus = float(threads), 0.0, DRIVER_MEMORY_GB, 0
    cpu_parts, mem_parts, gpu_parts = [f"the driver {threads}"], [f"the driver {DRIVER_MEMORY_GB:g} GB"], []
    # What each placement starts besides its targets, counted once per function: process and distributed share one
    # forkserver (and one session_memory_gb).
    sessions: dict[Any, tuple[str, float]] = {}
    for c in plan.components:
        try:
            host = c.host
        except NotImplementedYetError:  # a placement without a host cannot run: nothing to count
            continue
        settings = plan.sessions.get(c.placement, {})
        if not host.on_run_machine(settings):
            continue
        n = int(c.options.get("num_collectors", 1))  # one host per worker
        each = "" if n == 1 else f"{n} x "
        devices = device_options(c.config, c.name) if c.config is not None else []
        if c.options.get("local_policy") and plan.replica is not None:  # the policy runs in the collector's workers
            devices += device_options(plan.replica, "inference")
        device_gpus = max([device_gpus, *(_device_count(v) for _, v in devices)])
        if c.resources.num_gpus:
            gpus += n * c.resources.num_gpus
            gpu_parts.append(f"{c.name} {each}{c.resources.num_gpus:g}")
        if host.same_process:
            continue
        cpu = 1.0 if c.resources.num_cpus is None else float(c.resources.num_cpus)
        cpus += n * cpu
        memory += n * host.process_memory_gb
        cpu_parts.append(f"{c.name} {each}{cpu:g}")
        mem_parts.append(f"{c.name} {each}{host.process_memory_gb:g} GB")
        sessions[host.session_memory_gb.__func__] = (c.placement, host.session_memory_gb(settings))
    for placement, gb in sessions.values():
        if gb:
            memory += gb
            mem_parts.append(f"the {placement} placement's own processes {gb:g} GB")
    row, capacity = _row_bytes(plan), max((int(c.options.get("capacity") or 0) for c in plan.components), default=0)
    if capacity and row:
        memory += capacity * row / 1e9
        mem_parts.append(f"replay {capacity:,} rows x {row} bytes")
    if plan.recipe_config is not None:  # the learner, in the driver
        device_gpus = max([device_gpus, *(_device_count(v) for _, v in device_options(plan.recipe_config, "recipe"))])
    if device_gpus > gpus:
        gpu_parts.append(f"a cuda device option needs {device_gpus}")
    return JobResources(
        cpus_per_task=max(1, math.ceil(cpus - 1e-9)), mem_gb=max(1, math.ceil(memory - 1e-9)),
        gpus_per_node=max(math.ceil(gpus - 1e-9), device_gpus),
        why={"cpus_per_task": " + ".join(cpu_parts), "mem_gb": " + ".join(mem_parts),
             "gpus_per_node": " + ".join(gpu_parts) or "no owner asks for one"},
    )


def own_jobs(plan) -> list[str]:
    """One line per component whose hosts are batch jobs of their own (collectors on ``submitit``): what each job
    asks for. Those jobs are not part of the run's own job (their hosts are not on the run's machine)."""
    lines = []
    for c in plan.components:
        try:
            host = c.host
        except NotImplementedYetError:
            continue
        said = host.own_jobs(plan.sessions.get(c.placement, {}), c.resources, int(c.options.get("num_collectors", 1)))
        if said:
            lines.append(f"{c.name} jobs: {said}")
    return lines


# ---------------------------------------------------------------------------------------------- the partition
@dataclass(frozen=True)
class Node:
    """One kind of node of a partition, as ``sinfo`` reports it."""

    cpus: int
    memory_mb: int
    gpus: int = 0

    def describe(self) -> str:
        return f"{self.cpus} CPUs, {self.memory_mb:,} MB of memory and {self.gpus} GPUs"


def _number(text: str) -> int:
    match = re.match(r"\d+", text.strip())
    return int(match[0]) if match else 0


def partition_nodes(partition: str | None, run: Callable[..., Any] = subprocess.run) -> tuple[str, list[Node]]:
    """The partition's name (the default one for ``None``) and the sizes of its nodes, from ``sinfo``.

    Raises:
        SlurmUnavailable: ``sinfo`` is not installed or does not answer.
        ConfigurationError: no such partition, or no default one (``hydra.launcher.partition``).
    """
    rows = [line.split("|") for line in sinfo("%P|%c|%m|%G", run).splitlines() if line.count("|") == 3]
    names = sorted({row[0].rstrip("*") for row in rows})
    if partition is None:
        rows = [row for row in rows if row[0].endswith("*")]
        if not rows:
            raise ConfigurationError("the cluster has no default partition: choose one",
                                     path="hydra.launcher.partition", alternatives=tuple(names))
        partition = rows[0][0].rstrip("*")
    rows = [row for row in rows if row[0].rstrip("*") == partition]
    if not rows:
        raise ConfigurationError(f"sinfo lists no partition {partition!r}", path="hydra.launcher.partition",
                                 alternatives=tuple(names))
    gpus = [sum(int(n) for n in re.findall(r"gpu(?::[^:,(]+)?:(\d+)", row[3])) for row in rows]
    return partition, [Node(_number(row[1]), _number(row[2]), g) for row, g in zip(rows, gpus)]


_HINTS = {
    "cpus_per_task": ("CPUs", "run fewer owners in processes of their own (service=thread, fewer components."
                              "collector.num_collectors, smaller resources.num_cpus or launcher.torch_threads)"),
    "mem_gb": ("GB of memory", "run fewer owners in processes of their own, or a smaller replay"),
    "gpus_per_node": ("GPUs", "ask for fewer (resources.num_gpus, policy_device)"),
}


def check_fits(asked: Mapping[str, int], needs: JobResources, partition: str, nodes: list[Node],
               user_set: Iterable[str] = ()) -> None:
    """Raise unless one node of ``partition`` holds the job's CPUs, memory and GPUs.

    Args:
        asked: what the job asks for, by launcher field (the user's values where set, else the derived ones).
        needs: what the plan needs (for the message).
        partition: the partition's name; ``nodes``: its kinds of node.
        user_set: the fields the user set (``hydra.launcher.<field>``): the message then names that setting.

    Raises:
        ConfigurationError: the numbers: what the job asks for (and why), what a node has, which setting to change.
    """
    def has(node: Node) -> dict[str, float]:
        return {"cpus_per_task": node.cpus, "mem_gb": node.memory_mb / 1024, "gpus_per_node": node.gpus}

    if any(all(asked[name] <= value for name, value in has(node).items()) for node in nodes):
        return
    biggest = max(nodes, key=lambda node: (node.cpus, node.memory_mb, node.gpus))
    kinds = sorted({node.describe() for node in nodes})
    sizes = f" (its nodes: {' or '.join(kinds)})" if len(kinds) > 1 else ""
    for name, value in has(biggest).items():
        if asked[name] <= value:
            continue
        unit, hint = _HINTS[name]
        have = f"{value:.1f}" if name == "mem_gb" else f"{value:g}"
        if name in set(user_set):
            text = (f"hydra.launcher.{name}={asked[name]} is more than a node of partition {partition!r} has "
                    f"({have} {unit}{sizes}): lower it, or choose a partition with larger nodes "
                    "(hydra.launcher.partition)")
        else:
            why = f" ({needs.why[name]})" if needs.why.get(name) else ""
            text = (f"the plan needs {name}={asked[name]}{why}, but a node of partition "
                    f"{partition!r} has {have} {unit}{sizes}: {hint}, or choose a partition with larger nodes "
                    "(hydra.launcher.partition)")
        raise ConfigurationError(text, path=f"hydra.launcher.{name}")
    raise ConfigurationError(f"no node of partition {partition!r} has cpus_per_task={asked['cpus_per_task']}, "
                             f"mem_gb={asked['mem_gb']} and gpus_per_node={asked['gpus_per_node']} at once{sizes}",
                             path="hydra.launcher.partition")


# ---------------------------------------------------------------------------------------------- the submission
def submission_parameters(params: Mapping[str, Any], configs: list[DictConfig], *, say: Callable[[str], None] = print,
                          run: Callable[..., Any] = subprocess.run) -> dict:
    """The launcher's parameters for a sweep's jobs: ``cpus_per_task``, ``mem_gb`` and ``gpus_per_node`` where
    they are unset, from the largest needs over the jobs' plans; checked against the partition's nodes. Says the
    line it submits with (and, without ``sinfo``, that the job was not checked).

    Args:
        params: the launcher's parameters (``hydra.launcher.*``, as the plugin holds them).
        configs: each job's composed config (without its ``hydra`` node).

    Raises:
        ConfigurationError: a job's plan does not build, or no node of the partition holds the job.
    """
    from .plan import build_plan

    needs = []
    for cfg in configs:
        plan = build_plan(cfg)
        if not cfg.launcher.dry_run:
            for c in plan.components:  # a cell not built yet fails now, not in the job
                c.ensure_built()
        needs.append(job_resources(plan))
    largest = JobResources.largest(needs)
    user_set = [name for name in DERIVED if params.get(name) is not None]
    out = {**params, **{name: getattr(largest, name) for name in DERIVED if name not in user_set}}
    note = "from the plan" + (f", the largest of {len(configs)} jobs" if len(configs) > 1 else "")
    note += "".join(f"; {name} from hydra.launcher.{name}" for name in user_set)
    submitted = JobResources(*(int(out[name]) for name in DERIVED), tasks_per_node=int(out.get("tasks_per_node", 1)))
    say(submitted.line(note))
    try:
        partition, nodes = partition_nodes(params.get("partition"), run)
    except SlurmUnavailable as exc:  # submitit would fail to submit, after a long traceback
        raise ConfigurationError(f"hydra/launcher=slurm submits Slurm jobs, but no Slurm controller answers here "
                                 f"({exc}): run where Slurm is reachable, or use hydra/launcher=local to run the "
                                 "jobs here", path="hydra/launcher") from None
    check_fits({name: int(out[name]) for name in DERIVED}, largest, partition, nodes, user_set)
    return out
