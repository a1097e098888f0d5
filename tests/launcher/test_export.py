"""``python -m launcher.export``: real run directories, made here by the commands the Export page shows (once for
the test session, whichever xdist worker gets there first), exported to ONNX; ``onnxruntime`` then acts on observations recorded from the env as the torch policy rebuilt from the checkpoint
does (same actions, outputs within :data:`RTOL` / :data:`ATOL`), for the MLP (with observation normalisation, folded
into the graph) and for the Nature CNN on Atari frames. And the one-line refusals (exit 2)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import numpy as np
import onnxruntime  # the test extra installs it (and the export extra)
import pytest
import torch

from tests.helpers import ROOT

PAGE = os.path.join(ROOT, "docs", "pages", "export.md")
TRAIN_CARTPOLE = ("python -m launcher +recipe=ppo recipe.normalize_observations=true recipe.total_frames=4096 "
                  "launcher.checkpoint_every=2048 hydra.run.dir=runs/cartpole")
EXPORT_CARTPOLE = "python -m launcher.export runs/cartpole --format onnx"
TRAIN_ATARI = ("python -m launcher +recipe=ppo env=atari recipe.num_envs=2 recipe.num_steps=8 recipe.total_frames=16 "
               "launcher.checkpoint_every=16 hydra.run.dir=runs/breakout")
EXPORT_ATARI = "python -m launcher.export runs/breakout --format onnx"
COMMANDS = (TRAIN_CARTPOLE, EXPORT_CARTPOLE, TRAIN_ATARI, EXPORT_ATARI)

RTOL, ATOL = 1e-4, 1e-5
"""How close onnxruntime's logits must be to torch's: ``|onnx - torch| <= ATOL + RTOL * |torch|``."""


def _page_commands() -> list[str]:
    text = open(PAGE).read()
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines += [" ".join(line.split()) for line in block.replace("\\\n", " ").splitlines()
                  if line.strip() and not line.strip().startswith("#")]
    return lines


def test_the_export_page_shows_the_commands_these_tests_run():
    shown = _page_commands()
    assert [c for c in COMMANDS if c not in shown] == []


def _train(command: str, cwd) -> None:
    """The page's ``python -m launcher`` command, as a process of its own."""
    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "launcher"]
    proc = subprocess.run([sys.executable, *words[1:]], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"


def _export(command: str, cwd) -> str:
    """The page's ``python -m launcher.export`` command through its entry point, in this process (torch's exporter is
    imported once for the module's exports); what it printed."""
    from launcher.export import main

    words = shlex.split(command)
    assert words[:3] == ["python", "-m", "launcher.export"]
    printed = io.StringIO()
    with contextlib.chdir(cwd), contextlib.redirect_stdout(printed):
        main(words[3:])
    return printed.getvalue()


def _made(train: str, export: str, where) -> dict:
    """The page's run and export in ``where``, made once for the test session: the first of pytest-xdist's workers to
    get here makes them while holding a lock, the others wait for it and read what it made."""
    from filelock import FileLock

    made = where / "made.json"
    with FileLock(f"{where}.lock", timeout=600):
        if not made.exists():
            where.mkdir(exist_ok=True)
            _train(train, where)
            made.write_text(json.dumps({"printed": _export(export, where)}))
    run_dir = where / shlex.split(export)[3]
    meta = json.loads((run_dir / "export" / "policy.json").read_text())
    return {"where": where, "run_dir": run_dir, "printed": json.loads(made.read_text())["printed"], "meta": meta,
            "onnx": str(run_dir / "export" / "policy.onnx")}


def _shared(tmp_path_factory, name: str):
    """A directory every worker of the test session sees (the workers' common temporary folder under xdist)."""
    root = tmp_path_factory.getbasetemp()
    return (root.parent if os.environ.get("PYTEST_XDIST_WORKER") else root) / name


@pytest.fixture(scope="session")
def cartpole(tmp_path_factory):
    """PPO on CartPole with observation normalisation, trained, checkpointed and exported as the page shows."""
    return _made(TRAIN_CARTPOLE, EXPORT_CARTPOLE, _shared(tmp_path_factory, "export_cartpole"))


@pytest.fixture(scope="session")
def breakout(tmp_path_factory):
    """PPO on Atari frames (the Nature CNN), a few frames, checkpointed and exported as the page shows."""
    return _made(TRAIN_ATARI, EXPORT_ATARI, _shared(tmp_path_factory, "export_breakout"))


def _torch_policy(run_dir):
    """The run's policy as the tests rebuild it on their own: PPO's ``make_policy`` from the resolved config, with
    the learner's ``policy.`` weights of the checkpoint."""
    from omegaconf import OmegaConf

    from components.envs import EnvMaker
    from launcher.checkpointing import load
    from recipes.actor_critic import make_policy
    from recipes.configs import PPOConfig

    cfg = OmegaConf.load(run_dir / "resolved_config.yaml")
    maker = EnvMaker.from_config(cfg.env)
    spec = maker.spec()
    policy = make_policy(PPOConfig(**OmegaConf.to_container(cfg.recipe)), spec)
    learner = load(str(run_dir / "checkpoint.pt"))["recipe"]["learner"]
    policy.load_state_dict({k.removeprefix("policy."): v for k, v in learner.items() if k.startswith("policy.")})
    return policy.eval(), maker, spec


def _deterministic_action(policy, obs: torch.Tensor) -> np.ndarray:
    from tensordict import TensorDict
    from tensordict.nn import InteractionType, set_interaction_type

    with torch.no_grad(), set_interaction_type(InteractionType.DETERMINISTIC):
        return policy(TensorDict({"observation": obs}, batch_size=[len(obs)])).get("action").numpy()


def _record(maker, spec, policy, steps: int) -> torch.Tensor:
    """Observations of one env made as the run made its envs, played with the torch policy's deterministic actions."""
    env = maker()
    try:
        obs, _ = env.reset(seed=7)
        seen = []
        for _ in range(steps):
            seen.append(torch.as_tensor(np.asarray(obs)).to(spec.observation_dtype))
            obs, _, terminated, truncated, _ = env.step(int(_deterministic_action(policy, seen[-1][None])[0]))
            if terminated or truncated:
                obs, _ = env.reset()
        return torch.stack(seen)
    finally:
        env.close()


def _assert_acts_as_torch(run: dict, steps: int) -> tuple:
    policy, maker, spec = _torch_policy(run["run_dir"])
    obs = _record(maker, spec, policy, steps)
    session = onnxruntime.InferenceSession(run["onnx"], providers=["CPUExecutionProvider"])
    logits, action = session.run(["logits", "action"], {"observation": obs.numpy()})
    with torch.no_grad():
        expected = policy.actor.net(obs).numpy()
    np.testing.assert_allclose(logits, expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(action, _deterministic_action(policy, obs))
    one = session.run(["action"], {"observation": obs[:1].numpy()})[0]  # the batch dimension is dynamic
    assert one.shape == (1,) and one[0] == action[0]
    return policy, obs, logits


@pytest.mark.slow  # trains, then exports, each a python -m subprocess
def test_the_mlp_policy_acts_in_onnxruntime_as_in_torch(cartpole):
    _assert_acts_as_torch(cartpole, steps=256)
    assert cartpole["meta"]["check"]["ok"] and "checked on 32 env steps" in cartpole["printed"]


@pytest.mark.slow
def test_observation_normalisation_is_folded_into_the_graph(cartpole):
    import onnx

    policy, obs, logits = _assert_acts_as_torch(cartpole, steps=64)  # raw observations in, as the env gives them
    norm = policy.actor.norm
    assert float(norm.count) == 4096  # the learner's statistics of every frame, which the graph holds
    folded = cartpole["meta"]["observation_normalization"]
    assert folded == [{"shape": [4], "count": 4096.0, "folded": True, "clip": 10.0}]
    without = torch.nn.Sequential(*list(policy.actor.net)[1:])  # the same network, not normalising
    with torch.no_grad():
        assert np.abs(without(obs).numpy() - logits).max() > 1e-3
    model = onnx.load(cartpole["onnx"])
    assert [i.name for i in model.graph.input] == ["observation"]  # nothing else to feed: the statistics are inside
    assert not any("count" in init.name for init in model.graph.initializer)  # no branch on the running count
    assert sorted(os.listdir(cartpole["run_dir"] / "export")) == ["policy.json", "policy.onnx"]  # no external data


@pytest.mark.slow
def test_the_metadata_says_how_to_feed_the_file(cartpole):
    import onnx

    from launcher.checkpointing import load

    meta = cartpole["meta"]
    state = load(str(cartpole["run_dir"] / "checkpoint.pt"))
    assert meta["recipe"] == "ppo" and meta["encoder"] == "mlp"
    assert meta["env"] == {"id": "CartPole-v1", "backend": "gymnasium", "kwargs": {}, "preprocessing": None}
    assert meta["observation_space"] == {"shape": [4], "dtype": "float32", "scale": 1.0}
    assert meta["action_space"] == {"discrete": True, "n": 2, "shape": [], "dtype": "int64"}
    assert meta["checkpoint"]["frames"] == state["frames"] == 4096
    assert meta["checkpoint"]["policy_version"] == state["policy_version"] > 0
    session = onnxruntime.InferenceSession(cartpole["onnx"], providers=["CPUExecutionProvider"])
    assert [(i["name"], i["shape"]) for i in meta["inputs"]] == [(i.name, i.shape) for i in session.get_inputs()]
    assert [(o["name"], o["shape"]) for o in meta["outputs"]] == [(o.name, o.shape) for o in session.get_outputs()]
    assert [o.type for o in session.get_outputs()] == ["tensor(float)", "tensor(int64)"]
    embedded = {p.key: p.value for p in onnx.load(cartpole["onnx"]).metadata_props}["rl_services_launcher"]
    assert json.loads(embedded) == {k: v for k, v in meta.items() if k != "check"}


@pytest.mark.slow
def test_the_pages_snippet_feeds_the_exported_file(cartpole):
    (snippet,) = re.findall(r"```python\n(.*?)```", open(PAGE).read(), re.S)
    scope: dict = {}
    with contextlib.chdir(cartpole["where"]):
        exec(compile(snippet, PAGE, "exec"), scope)
    assert scope["logits"].shape == (1, 2) and scope["action"].shape == (1,)
    assert scope["action"][0] == scope["logits"][0].argmax()


@pytest.mark.slow
def test_the_nature_cnn_policy_acts_in_onnxruntime_as_in_torch(breakout):
    from recipes.networks import NatureCNN

    policy, obs, _ = _assert_acts_as_torch(breakout, steps=64)
    assert isinstance(policy.actor.encoder, NatureCNN)
    assert obs.dtype == torch.uint8 and tuple(obs.shape[1:]) == (4, 84, 84) and len(obs.unique()) > 2  # real frames
    meta = breakout["meta"]
    assert meta["encoder"] == "nature_cnn"
    assert meta["inputs"] == [{"name": "observation", "shape": ["batch", 4, 84, 84], "dtype": "uint8"}]
    assert meta["observation_space"]["scale"] == pytest.approx(1 / 255)
    pre = meta["env"]["preprocessing"]
    assert (pre["family"], pre["stack"], pre["screen_size"], pre["frame_skip"], pre["grayscale"]) == \
        ("atari", 4, 84, 4, True)
    assert meta["action_space"] == {"discrete": True, "n": 4, "shape": [], "dtype": "int64"}
    assert meta["observation_normalization"] is None


# ---------------------------------------------------------------------------------------------- refusals
def _refused(*argv: str, capsys) -> str:
    from launcher.export import main

    with pytest.raises(SystemExit) as ended:
        main(list(argv))
    assert ended.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("export error: ")
    return err


@pytest.mark.slow  # python -m launcher.export as a process of its own
def test_an_unknown_format_is_refused_naming_the_formats(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launcher.export", str(tmp_path), "--format", "tflite"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "export error: --format 'tflite' is not a format this exports: onnx\n"


def test_a_path_that_is_no_run_directory_is_refused(tmp_path, capsys):
    assert "is not a directory" in _refused(str(tmp_path / "nowhere"), capsys=capsys)
    assert "is not a run directory: it holds no resolved_config.yaml" in _refused(str(tmp_path), capsys=capsys)
    for job in ("0", "1"):  # a sweep's directory: its runs are named
        (tmp_path / job).mkdir()
        (tmp_path / job / "resolved_config.yaml").write_text("{}\n")
    assert "it holds the runs 0, 1: name one of them" in _refused(str(tmp_path), capsys=capsys)


@pytest.mark.slow
def test_a_run_without_a_readable_checkpoint_is_refused(cartpole, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(cartpole["run_dir"], run, ignore=shutil.ignore_patterns("checkpoint.pt", "export"))
    err = _refused(str(run), capsys=capsys)
    assert "holds no checkpoint.pt: a run writes one with launcher.checkpoint_every=<frames>" in err
    (run / "checkpoint.pt").write_bytes(b"not a checkpoint")
    assert "is not a readable checkpoint" in _refused(str(run), capsys=capsys)


# ---------------------------------------------------------------------------------------------- each kind of policy
def _spec(env_id: str):
    from components.envs import EnvMaker

    return EnvMaker(id=env_id).spec()


class GreedyOwnPolicy(torch.nn.Module):
    """A policy of one's own (no built-in actor): argmax of a linear layer in the deterministic mode, sampled else."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 2)

    def forward(self, td):
        from components.inference.modes import acts_deterministically

        logits = self.net(td.get("observation"))
        if acts_deterministically():
            td.set("action", logits.argmax(-1))
        else:
            td.set("action", torch.distributions.Categorical(logits=logits).sample())
        return td


def _written(policy, spec, tmp_path):
    from launcher.export import policy_graph, write_onnx

    graph = policy_graph(policy, spec)
    write_onnx(graph, spec, str(tmp_path / "policy.onnx"))
    session = onnxruntime.InferenceSession(str(tmp_path / "policy.onnx"), providers=["CPUExecutionProvider"])
    return graph, session


@pytest.mark.slow  # a trace by torch's exporter each (seconds)
def test_a_continuous_policy_exports_its_mean_its_log_std_and_the_clipped_action(tmp_path):
    from recipes.actor_critic import make_policy
    from recipes.configs import PPOConfig

    spec = _spec("Pendulum-v1")
    torch.manual_seed(0)
    policy = make_policy(PPOConfig(normalize_observations=True, init_log_std=-0.5), spec).eval()
    policy.actor.norm.update(torch.randn(256, 3) * 3 + 1)
    with torch.no_grad():
        policy.actor.net[1][-1].weight.mul_(1000)  # means past the action bounds (+-2) on some rows
    graph, session = _written(policy, spec, tmp_path)
    assert graph.outputs == ("mean", "log_std", "action")
    obs = torch.randn(64, 3) * 3 + 1
    mean, log_std, action = session.run(None, {"observation": obs.numpy()})
    with torch.no_grad():
        expected = policy.actor.net(obs).numpy()
    np.testing.assert_allclose(mean, expected, rtol=RTOL, atol=ATOL)
    assert (np.abs(expected) > 2).any() and (np.abs(expected) < 2).any()
    np.testing.assert_allclose(action, np.clip(expected, -2, 2), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(log_std, np.full((64, 1), -0.5, dtype=np.float32))
    np.testing.assert_allclose(action, np.clip(_deterministic_action(policy, obs), -2, 2), rtol=RTOL, atol=ATOL)


@pytest.mark.slow
def test_a_dqn_policy_exports_its_q_values_and_the_greedy_action(tmp_path):
    from recipes.configs import DQNConfig
    from recipes.dqn import make_policy

    spec = _spec("CartPole-v1")
    policy = make_policy(DQNConfig(), spec).eval()  # epsilon 1 (its start): the greedy action only when deterministic
    graph, session = _written(policy, spec, tmp_path)
    assert graph.outputs == ("q_values", "action")
    obs = torch.randn(64, 4)
    q_values, action = session.run(None, {"observation": obs.numpy()})
    with torch.no_grad():
        np.testing.assert_allclose(q_values, policy.q(obs).numpy(), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(action, _deterministic_action(policy, obs))


@pytest.mark.slow
def test_a_policy_of_ones_own_exports_the_action_of_its_deterministic_mode(tmp_path):
    spec = _spec("CartPole-v1")
    policy = GreedyOwnPolicy().eval()
    graph, session = _written(policy, spec, tmp_path)
    assert graph.outputs == ("action",)
    obs = torch.randn(64, 4)
    (action,) = session.run(None, {"observation": obs.numpy()})
    np.testing.assert_array_equal(action, _deterministic_action(policy, obs))


class SamplesInEveryMode(torch.nn.Module):
    """A policy that draws its actions at random whatever the mode: its ONNX graph draws from onnxruntime's
    generator, not torch's."""

    def forward(self, td):
        obs = td.get("observation")
        td.set("action", (torch.rand(obs.shape[:1]) < 0.5).long())
        return td


@pytest.mark.slow
def test_a_file_that_does_not_act_as_the_torch_policy_fails_the_check_and_is_kept(tmp_path):
    from omegaconf import OmegaConf

    from components.envs import EnvMaker
    from launcher.export import CheckFailed, Run, export_onnx
    from recipes import Recipe

    policy, maker = SamplesInEveryMode(), EnvMaker(id="CartPole-v1")
    recipe = Recipe(name="sampler", config=object, make_policy=lambda cfg, spec: policy,
                    services=lambda cfg, spec: {}, run=lambda cfg, clients: {})
    run = Run(str(tmp_path), OmegaConf.create({"env": {"id": "CartPole-v1"}}), recipe, None, maker, maker.spec(),
              policy, frames=64, policy_version=2, title="sampler")
    with pytest.raises(CheckFailed, match="onnxruntime disagrees with the torch policy on 32 steps of the env") as e:
        export_onnx(run, str(tmp_path / "out"))
    assert e.value.exit_code == 1
    check = json.loads((tmp_path / "out" / "policy.json").read_text())["check"]
    assert check["ok"] is False and check["actions_equal"] < 32 and check["differ_at_near_ties"] == 0
    assert export_onnx(run, str(tmp_path / "unchecked"), check_steps=0)["check"] is None
