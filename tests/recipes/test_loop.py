"""recipes.base.Loop: what the checkpoint keeps under its own names cannot be overwritten by a recipe's names."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from recipes import Clients, Loop
from recipes.configs import PPOConfig
from tests.factories import CartPolePolicy, owner_factories


@pytest.fixture
def clients(tmp_path):
    """Real direct owners for what ``Loop.start`` and ``end_batch`` call (weight sync, logger)."""
    owners = owner_factories(tmp_path)
    with ExitStack() as stack:
        weight_sync = stack.enter_context(owners["weight_sync"]())
        logger = stack.enter_context(owners["logger/csv"]())

        class Progress:
            def update(self, frames, **metrics):
                pass

        yield Clients(policy=None, collector=[], replay=None, logger=logger.client(),
                      weight_sync=weight_sync.client(), env_spec=None, progress=Progress())


def test_a_kept_object_named_like_the_loops_own_state_is_refused(clients):
    net = CartPolePolicy()
    with pytest.raises(ValueError, match=r"Loop.start: rng name what the checkpoint keeps for the loop itself"):
        Loop(PPOConfig(), clients).start(net, net=net, rng=net)


def test_a_value_named_like_a_kept_object_is_refused_at_the_batch_boundary(clients):
    net = CartPolePolicy()
    loop = Loop(PPOConfig(), clients)
    assert loop.start(net, net=net) == {}
    assert loop.end_batch(None, updates=1) is False  # a value of its own name is kept
    with pytest.raises(ValueError, match=r"Loop.end_batch: values named net, stats would overwrite"):
        loop.end_batch(None, net=1, stats=2)
