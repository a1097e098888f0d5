"""Adding a transport is its module and its cells: a transport written outside the project (``toy``, see
:mod:`tests.transports.toy`) is planned, checked, printed and run like a built-in one, with nothing of the project
edited. The transport contract suite (``test_contract.py``) runs it too."""

from __future__ import annotations

import pytest

from components import compat
from transports import registry
from transports.kernel.errors import ConfigurationError
from transports.kinds import normalize_transport_kind, transport_kinds

from tests.transports.toy import toy_transport

ON_TOY = ("components.inference.placement=thread", "components.inference.transport=toy",
          "components.replay.placement=thread", "components.replay.transport=toy")


@pytest.fixture
def toy(tmp_path):
    with toy_transport(str(tmp_path)) as module:
        yield module
    assert "toy" not in transport_kinds()  # taken back: the next test sees the project as it is


def test_a_registered_transport_is_a_name_everywhere_and_its_cells_list_it(toy):
    assert normalize_transport_kind("Toy") == "toy" and "toy" in transport_kinds()
    assert registry.describe("toy") is toy.DESCRIPTOR
    assert "toy" in compat.TABLE[("inference", "thread")].transports
    rows = {(c, p): kinds for c, p, kinds, _ in compat.matrix_rows()}
    assert "toy" in rows[("replay", "thread")] and "toy" not in rows[("replay", "process")]


def test_a_plan_with_it_is_resolved_checked_and_printed(toy, compose_cfg):
    from launcher.plan import build_plan

    plan = build_plan(compose_cfg("+recipe=ppo", *ON_TOY))
    assert (plan["inference"].transport, plan["replay"].transport) == ("toy", "toy")
    assert plan["inference"].transport_reason == "explicit"
    row = next(line.split() for line in plan.render().splitlines() if line.split()[1:2] == ["inference"])
    assert "toy" in row
    with pytest.raises(ConfigurationError, match="capacity must be >= 1, got 0") as info:
        build_plan(compose_cfg("+recipe=ppo", *ON_TOY, "+components.inference.transport_options.capacity=0"))
    assert info.value.path == "components.inference.transport_options.capacity"
    with pytest.raises(ConfigurationError, match="does not support transport 'toy'") as info:
        build_plan(compose_cfg("+recipe=ppo", "components.replay.placement=process", "components.replay.transport=toy"))
    assert "toy" not in info.value.alternatives  # the process cell does not take it


def test_a_run_trains_over_it(toy, compose_cfg, tmp_path):
    from launcher.plan import build_plan
    from launcher.run import execute

    cfg = compose_cfg("+recipe=ppo", *ON_TOY, "recipe.total_frames=1024", "recipe.target_return=null",
                      "launcher.progress=false")
    owners = {}
    result = execute(build_plan(cfg), str(tmp_path), on_started=owners.update)
    assert result["frames"] == 1024
    assert {name: owner.transport_kind for name, owner in owners.items() if name in ("inference", "replay")} == \
        {"inference": "toy", "replay": "toy"}
    assert not any(owner.is_alive for owner in owners.values())
