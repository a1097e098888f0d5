"""``python -m launcher.export <run dir> --format onnx``: the policy of a run's checkpoint as one self-contained ONNX
file that runs without this project (``onnxruntime``, or any ONNX runtime), and a JSON file that says how to feed it.

The policy is rebuilt as the run built it: the recipe's own ``make_policy`` from the run's ``resolved_config.yaml``
and the env's spaces, with the checkpoint's weights (``checkpoint.pt``, written where the run set
``launcher.checkpoint_every``). What is exported is the deterministic path, observation in, the most likely action
out:

| policy | outputs (``batch`` rows each; the input is ``observation``) |
| --- | --- |
| actor-critic, discrete actions | ``logits`` (the network's; a softmax gives the probabilities), ``action`` (argmax) |
| actor-critic, continuous | ``mean``, ``log_std`` (per row), ``action`` (the mean clipped to the action bounds) |
| DQN | ``q_values``, ``action`` (argmax: greedy, without exploration) |
| any other | ``action``: the policy's TensorDict forward in the deterministic interaction mode |

``observation`` is one batch of what the env gives after the run's preprocessing (``[batch, 4, 84, 84]`` uint8 grey
frames for ``env=atari``): the graph does what the policy does inside, the scaling of integer observations and the
observation normalisation (``recipe.normalize_observations``: each ``RunningNorm``'s statistics are folded into the
graph as constants). The batch dimension is dynamic.

Beside ``policy.onnx``, ``policy.json`` holds the env id and its preprocessing, the observation and action spaces,
the input and output names, the recipe, and the checkpoint's frames and policy version (the same JSON is in the ONNX
file's metadata, under `METADATA_KEY`). Before it returns, the exporter plays the env for a few steps with the
exported file and checks, on the observations it saw, that ``onnxruntime`` gives the torch policy's actions and
outputs (within `RTOL` and `ATOL`); ``policy.json`` says what it measured under ``check``.

A run directory that is not one, a run without a checkpoint, or an unknown format: one line naming what is wrong,
exit 2 (as the launcher's configuration errors). A check that fails: one line with the figures, exit 1 (the files are
kept, to look at).
"""

from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import logging
import os
import sys
import warnings
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any, Sequence

import torch
from torch import nn

from .saved_run import CHECKPOINT, Run, RunError, read_run

FORMATS = ("onnx",)
"""The formats ``--format`` takes."""

METADATA_KEY = "rl_services_launcher"
"""The ONNX model's metadata entry (``metadata_props``) that holds the JSON of ``policy.json`` (less ``check``)."""

RTOL, ATOL = 1e-4, 1e-5
"""How close ``onnxruntime``'s outputs must be to the torch policy's (``|a - b| <= ATOL + RTOL * |b|``); an action
may differ only on a row whose two best choices are that close."""

CHECK_STEPS = 32
"""Env steps the exporter plays with the exported file to check it."""

PREPROCESSING_FIXED = {"atari": {"grayscale": True, "max_pool_last_two_frames": True,
                                 "layout": "[stack, screen_size, screen_size] uint8, 0-255"}}
"""What an env family's preprocessing always does, beside the settings its config holds (``env.atari``)."""


# ---------------------------------------------------------------------------------------------- errors
class ExportError(RunError):
    """Why a run cannot be exported: one line for the user (exit 2)."""


class UnknownFormat(ExportError):
    """``--format`` names a format the exporter does not write."""


class MissingPackage(ExportError):
    """A package the format needs is not installed (``pip install '.[export]'``)."""


class NotExportable(ExportError):
    """The run's policy cannot be traced (an operation the exporter cannot translate)."""


class CheckFailed(ExportError):
    """``onnxruntime`` disagrees with the torch policy on the observations played (exit 1; the files are kept)."""

    exit_code = 1


# ---------------------------------------------------------------------------------------------- the graph
@dataclass
class PolicyGraph:
    """What is exported of a policy: observations ``[batch, *shape]`` in, the named outputs out.

    Attributes:
        module: the module traced, its running norms folded (`fold_normalization`).
        reference: the same before folding (the policy's own modules: what the exported file is checked against).
        outputs: the output names (`launcher.export`'s table).
        norms: one record per running norm folded (`fold_normalization`).
    """

    module: Any
    reference: Any
    outputs: tuple[str, ...]
    norms: list[dict]


def policy_graph(policy: Any, spec: Any) -> PolicyGraph:
    """The deterministic path of ``policy`` as the module table of `launcher.export` says: the actor-critic's
    network outputs and the most likely action, DQN's Q-values and the greedy action, or (any other policy) the
    action its TensorDict forward takes in the deterministic interaction mode.

    Args:
        policy: a recipe's policy (``make_policy``), with its weights.
        spec: the env's spaces.
    """
    from recipes.actor_critic import Actor
    from recipes.dqn import EpsilonGreedy

    if isinstance(getattr(policy, "actor", None), Actor):
        reference = _ActorHeads(policy.actor, spec)
        outputs = ("logits", "action") if spec.discrete else ("mean", "log_std", "action")
    elif isinstance(policy, EpsilonGreedy):
        reference, outputs = _QHeads(policy.q), ("q_values", "action")
    else:
        reference, outputs = _Deterministic(policy), ("action",)
    module, norms = fold_normalization(reference.eval())
    return PolicyGraph(module.eval(), reference, outputs, norms)


class _ActorHeads(nn.Module):
    def __init__(self, actor: Any, spec: Any):
        super().__init__()
        self.net, self.discrete, self.action_shape = actor.net, spec.discrete, tuple(spec.action_shape)
        if not spec.discrete:
            self.std = actor.log_std  # not named log_std: the output is (an initializer may not share its name)
            low = torch.tensor(spec.action_low, dtype=torch.float32).reshape(self.action_shape)
            high = torch.tensor(spec.action_high, dtype=torch.float32).reshape(self.action_shape)
            self.register_buffer("low", low)
            self.register_buffer("high", high)

    def forward(self, observation):
        out = self.net(observation).float()
        if self.discrete:
            return out, out.argmax(-1)
        action = out.reshape(-1, *self.action_shape)
        return out, self.std.expand_as(out), torch.minimum(torch.maximum(action, self.low), self.high)


class _QHeads(nn.Module):
    def __init__(self, q: Any):
        super().__init__()
        self.q = q

    def forward(self, observation):
        values = self.q(observation).float()
        return values, values.argmax(-1)


class _Deterministic(nn.Module):
    def __init__(self, policy: Any):
        super().__init__()
        self.policy = policy

    def forward(self, observation):
        from tensordict import TensorDict
        from tensordict.nn import InteractionType, set_interaction_type

        td = TensorDict({"observation": observation}, batch_size=observation.shape[:1])
        with set_interaction_type(InteractionType.DETERMINISTIC):
            td = self.policy(td)
        return td.get("action")


class FoldedNorm(nn.Module):
    """A `recipes.networks.RunningNorm`'s standardisation with its statistics as constants: what the running
    norm computes on the CPU once it has seen observations, without the branch on its count.

    Args:
        norm: the running norm (its statistics are copied).
    """

    def __init__(self, norm: Any):
        super().__init__()
        self.register_buffer("mean", norm.mean.detach().clone())
        self.register_buffer("rstd", (norm.var.detach() + norm.eps).rsqrt())
        self.clip = float(norm.clip)

    def forward(self, obs):
        return ((obs.to(self.mean.dtype) - self.mean) * self.rstd).clamp(-self.clip, self.clip)


def fold_normalization(module: Any) -> tuple[Any, list[dict]]:
    """A copy of ``module`` with each `recipes.networks.RunningNorm` replaced by its `FoldedNorm` (by
    the identity where it has seen nothing yet, as the running norm itself is then); ``module`` is left as it is.

    Returns:
        ``(the copy, one record per running norm: its shape, count and whether it was folded)``.
    """
    from recipes.networks import RunningNorm

    folded = copy.deepcopy(module)
    done: dict[int, nn.Module] = {}
    records = []
    for parent in list(folded.modules()):
        for name, child in list(parent._modules.items()):
            if isinstance(child, RunningNorm):
                if id(child) not in done:
                    count = float(child.count)
                    done[id(child)] = FoldedNorm(child) if count > 0 else nn.Identity()
                    records.append({"shape": list(child.mean.shape), "count": count, "folded": count > 0,
                                    "clip": float(child.clip)})
                parent._modules[name] = done[id(child)]
    return folded, records


# ---------------------------------------------------------------------------------------------- export
def export_onnx(run: Run, out_dir: str, *, check_steps: int = CHECK_STEPS) -> dict:
    """Write ``policy.onnx`` and ``policy.json`` into ``out_dir`` (made if missing) and check the file.

    Args:
        run: the run (`read_run`).
        out_dir: where the files go.
        check_steps: env steps played with the exported file to check it (0: no check).

    Returns:
        The metadata written (``policy.json``'s content), with ``onnx`` and ``json`` set to the files' paths.

    Raises:
        MissingPackage: ``onnxscript`` (torch's exporter needs it) is not installed.
        NotExportable: torch's exporter cannot trace or translate the policy.
        CheckFailed: ``onnxruntime`` disagrees with the torch policy (the files are kept).
    """
    graph = policy_graph(run.policy, run.spec)
    meta = metadata(run, graph)
    os.makedirs(out_dir, exist_ok=True)
    onnx_path, json_path = os.path.join(out_dir, "policy.onnx"), os.path.join(out_dir, "policy.json")
    meta["opset"] = write_onnx(graph, run.spec, onnx_path, meta, what=f"recipe {run.recipe.name}'s policy")
    meta["check"] = check(onnx_path, run, graph, check_steps) if check_steps else None
    _write_json(json_path, meta)
    meta.update(onnx=onnx_path, json=json_path)
    if meta["check"] is not None and not meta["check"]["ok"]:
        raise CheckFailed(f"onnxruntime disagrees with the torch policy on {check_steps} steps of the env: "
                          f"{json.dumps(meta['check'])} (files kept in {out_dir})")
    return meta


def write_onnx(graph: PolicyGraph, spec: Any, path: str, meta: dict | None = None, *, what: str = "the policy") -> int:
    """Trace ``graph`` with torch's exporter (``torch.onnx.export(dynamo=True)``, a dynamic batch dimension) and write
    it to ``path`` as one file, the weights inside; ``meta`` goes into its metadata as JSON (`METADATA_KEY`).

    Args:
        graph: what to export (`policy_graph`).
        spec: the env's spaces (the input's shape and dtype).
        path: the ``.onnx`` file (replaced whole, or left as it was).
        meta: the metadata to embed, or ``None``.
        what: how errors name the policy.

    Returns:
        The ONNX opset of the file.

    Raises:
        MissingPackage: ``onnx`` or ``onnxscript`` (torch's exporter needs them) is not installed.
        NotExportable: torch's exporter cannot trace or translate the policy.
    """
    for package in ("onnx", "onnxscript"):
        if importlib.util.find_spec(package) is None:
            raise MissingPackage(f"--format onnx needs {package} (torch's exporter uses it): pip install '.[export]'")
    example = torch.zeros((2, *spec.observation_shape), dtype=spec.observation_dtype)
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # its notes on torchvision's operators it skips
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            program = torch.onnx.export(graph.module, (example,), None, input_names=["observation"],
                                        output_names=list(graph.outputs), dynamo=True,
                                        dynamic_shapes=({0: torch.export.Dim("batch")},), verbose=False, optimize=True)
    except ImportError as exc:
        raise MissingPackage(f"--format onnx: {exc}: pip install '.[export]'") from None
    except Exception as exc:  # noqa: BLE001 - torch.export or the translation refused the policy: say so in a line
        raise NotExportable(f"torch's ONNX exporter cannot export {what}: {_summary(exc)}") from exc
    opset = int(program.model.opset_imports.get("", 0))
    if meta is not None:
        program.model.metadata_props[METADATA_KEY] = json.dumps({**meta, "opset": opset})
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        program.save(tmp, external_data=False)  # the weights inside: one file
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return opset


def _summary(exc: BaseException) -> str:
    """The line of an exporter's error that says what failed (its exception summary where it gives one)."""
    import re

    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in str(exc).splitlines()]
    lines = [line for line in lines if line]
    if "## Exception summary" in lines[:-1]:
        return lines[lines.index("## Exception summary") + 1]
    return lines[0] if lines else type(exc).__name__


def metadata(run: Run, graph: PolicyGraph) -> dict:
    """What ``policy.json`` says of the exported policy (without the check): see `launcher.export`."""
    from omegaconf import OmegaConf

    spec = run.spec
    env = OmegaConf.to_container(run.config.env, resolve=True)
    preprocessing = None
    if run.maker.preprocessing is not None:
        family, settings = run.maker.preprocessing.family, run.maker.preprocessing.config
        preprocessing = {"family": family.name, **(asdict(settings) if is_dataclass(settings) else dict(settings)),
                         **PREPROCESSING_FIXED.get(family.name, {})}
    observation = {"shape": list(spec.observation_shape), "dtype": _dtype(spec.observation_dtype),
                   "scale": spec.observation_scale}
    if spec.discrete:
        action = {"discrete": True, "n": spec.n_actions, "shape": [], "dtype": "int64"}
    else:
        action = {"discrete": False, "shape": list(spec.action_shape), "dtype": "float32",
                  "low": list(spec.action_low), "high": list(spec.action_high)}
    batch = ["batch"]
    shapes = {"logits": [*batch, spec.n_actions], "q_values": [*batch, spec.n_actions],
              "mean": [*batch, _flat(spec.action_shape)], "log_std": [*batch, _flat(spec.action_shape)],
              "action": [*batch, *spec.action_shape]}
    dtypes = {"action": action["dtype"]}
    return {
        "format": "onnx",
        "file": "policy.onnx",
        "recipe": run.title,
        "encoder": _encoder(run),
        "env": {"id": spec.env_id, "backend": env.get("backend"), "kwargs": env.get("kwargs") or {},
                "preprocessing": preprocessing},
        "observation_space": observation,
        "action_space": action,
        "inputs": [{"name": "observation", "shape": [*batch, *spec.observation_shape], "dtype": observation["dtype"]}],
        "outputs": [{"name": name, "shape": shapes[name], "dtype": dtypes.get(name, "float32")}
                    for name in graph.outputs],
        "observation_normalization": graph.norms or None,
        "checkpoint": {"path": os.path.join(run.run_dir, CHECKPOINT), "frames": run.frames,
                       "policy_version": run.policy_version, "weights": run.weights_from},
        "run_dir": run.run_dir,
        "torch": torch.__version__,
    }


def _encoder(run: Run) -> str | None:
    from recipes.networks import choose

    cfg, spec = run.recipe_config, run.spec
    if getattr(cfg, "network", None) is not None:
        return "recipe.network"
    name = getattr(cfg, "encoder", None)
    return None if name is None else choose(name, spec.observation_shape, preferred=spec.encoder)


def _flat(shape: Sequence[int]) -> int:
    import math

    return math.prod(shape)


def _dtype(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def _write_json(path: str, data: dict) -> None:
    from .report import strict_json

    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(strict_json(data), f, indent=2, allow_nan=False)
        f.write("\n")
    os.replace(tmp, path)


# ---------------------------------------------------------------------------------------------- check
def play(maker: Any, spec: Any, act: Any, steps: int, seed: int = 0) -> Any:
    """Observations of ``steps`` env steps (one env, made as the run's collectors make theirs), acting with ``act``
    (observations ``[1, *shape]`` -> actions ``[1, ...]`` as numpy). Returns them as one ``[steps, *shape]`` tensor
    of the spec's dtype."""
    import numpy as np

    env = maker.vector(1)
    try:
        obs, _ = env.reset(seed=seed)
        seen = []
        for _ in range(steps):
            tensor = torch.as_tensor(np.asarray(obs)).to(spec.observation_dtype)
            seen.append(tensor)
            obs, *_ = env.step(np.asarray(act(tensor)))
        return torch.cat(seen)
    finally:
        env.close()


def check(onnx_path: str, run: Run, graph: PolicyGraph, steps: int) -> dict | None:
    """Play ``steps`` env steps with the exported file, then compare it with the torch policy on what was seen:
    each output with ``graph.reference`` (the policy's own modules, its running norms as they are), and ``action``
    with the action the policy's TensorDict forward takes in the deterministic interaction mode.

    Returns:
        What was measured: the largest difference of each output, how many actions agree, whether all is within
        `RTOL` and `ATOL` (``ok``); ``None`` where ``onnxruntime`` is not installed.
    """
    if importlib.util.find_spec("onnxruntime") is None:
        return None
    import numpy as np
    import onnxruntime
    from tensordict import TensorDict
    from tensordict.nn import InteractionType, set_interaction_type

    session = onnxruntime.InferenceSession(onnx_path, providers=["CPUExecutionProvider"])

    def act(obs):
        return session.run(["action"], {"observation": obs.numpy()})[0]

    seen = play(run.maker, run.spec, act, steps)
    outputs = graph.outputs
    got = dict(zip(outputs, session.run(list(outputs), {"observation": seen.numpy()})))
    with torch.no_grad(), set_interaction_type(InteractionType.DETERMINISTIC):
        expected = graph.reference(seen)
        expected = {name: value.detach().numpy() for name, value in
                    zip(outputs, expected if isinstance(expected, tuple) else (expected,))}
        td = run.policy(TensorDict({"observation": seen.clone()}, batch_size=[len(seen)]))
    policy_action = td.get("action")
    if not run.spec.discrete:
        policy_action = policy_action.reshape(-1, *run.spec.action_shape).clamp(
            torch.tensor(run.spec.action_low).reshape(run.spec.action_shape),
            torch.tensor(run.spec.action_high).reshape(run.spec.action_shape))
    report: dict = {"steps": steps, "onnxruntime": onnxruntime.__version__, "rtol": RTOL, "atol": ATOL,
                    "max_abs_diff": {}}
    ok = True
    for name in outputs:
        diff = np.abs(got[name].astype(np.float64) - expected[name].astype(np.float64))
        report["max_abs_diff"][name] = float(diff.max()) if diff.size else 0.0
        if name != "action":
            ok &= bool(np.allclose(got[name], expected[name], rtol=RTOL, atol=ATOL))
    scores = next((got[n] for n in ("logits", "q_values") if n in got), None)
    equal, tie = _agree(got["action"], policy_action.numpy(), scores, run.spec.discrete)
    report["actions_equal"] = int(equal.sum())
    report["differ_at_near_ties"] = int((~equal & tie).sum())
    report["ok"] = ok and bool((equal | tie).all())
    return report


def _agree(got: Any, expected: Any, scores: Any, discrete: bool) -> tuple[Any, Any]:
    """Per row, whether the actions agree (discrete: equal; continuous: within `RTOL` and `ATOL`), and
    whether the row's two best scores lie that close to each other (a near tie, where either action is the most
    likely one within rounding)."""
    import numpy as np

    if discrete:
        equal = np.asarray(got == expected).reshape(len(got), -1).all(-1)
    else:
        equal = np.isclose(got, expected, rtol=RTOL, atol=ATOL).reshape(len(got), -1).all(-1)
    tie = np.zeros_like(equal)
    if scores is not None and scores.shape[-1] > 1:
        top = np.sort(scores, -1)
        tie = (top[:, -1] - top[:, -2]) <= ATOL + RTOL * np.abs(top[:, -1])
    return equal, tie


# ---------------------------------------------------------------------------------------------- command line
def arguments() -> argparse.ArgumentParser:
    """The command line's parser."""
    parser = argparse.ArgumentParser(prog="python -m launcher.export", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="the run directory (it holds resolved_config.yaml and checkpoint.pt)")
    parser.add_argument("--format", default="onnx", help=f"what to write: {', '.join(FORMATS)} (default: onnx)")
    parser.add_argument("--output", default=None, help="where the files go (default: <run dir>/export)")
    parser.add_argument("--check-steps", type=int, default=CHECK_STEPS,
                        help=f"env steps played with the exported file to check it (default {CHECK_STEPS}; 0: none)")
    return parser


def export(run_dir: str, fmt: str = "onnx", output: str | None = None, check_steps: int = CHECK_STEPS) -> dict:
    """Export a run's policy (what ``python -m launcher.export`` does).

    Args:
        run_dir: the run directory.
        fmt: the format (`FORMATS`).
        output: where the files go (default: ``<run dir>/export``).
        check_steps: env steps played with the exported file to check it (0: no check).

    Returns:
        The metadata written, with the files' paths (``onnx``, ``json``).

    Raises:
        RunError: what cannot be read or exported, and why (see the subclasses of it and of ExportError).
    """
    if fmt not in FORMATS:
        raise UnknownFormat(f"--format {fmt!r} is not a format this exports: {', '.join(FORMATS)}")
    if check_steps < 0:
        raise ExportError(f"--check-steps must be >= 0, got {check_steps}")
    run = read_run(run_dir)
    return export_onnx(run, output or os.path.join(run.run_dir, "export"), check_steps=check_steps)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of ``python -m launcher.export``: exits 2 with one line for what cannot be exported, 1 for a
    failed check."""
    args = arguments().parse_args(argv)
    try:
        meta = export(args.run_dir, args.format, args.output, args.check_steps)
    except RunError as exc:
        print(f"export error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)  # one line
        sys.exit(exc.exit_code)
    names = ", ".join(o["name"] for o in meta["outputs"])
    checked = meta["check"]
    line = (f"checked on {checked['steps']} env steps with onnxruntime {checked['onnxruntime']}: the torch policy's "
            f"actions, largest difference {max(checked['max_abs_diff'].values()):.2g}" if checked else
            "not checked (no onnxruntime here, or --check-steps 0)")
    print(f"exported {meta['recipe']} on {meta['env']['id']} at {meta['checkpoint']['frames']:,} frames "
          f"(policy version {meta['checkpoint']['policy_version']}): {meta['onnx']} (observation -> {names}), "
          f"{meta['json']}; {line}", flush=True)


if __name__ == "__main__":
    main()
