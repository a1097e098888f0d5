"""Sample Factory 2.1.1's APPO on Atari Breakout, as a side-by-side peer for our IMPALA/APPO recipe: trains for a
fixed budget of agent steps and prints ONE JSON line of results on stdout (Sample Factory's own log goes to stderr).

Sample Factory is used as a library, in a venv of its own (it needs gymnasium < 1.0 and numpy < 2, which the
project's environment does not have); nothing here is imported by the project. The venv that this was checked with:

    python3 -m venv /tmp/sf/venv
    /tmp/sf/venv/bin/pip install torch==2.13.0
    /tmp/sf/venv/bin/pip install sample-factory==2.1.1 gymnasium==0.29.1 "ale-py==0.9.*" \
        opencv-python-headless "numpy<2"

(ale-py 0.9.1 ships the ROMs in its wheel and, imported, registers ``BreakoutNoFrameskip-v4`` with gymnasium 0.29.1;
do not ask for ``gymnasium[atari]``, whose shimmy pins ale-py 0.8, which needs AutoROM. Sample Factory also pulls in
opencv-python beside the headless one; both are 4.11.0.86 and ``cv2`` imports.) Run from the repository root:

    /tmp/sf/venv/bin/python benchmarks/sample_factory_peer.py --frames 20000 --seed 0
    /tmp/sf/venv/bin/python benchmarks/sample_factory_peer.py --frames 20000 --seed 0 --serial

What runs: SF's APPO (``sample_factory.train.make_runner``, ``runner.init()``, ``runner.run()``, as SF's
``run_rl`` does) on ``atari_breakout`` = ``BreakoutNoFrameskip-v4``, made by ``sf_examples.atari``'s
``make_atari_env`` (RecordEpisodeStatistics on the raw env, 30 no-op reset, max-and-skip 4, episodic life, fire
reset, reward clipping, 84x84 grey, 4-frame stack; registered here under SF's names with ``ale_py`` imported first,
since SF's spawned workers would not import it), with the arguments parsed as ``sf_examples.atari.train_atari``
does (``parse_atari_args``: SF's defaults under ``atari_override_defaults``). On top of those this script sets only
``--device=cpu``, ``--with_wandb=False``, the seed, workers, envs per worker, rollout, the batch (below),
``summaries_use_frameskip=False`` with ``train_for_env_steps`` (below), ``async_rl`` (True in parallel mode where SF's
Atari example has False: see ``--async-rl``) and ``serial_mode``. Any other ``--name=value`` goes to SF's parser
unchanged (e.g. ``--with_vtrace=True --normalize_returns=False``, ``--worker_num_splits=2``). With SF's Atari
defaults its APPO is PPO-clip (0.1) on GAE(0.95) advantages, no V-trace, inputs and returns normalised, lr 2.5e-4
decaying linearly to 0 at the budget.

- ``--wrappers ours``: the same game as the project's ``env=atari`` plays it instead (``make_env_like_ours``:
  ``ALE/Breakout-v5`` with sticky actions 0.25, gymnasium's ``AtariPreprocessing``, no episodic life, no FIRE at
  reset, a 4-frame stack, rewards clipped), so that returns compare with ours game for game; ``returns_at`` gives
  the agent steps SF had counted when each game's report arrived (a learning curve; ``benchmarks/learning.py``).
- Encoder: SF's ``convnet_atari`` (its Atari default), the Nature CNN: conv 32x8x8/4, 64x4x4/2, 64x3x3/1, ReLU, no
  padding (3136 features), then ``encoder_conv_mlp_layers=[512]``: one 512-unit fc + ReLU; actor and critic share
  that trunk (``actor_critic_share_weights=True``), each a linear head on the 512 units; no RNN.
- Batch: ``--batch-size`` is the samples per training iteration (our recipe's batch: 16 unrolls of 32 = 512); SF
  splits it into ``--minibatches`` minibatches (SF's ``num_batches_per_epoch``, default 4, so SF's own
  ``batch_size``, its minibatch, is 512 / 4 = 128) and makes ``num_epochs`` = 4 passes (SF's Atari default;
  ``benchmarks/impala_atari.py`` passes ``--num_epochs`` to match our APPO's).
- Frames: everything is counted in AGENT STEPS (env steps after frame skip 4, one sample each). SF's Atari defaults
  count emulator frames (``summaries_use_frameskip=True``, i.e. x4); this script sets it False so SF's
  ``train_for_env_steps`` and its env-step counters are agent steps (``--frames`` as given) and so that its
  ``linear_decay`` learning-rate schedule, which assumes samples, ends at the budget. ``frames`` in the output is
  the learner's count of samples trained when SF stopped (it stops at the first training iteration past the
  budget, so it overshoots by up to a batch, more in async mode); ``emulator_frames`` is 4x that.
- Time: ``seconds`` is wall time from the start of SF's main event loop (which spawns the learner, inference and
  rollout worker processes and makes the envs) to the moment SF decides to stop, so it leaves out interpreter
  start-up, imports, argument parsing, SF's env-info probe process and the shutdown (final checkpoint, joins);
  ``fps`` = frames / seconds. ``startup_seconds`` is the part of ``seconds`` before the first training iteration
  ended, ``steady_fps`` the rate after it.
- Returns: raw (unclipped) game returns from SF's own reporting: its ``RecordEpisodeStatistics_reward`` episodic
  stat (gymnasium's RecordEpisodeStatistics sits below the reward clipping and the episodic-life wrapper, so one
  value is one whole game, all lives), caught with ``runner.register_episodic_stats_handler`` in arrival order.
- Modes: by default SF's parallel runner: the learner, one inference worker and the ``--workers`` rollout workers
  are processes, one torch thread each (5 processes with the runner; on 2 cores they share them).
  ``--serial`` is SF's serial mode: all of it in this one process, torch on ``--torch-threads`` threads (default 1:
  SF's serial runner leaves torch's count alone, and torch's default of one per core ran 4x slower here on a
  loaded 2-core machine). ``--async-rl auto`` (default) is APPO's asynchronous mode in parallel, and sync (SF's
  Atari default: no sampling while learning) in serial mode, where SF warns that async is for debugging only.
  Parallel mode is the default: it was the faster of the two on a 2-core machine.
- Local only: no wandb (``with_wandb`` False), no Hugging Face upload, no network; SF's files (config, checkpoints,
  tensorboard summaries, ``git.diff``) go under ``--train-dir``, by default a temp dir removed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Other --name=value options are passed to Sample Factory's parser.")
    p.add_argument("--frames", type=int, default=20000, help="budget of agent steps (after frame skip 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2, help="SF num_workers (rollout worker processes)")
    p.add_argument("--envs-per-worker", type=int, default=8, help="SF num_envs_per_worker")
    p.add_argument("--rollout", type=int, default=32, help="SF rollout: unroll length")
    p.add_argument("--batch-size", type=int, default=512, help="samples per training iteration")
    p.add_argument("--minibatches", type=int, default=4, help="SF num_batches_per_epoch; SF batch_size = batch/this")
    p.add_argument("--env", default="atari_breakout", help="an sf_examples.atari env name")
    p.add_argument("--wrappers", choices=["sf", "ours"], default="sf",
                   help="sf: SF's Atari wrappers on the NoFrameskip-v4 game; ours: the game as env=atari plays it")
    p.add_argument("--train-dir", default=None, help="SF train_dir; default a temp dir removed at the end")
    p.add_argument("--serial", action="store_true", help="SF serial_mode: everything in this process")
    p.add_argument("--async-rl", choices=["auto", "true", "false"], default="auto",
                   help="SF async_rl; auto: true in parallel mode, false (SF's Atari default) in serial mode")
    p.add_argument("--torch-threads", type=int, default=1,
                   help="torch threads in serial mode (0: torch's default, one per core); parallel mode: SF sets 1")
    return p


def sf_argv(args: argparse.Namespace, train_dir: str, extra: list[str]) -> list[str]:
    if args.batch_size % args.minibatches:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of --minibatches {args.minibatches}")
    async_rl = (not args.serial) if args.async_rl == "auto" else args.async_rl == "true"
    return [
        f"--env={args.env}",
        f"--experiment=sf_peer_{args.env}_seed{args.seed}",
        f"--train_dir={train_dir}",
        "--restart_behavior=overwrite",
        "--device=cpu",
        "--with_wandb=False",
        f"--seed={args.seed}",
        f"--num_workers={args.workers}",
        f"--num_envs_per_worker={args.envs_per_worker}",
        f"--rollout={args.rollout}",
        f"--batch_size={args.batch_size // args.minibatches}",
        f"--num_batches_per_epoch={args.minibatches}",
        "--summaries_use_frameskip=False",
        f"--train_for_env_steps={args.frames}",
        f"--async_rl={async_rl}",
        f"--serial_mode={args.serial}",
        *extra,
    ]


SETTINGS = ["env", "algo", "device", "seed", "serial_mode", "async_rl", "num_workers", "num_envs_per_worker",
            "worker_num_splits", "batched_sampling", "num_policies", "policy_workers_per_policy", "rollout",
            "batch_size", "num_batches_per_epoch", "num_epochs", "train_for_env_steps", "summaries_use_frameskip",
            "env_frameskip", "env_framestack", "encoder_conv_architecture", "encoder_conv_mlp_layers",
            "actor_critic_share_weights", "use_rnn", "nonlinearity", "obs_scale", "normalize_input",
            "normalize_returns", "with_vtrace", "gamma", "gae_lambda", "ppo_clip_ratio", "value_loss_coeff",
            "exploration_loss", "exploration_loss_coeff", "max_grad_norm", "learning_rate", "lr_schedule",
            "adam_eps", "shuffle_minibatches", "max_policy_lag", "use_record_episode_statistics"]


OURS = "ours_"
"""The prefix of an env name registered here for ``--wrappers ours``: ``ours_atari_breakout``."""


def make_env_like_ours(env_name, cfg, env_config, render_mode=None):
    """The game as the project's ``env=atari`` plays it on its gymnasium backend (``components.envs.EnvMaker`` with
    ``atari`` at ``AtariConfig``'s defaults), in this venv's gymnasium 0.29: ``ALE/<Game>-v5`` without its own frame
    skip, sticky actions 0.25, 108,000 emulator frames at most; ``AtariPreprocessing`` (up to 30 no-ops, skip 4 with
    max-pooling, 84x84 grey, no end on a lost life, no FIRE at reset), a 4-frame stack. RecordEpisodeStatistics sits
    on the raw game, as in SF's own stack, and rewards are clipped to their sign, as our recipes clip them in their
    loss."""
    import ale_py  # noqa: F401
    import gymnasium as gym
    from sample_factory.envs.env_wrappers import ClipRewardEnv, NumpyObsWrapper
    from sf_examples.atari.atari_utils import atari_env_by_name

    game = atari_env_by_name(env_name[len(OURS):]).env_id.replace("NoFrameskip-v4", "")
    env = gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.25, max_num_frames_per_episode=108_000,
                   render_mode=render_mode)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.AtariPreprocessing(env, noop_max=30, frame_skip=cfg.env_frameskip, screen_size=84,
                                          terminal_on_life_loss=False, grayscale_obs=True, scale_obs=False)
    env = ClipRewardEnv(env)
    env = gym.wrappers.FrameStack(env, cfg.env_framestack)
    return NumpyObsWrapper(env)


def make_env(env_name, cfg, env_config, render_mode=None):
    """SF's ``make_atari_env``, after importing ale_py: with gymnasium 0.29, ale-py 0.9 registers its envs
    (``BreakoutNoFrameskip-v4``) on import, and SF's worker processes (spawned) would not otherwise import it."""
    import ale_py  # noqa: F401
    from sf_examples.atari.atari_utils import make_atari_env

    return make_atari_env(env_name, cfg, env_config, render_mode=render_mode)


def train(args: argparse.Namespace, extra: list[str], train_dir: str) -> dict:
    from importlib.metadata import version

    from sample_factory.algo.runners.runner import AlgoObserver
    from sample_factory.algo.utils.misc import EPISODIC, ExperimentStatus
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import make_runner
    from sf_examples.atari.atari_utils import ATARI_ENVS
    from sf_examples.atari.train_atari import parse_atari_args

    for spec in ATARI_ENVS:  # what sf_examples.atari's register_atari_components does, with make_env above
        register_env(spec.name, make_env)
        register_env(OURS + spec.name, make_env_like_ours)
    if args.wrappers == "ours":
        args.env = OURS + args.env
    cfg = parse_atari_args(argv=sf_argv(args, train_dir, extra))
    if cfg.serial_mode and args.torch_threads > 0:
        import torch

        torch.set_num_threads(args.torch_threads)  # SF's serial runner leaves torch's thread count as it is
    # fail here, not in SF's env-info probe process (whose failure leaves SF's main process waiting forever)
    (make_env_like_ours if args.wrappers == "ours" else make_env)(cfg.env, cfg, None).close()
    cfg, runner = make_runner(cfg)

    returns: list[float] = []
    ended_at: list[int] = []  # the agent steps counted when each of those games' message arrived
    marks: dict = {}

    def on_episode(runner_, msg, _policy_id):
        # one message per finished (per-life) SF episode; the wrapper's stat is there only when a whole game ended
        stats = msg[EPISODIC]
        if "RecordEpisodeStatistics_reward" in stats:
            returns.append(float(stats["RecordEpisodeStatistics_reward"]))
            ended_at.append(int(sum(runner_.env_steps.values())))

    class Clock(AlgoObserver):
        def on_training_step(self, r, _iteration):
            if "first_step" not in marks:
                marks["first_step"] = (time.perf_counter(), sum(r.env_steps.values()))

        def on_stop(self, r):
            marks["stop"] = (time.perf_counter(), sum(r.env_steps.values()))

    runner.register_episodic_stats_handler(on_episode)
    runner.register_observer(Clock())

    status = runner.init()
    if status != ExperimentStatus.SUCCESS:
        raise SystemExit(f"Sample Factory failed to initialise (status {status})")
    t0 = time.perf_counter()
    status = runner.run()
    t_end = time.perf_counter()
    if status != ExperimentStatus.SUCCESS or "stop" not in marks:
        raise SystemExit(f"Sample Factory did not finish training (status {status})")

    import torch

    torch_threads = torch.get_num_threads() if cfg.serial_mode else 1  # SF's worker processes: 1 each
    t_stop, frames = marks["stop"]
    seconds = t_stop - t0
    t_first, frames_first = marks.get("first_step", (t0, 0))
    steady = (frames - frames_first) / (t_stop - t_first) if t_stop > t_first and frames > frames_first else None
    last = returns[-100:]
    return {
        "frames": int(frames),
        "seconds": round(seconds, 3),
        "fps": round(frames / seconds, 1) if seconds > 0 else None,
        "episodes": len(returns),
        "mean_return_last": (sum(last) / len(last)) if last else None,
        "returns": returns,
        "returns_at": ended_at,
        "wrappers": args.wrappers,
        "sf_version": version("sample-factory"),
        "emulator_frames": int(frames) * cfg.env_frameskip,
        "startup_seconds": round(t_first - t0, 3),
        "steady_fps": round(steady, 1) if steady is not None and math.isfinite(steady) else None,
        "shutdown_seconds": round(t_end - t_stop, 3),
        "settings": {**{k: vars(cfg)[k] for k in SETTINGS if k in vars(cfg)},
                     "torch_threads": torch_threads},
    }


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def main() -> None:
    args, extra = build_parser().parse_known_args()
    if any(not a.startswith("--") for a in extra):
        raise SystemExit(f"unrecognised arguments: {extra} (pass Sample Factory options as --name=value)")
    train_dir = args.train_dir or tempfile.mkdtemp(prefix="sf_peer_")
    signal.signal(signal.SIGTERM, _interrupt)  # a SIGTERM (e.g. from timeout) stops SF as Ctrl-C does, cleaning up
    # SF and its worker processes (which inherit fd 1) log to stderr; keep stdout for the one JSON line
    sys.stdout.flush()
    saved_stdout = os.dup(1)
    os.dup2(2, 1)
    try:
        result = train(args, extra, train_dir)
    finally:
        sys.stdout.flush()
        os.dup2(saved_stdout, 1)
        os.close(saved_stdout)
        if args.train_dir is None:
            shutil.rmtree(train_dir, ignore_errors=True)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
