"""The learner on its device: losses read once per batch, not per minibatch; bf16 autocast (``recipe.amp``); a compiled
update (``recipe.compile``); the rows a CUDA learner keeps on its device; what is refused without CUDA; and, where
there is a GPU, the recipes with ``recipe.device=cuda`` end to end."""

from __future__ import annotations

import collections
import csv
import math
import os
import threading
import traceback
import warnings

import pytest
import torch
from tensordict import TensorDict
from torch.utils._python_dispatch import TorchDispatchMode

from components.envs import EnvSpec
from components.replay import ReplayBuffer, ReplayConfig
from launcher.checkpointing import load
from launcher.plan import build_plan
from launcher.run import execute
from recipes.base import host_values
from recipes.configs import PPOConfig
from recipes.networks import RunningNorm
from recipes.ppo import minibatches
from recipes.update import UpdateStep, learner_device
from tests.helpers import run_cli

CARTPOLE = EnvSpec("CartPole-v1", (4,), torch.float32, True, 2, ())


class Watch(TorchDispatchMode):
    """What torch runs in this thread while it is entered: each read of a tensor's value into Python (``item()``,
    ``float()``, ``int()``, ``bool()``: torch's ``_local_scalar_dense``) but torch.optim's own (the step count of an
    optimizer that is not ``capturable`` is a host tensor wherever the weights are), and the dtypes matrix products
    ran in."""

    def __init__(self):
        super().__init__()
        self.reads = 0
        self.products: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += not any(os.sep + os.path.join("torch", "optim") in frame.filename
                                  for frame in traceback.extract_stack(limit=8))
        elif func in (torch.ops.aten.addmm.default, torch.ops.aten.mm.default):
            self.products[args[-1].dtype] += 1
        return func(*args, **(kwargs or {}))


def watched_run(compose_cfg, tmp_path, *overrides: str) -> tuple[dict, Watch]:
    """A real run of the launcher's plan in this thread (its services on threads of their own), watched."""
    cfg = compose_cfg(*overrides, "launcher.progress=false", "seed=0")
    with Watch() as watch:
        result = execute(build_plan(cfg), str(tmp_path))
    return result, watch


@pytest.fixture
def compile_here():
    """Inductor compiles in this thread: no pool of compile workers (threads or processes) outlives the test."""
    import torch._inductor.config

    with torch._inductor.config.patch(compile_threads=1):
        yield


# ---------------------------------------------------------------------------------------------- reads to the host
UPDATES = {  # each recipe's setting that multiplies the gradient steps of a batch
    "ppo": ("+recipe=ppo", "recipe.total_frames=2048", "recipe.update_epochs={}"),
    "appo": ("+recipe=appo", "recipe.total_frames=1024", "recipe.update_epochs={}"),
    "dqn": ("+recipe=dqn", "recipe.total_frames=512", "recipe.learning_starts=128", "recipe.updates_per_batch={}"),
}


@pytest.mark.parametrize("recipe", [r if r == "ppo" else pytest.param(r, marks=pytest.mark.slow)  # the quick loop: one
                                    for r in sorted(UPDATES)])
def test_the_learner_reads_values_to_the_host_per_batch_never_per_gradient_step(recipe, compose_cfg, tmp_path,
                                                                                monkeypatch):
    # a CUDA learner waits for its device at each read: the losses stay tensors until the batch's metrics are logged
    lists = collections.Counter()
    tolist = torch.Tensor.tolist

    def counted(self):
        if threading.current_thread() is threading.main_thread():  # the learner's (the recipe runs in this thread)
            lists[recipe] += 1
        return tolist(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counted)
    *fixed, varied = UPDATES[recipe]
    reads = []
    for steps in (1, 3):
        lists.clear()
        result, watch = watched_run(compose_cfg, tmp_path / str(steps), *fixed, varied.format(steps),
                                    "service=thread")  # the collector, inference and replay in their own threads
        assert result["frames"] >= 512
        reads.append((watch.reads, lists[recipe]))
    assert reads[0] == reads[1], f"{recipe}: (item-like reads, tolist calls) with 1 and 3 steps per batch: {reads}"


def test_metrics_on_a_device_are_read_in_one_copy_and_numbers_pass_as_they_are():
    losses = {"loss/policy": torch.tensor(0.25), "loss/value": torch.tensor([2.0], dtype=torch.float64),
              "lag/max": 3, "train/fps": 1.5}
    with Watch() as watch:
        read = host_values(losses)
    assert read == {"loss/policy": 0.25, "loss/value": 2.0, "lag/max": 3, "train/fps": 1.5}
    assert all(type(v) in (float, int) for v in read.values()) and watch.reads == 0  # one tolist, no item()


# ---------------------------------------------------------------------------------------------- rows on the device
def test_minibatches_by_row_number_are_the_rows_the_buffer_would_have_handed_back():
    # what a CUDA learner does (the buffer holds row numbers, the rows stay on the device), done on the CPU
    cfg = PPOConfig(num_envs=4, num_steps=8, num_minibatches=4, update_epochs=3)
    rows = TensorDict({"observation": torch.randn(32, 4), "advantage": torch.arange(32.0)}, batch_size=[32])
    handed = {}
    for numbers in (False, True):
        with ReplayBuffer(ReplayConfig(capacity=32, sampler="without_replacement", batch_size=8)) as replay:
            torch.manual_seed(0)
            handed[numbers] = list(minibatches(rows, replay, cfg, numbers=numbers))
            assert ("row" in replay.sample(1).keys()) is numbers
    assert len(handed[True]) == 12 and [len(m) for m in handed[True]] == [8] * 12
    for by_rows, by_numbers in zip(handed[False], handed[True]):
        assert torch.equal(by_rows["advantage"], by_numbers["advantage"])
        assert torch.equal(by_rows["observation"], by_numbers["observation"])
    for epoch in range(3):  # each epoch a permutation of the batch
        seen = torch.cat([m["advantage"] for m in handed[True][epoch * 4:(epoch + 1) * 4]])
        assert sorted(seen.tolist()) == list(range(32))


def _norm_at(count: float, scale: float) -> RunningNorm:
    norm = RunningNorm((3,), scale=scale)
    if count:
        norm.update(torch.randn(50, 3) * 40 + 100)
    return norm


@pytest.mark.slow  # compiles (inductor): seconds
def test_the_normalisation_a_device_runs_reads_no_count_and_gives_the_cpus_figures(compile_here):
    # off the CPU (and compiled) RunningNorm picks between the standardised and the raw observations with where():
    # the same figures as the CPU's branch on the count, integer observations scaled as the encoder would
    torch.manual_seed(0)
    floats = torch.randn(6, 3) * 30 + 90
    frames = torch.randint(0, 256, (6, 3), dtype=torch.uint8)
    for seen in (0, 1):
        norm = _norm_at(seen, 1 / 255)
        # fullgraph: no read of the count breaks the graph; aot_eager traces it as inductor would, without generating
        # and building C++ for each of the four graphs (seconds each with a cold cache, as CI has)
        compiled = torch.compile(norm, dynamic=False, fullgraph=True, backend="aot_eager")
        torch.testing.assert_close(compiled(floats), norm(floats))
        expected = norm(frames)
        if not seen:  # the CPU's identity hands the frames on to be scaled by the encoder; where() scales them here
            assert expected.dtype == torch.uint8
            expected = frames.float() * (1 / 255)
        torch.testing.assert_close(compiled(frames), expected)


# ---------------------------------------------------------------------------------------------- amp
def test_amp_runs_the_forward_and_loss_in_bf16_and_leaves_the_weights_and_gradients_in_float32():
    from recipes.actor_critic import Learner
    from recipes.ppo import ppo_loss

    cfg = PPOConfig(amp=True)
    learner = Learner(cfg, CARTPOLE)
    minibatch = TensorDict({"observation": torch.randn(64, 4), "action": torch.randint(0, 2, (64,)),
                            "sample_log_prob": -torch.rand(64), "advantage": torch.randn(64),
                            "value_target": torch.randn(64)}, batch_size=[64])
    step = UpdateStep(lambda mb: ppo_loss(mb, learner, cfg), cfg, learner_device(cfg))
    with Watch() as watch:
        loss, losses = step(minibatch)
    assert watch.products[torch.bfloat16] >= 6 and watch.products[torch.float32] == 0  # every layer, actor and critic
    loss.backward()  # outside autocast
    assert loss.dtype == torch.float32 and all(v.dtype == torch.float32 for v in losses.values())
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in learner.parameters())
    with Watch() as plain:
        UpdateStep(lambda mb: ppo_loss(mb, learner, cfg), PPOConfig(), learner_device(cfg))(minibatch)
    assert plain.products[torch.bfloat16] == 0 and plain.products[torch.float32] >= 6


@pytest.mark.slow  # trains CartPole to its target
def test_ppo_learns_cartpole_with_amp_on_the_cpu(compose_cfg, tmp_path):
    result, watch = watched_run(compose_cfg, tmp_path, "+recipe=ppo", "recipe.amp=true", "recipe.total_frames=60000")
    assert result["solved"] and result["final_mean_return"] >= 475, result
    assert watch.products[torch.bfloat16] > 0  # the learner's products (the inference server's stay float32)


# ---------------------------------------------------------------------------------------------- compile
def _weights(run_dir) -> dict[str, torch.Tensor]:
    return load(os.path.join(run_dir, "checkpoint.pt"))["recipe"]["learner"]


@pytest.mark.slow  # compiles (inductor on the CPU: tens of seconds the first time)
@pytest.mark.parametrize("recipe", ["ppo", "appo"])
def test_a_compiled_update_learns_what_the_eager_one_does(recipe, compose_cfg, tmp_path, compile_here):
    # same seed, same frames: the same episodes, and weights equal to within float rounding (inductor fuses and
    # reorders the arithmetic); APPO compiles its two parts apart, with the bootstrap values between them eager
    runs = {}
    for compiled in (False, True):
        run_dir = tmp_path / str(compiled)
        result = execute(build_plan(compose_cfg(f"+recipe={recipe}", "seed=0", "launcher.progress=false",
                                                "recipe.total_frames=4096", "launcher.checkpoint_every=4096",
                                                f"recipe.compile={str(compiled).lower()}")), str(run_dir))
        runs[compiled] = result, _weights(run_dir)
    (eager, eager_weights), (compiled, compiled_weights) = runs[False], runs[True]
    assert compiled["episodes"] == eager["episodes"] and compiled["frames"] == eager["frames"] == 4096
    assert compiled["final_mean_return"] == pytest.approx(eager["final_mean_return"], rel=1e-6)
    for name, tensor in eager_weights.items():
        torch.testing.assert_close(compiled_weights[name], tensor, rtol=1e-3, atol=1e-4, msg=name)


# ---------------------------------------------------------------------------------------------- refused without CUDA
def test_amp_is_accepted_on_the_cpu():
    assert learner_device(PPOConfig(amp=True)) == torch.device("cpu")


@pytest.mark.slow  # two launcher processes
@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: recipe.device=cuda is allowed here")
@pytest.mark.parametrize("extra", [(), ("recipe.amp=true",)], ids=["device", "amp"])
def test_a_cuda_learner_without_cuda_exits_2_with_one_line_naming_the_device(extra, tmp_path):
    proc = run_cli("+recipe=ppo", "recipe.device=cuda", *extra, "recipe.total_frames=64", cwd=str(tmp_path))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == ("configuration error: recipe.device must be a device this machine has, got 'cuda': it has "
                        "no CUDA device; use cpu, or run where the device is (a dry run plans for any node)"), \
        proc.stderr
    assert lines[-1].strip() == "full_key: recipe.device" and len(lines) == 2 and proc.stdout == ""
    assert list(tmp_path.iterdir()) == []  # nothing started, no run directory


# ---------------------------------------------------------------------------------------------- on a GPU
def _metrics(run_dir) -> dict[str, list[float]]:
    series: dict[str, list[float]] = {}
    with open(os.path.join(run_dir, "metrics.csv")) as f:
        for row in csv.DictReader(f):
            series.setdefault(row["tag"], []).append(float(row["value"]))
    return series


GPU_RUNS = {
    "ppo": ("+recipe=ppo", "recipe.total_frames=100000"),  # solves CartPole (475) at 27,136 frames on the CPU
    "ppo-pendulum": ("+recipe=ppo", "env=pendulum", "recipe.normalize_observations=true",
                     "recipe.normalize_rewards=true", "recipe.total_frames=4096"),
    "appo": ("+recipe=appo", "recipe.normalize_observations=true", "recipe.total_frames=8192"),
    "dqn": ("+recipe=dqn", "recipe.total_frames=4096", "recipe.learning_starts=512"),
}


@pytest.mark.gpu
@pytest.mark.parametrize("policy_device", ["cpu", "cuda"])
@pytest.mark.parametrize("run", sorted(GPU_RUNS))
def test_a_cuda_learner_trains_with_inference_on_the_cpu_or_the_gpu(run, policy_device, compose_cfg, tmp_path):
    cfg = compose_cfg(*GPU_RUNS[run], "recipe.device=cuda", f"components.inference.policy_device={policy_device}",
                      "launcher.progress=false", "seed=0")
    result = execute(build_plan(cfg), str(tmp_path))
    assert result["frames"] >= min(cfg.recipe.total_frames, result["solved_at_frames"] or math.inf)
    losses = [v for tag, values in _metrics(tmp_path).items() if tag.startswith("loss/") for v in values]
    assert losses and all(math.isfinite(v) for v in losses)
    if run == "ppo":
        assert result["solved"], result  # learns: the weights pushed from the GPU act in the server


@pytest.mark.gpu
def test_ppo_learns_cartpole_with_amp_and_a_compiled_update_on_the_gpu(compose_cfg, tmp_path, compile_here):
    cfg = compose_cfg("+recipe=ppo", "recipe.device=cuda", "recipe.amp=true", "recipe.compile=true",
                      "recipe.total_frames=100000", "launcher.progress=false", "seed=0")
    result = execute(build_plan(cfg), str(tmp_path))
    assert result["solved"], result


def _cartpole_batch(steps: int, envs: int, device) -> TensorDict:
    done = torch.rand(steps, envs) < 0.05
    return TensorDict({
        "observation": torch.randn(steps, envs, 4), "action": torch.randint(0, 2, (steps, envs)),
        "sample_log_prob": -torch.rand(steps, envs), "policy_version": torch.zeros(steps, envs, dtype=torch.long),
        "next": {"observation": torch.randn(steps, envs, 4), "reward": torch.ones(steps, envs),
                 "terminated": done & (torch.rand(steps, envs) < 0.5), "done": done},
    }, batch_size=[steps, envs]).to(device)


@pytest.mark.gpu
def test_a_cuda_learners_updates_never_wait_for_the_device():
    # torch's sync debug mode raises at any operation that waits for the device (item(), a boolean mask, a copy
    # from pageable memory...): PPO's and IMPALA's passes over a batch and a DQN step run with it on
    from recipes import dqn, impala, ppo
    from recipes.actor_critic import Learner
    from recipes.configs import DQNConfig, IMPALAConfig

    device = torch.device("cuda")
    cfg = PPOConfig(num_envs=8, num_steps=16, device="cuda")
    learner = Learner(cfg, CARTPOLE).to(device)
    optimizer = learner.optimizer(cfg.lr)
    rows = ppo.estimate_advantages(_cartpole_batch(16, 8, device), learner, cfg).reshape(-1)
    step = UpdateStep(lambda mb: ppo.ppo_loss(mb, learner, cfg), cfg, device)
    with ReplayBuffer(ReplayConfig(capacity=128, sampler="without_replacement", batch_size=32)) as replay:
        batches = minibatches(rows, replay, cfg)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            losses = ppo.update(batches, learner, optimizer, step, cfg)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert all(v.device.type == "cuda" for v in losses.values())

    icfg = IMPALAConfig(num_envs=8, batch_size=8, unroll_length=16, num_minibatches=2, update_epochs=2,
                        clip_coef=0.2, normalize_observations=True, device="cuda")
    ilearner = Learner(icfg, CARTPOLE).to(device)
    ioptimizer = ilearner.optimizer(icfg.lr)
    loss = impala.ImpalaLoss(ilearner, icfg, device)
    steps = _cartpole_batch(16, 8, "cpu")  # as the learner queue hands it over
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ilosses = impala.learn(steps, ilearner, ioptimizer, icfg, loss)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert all(v.device.type == "cuda" for v in ilosses.values())
    assert float(ilearner.policy.actor.norm.count) == 128  # folded in on the device

    dcfg = DQNConfig(batch_size=32, device="cuda")
    behaviour = dqn.make_policy(dcfg, CARTPOLE).to(device)
    target = dqn.q_network(dcfg, CARTPOLE).to(device)
    doptimizer = torch.optim.Adam(behaviour.q.parameters(), lr=dcfg.lr)
    dstep = UpdateStep(lambda r, w: dqn.td_loss(r, w, behaviour.q, target, dcfg), dcfg, device)
    transitions = dqn.n_step_transitions(_cartpole_batch(24, 8, "cpu").select(*dqn.TRANSITION_KEYS), dcfg)
    with ReplayBuffer(ReplayConfig(capacity=512, sampler="prioritized", batch_size=32)) as replay:
        replay.extend(transitions.exclude(("next", "done")).reshape(-1))
        replay.sample_prioritized(32)  # the sampler's first call sets itself up
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("warn")
        try:
            with warnings.catch_warnings(record=True) as waits:
                warnings.simplefilter("always")
                dlosses = dqn.learn(replay, dstep, behaviour.q, target, doptimizer, 0, dcfg)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    waits = [w for w in waits if "synchronizing" in str(w.message)]
    assert len(waits) <= 1, [str(w.message) for w in waits]  # the priorities go back to the host: a DQN step's one
    assert all(v.device.type == "cuda" for v in dlosses.values())


@pytest.mark.gpu
@pytest.mark.parametrize("placement, transport", [("direct", "direct"), ("thread", "direct"),
                                                  ("process", "shared_memory")])
def test_weights_pushed_from_a_cuda_learner_reach_cpu_and_cuda_receivers_in_place(placement, transport):
    from components.weight_sync import WeightSync, WeightSyncConfig
    from recipes.actor_critic import Learner, make_policy

    cfg = PPOConfig(normalize_observations=True)
    learner = Learner(cfg, CARTPOLE).cuda()
    learner.fold_in(torch.randn(64, 4, device="cuda") * 3 + 1)  # the running statistics travel too
    receivers = {"cpu": make_policy(cfg, CARTPOLE), "cuda": make_policy(cfg, CARTPOLE).cuda()}
    storage = {name: [t.data_ptr() for t in r.state_dict().values()] for name, r in receivers.items()}
    with WeightSync(WeightSyncConfig(placement=placement, transport=transport), template=make_policy(cfg, CARTPOLE),
                    ) as sync:
        version = sync.push(learner.policy)
        client = sync.client()
        for receiver in receivers.values():
            assert client.poll(0, receiver) == version
    expected = {k: v.cpu() for k, v in learner.policy.state_dict().items()}
    for name, receiver in receivers.items():
        for key, tensor in receiver.state_dict().items():
            torch.testing.assert_close(tensor.cpu(), expected[key], msg=f"{name} {key}")
        assert [t.data_ptr() for t in receiver.state_dict().values()] == storage[name]  # copied in place
