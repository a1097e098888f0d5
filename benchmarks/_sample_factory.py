"""Sample Factory 2.1.1's APPO as a peer of ours on Atari (``benchmarks/sample_factory_peer.py``, run by the
interpreter of its own venv), making the update our APPO makes: used by ``learning.py`` and ``impala_atari.py``."""

from __future__ import annotations

import os

from _harness import HERE, compose_launcher, peer_json


def sample_factory_update(overrides: list[str] = ()) -> list[str]:
    """Sample Factory's arguments for the update our APPO makes on Atari (``+recipe=appo env=atari``, settings
    ``conf/recipe_env/appo_atari.yaml``, with the launcher ``overrides`` composed in): its samples per update,
    minibatches and passes."""
    cfg = compose_launcher(["+recipe=appo", "env=atari", *overrides]).recipe
    return ["--batch-size", str(cfg.batch_size * cfg.unroll_length), "--minibatches", str(cfg.num_minibatches),
            f"--num_epochs={cfg.update_epochs}"]


def sample_factory_appo(python: str, frames: int, seed: int, timeout: float, wrappers: str = "sf",
                        env: str = "atari_breakout", overrides: list[str] = ()) -> dict:
    """Sample Factory 2.1.1's APPO on an Atari game (``benchmarks/sample_factory_peer.py``, run by ``python``, the
    interpreter of its own venv) for ``frames`` agent steps, making the update our APPO makes on Atari
    (`sample_factory_update`, ``overrides`` applied). ``wrappers``: ``sf`` for SF's own Atari stack, ``ours``
    for the game as ``env=atari`` plays it. The peer's JSON result."""
    update = sample_factory_update(overrides)
    return peer_json([python, os.path.join(HERE, "sample_factory_peer.py"), "--frames", str(frames),
                      "--seed", str(seed), "--wrappers", wrappers, "--env", env, *update], timeout, quiet=True)
