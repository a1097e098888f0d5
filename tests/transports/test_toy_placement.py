"""Adding a placement is its module and its cells: a placement written outside the project (``toy``, see
:mod:`tests.transports.toy_placement`) is a name everywhere, planned, printed and run like a built-in one, with
nothing of the project edited."""

from __future__ import annotations

import pytest

from components import compat, service_backend
from components.hosts import HOSTS, host_class
from transports.kernel.errors import ConfigurationError
from transports.kernel.placements import Placement, Reach, normalize_placement, register
from transports.kinds import reaches

from tests.transports.toy_placement import toy_placement

ON_TOY = ("components.inference.placement=toy", "components.replay.placement=toy")


@pytest.fixture
def toy(tmp_path):
    with toy_placement(str(tmp_path)) as module:
        yield module
    assert "toy" not in HOSTS  # taken back: the next test sees the project as it is
    with pytest.raises(ConfigurationError, match="unknown placement 'toy'"):
        normalize_placement("toy")


def test_a_registered_placement_is_a_name_everywhere_and_its_cells_list_it(toy):
    assert normalize_placement("Toy") == "toy" and normalize_placement("toy-box") == "toy"
    assert host_class("toy") is toy.ToyHost and list(HOSTS)[-1] == "toy"
    assert reaches("thread", "toy") and not reaches("thread", "process")
    assert "toy" in compat.built_placements("inference") and "toy" not in compat.placements_of("logger")
    rows = {(c, p): kinds for c, p, kinds, _ in compat.matrix_rows()}
    assert rows[("replay", "toy")] == "thread" and rows[("logger", "toy")] == "rejected"
    with service_backend("toy_box"):
        from components.scope import choose_placement

        assert choose_placement(None, "direct").value == "toy"


def test_a_name_taken_is_refused(toy):
    with pytest.raises(ValueError, match="'threading' is taken"):
        register(Placement("other", toy.ToyHost, Reach.PROCESS, aliases=("threading",)))
    assert "other" not in HOSTS


def test_a_plan_with_it_is_resolved_and_printed(toy, compose_cfg):
    from launcher.plan import build_plan

    plan = build_plan(compose_cfg("+recipe=ppo", *ON_TOY))
    assert (plan["inference"].placement, plan["replay"].placement) == ("toy", "toy")
    assert (plan["inference"].transport, plan["replay"].transport) == ("thread", "thread")
    row = next(line.split() for line in plan.render().splitlines() if line.split()[1:2] == ["replay"])
    assert "toy" in row
    with pytest.raises(ConfigurationError, match="cannot be placed on 'toy'"):
        build_plan(compose_cfg("+recipe=ppo", "components.logger.placement=toy"))


def test_a_run_trains_on_it(toy, compose_cfg, tmp_path):
    from launcher.plan import build_plan
    from launcher.run import execute

    cfg = compose_cfg("+recipe=ppo", *ON_TOY, "recipe.total_frames=1024", "recipe.target_return=null",
                      "launcher.progress=false")
    owners = {}
    result = execute(build_plan(cfg), str(tmp_path), on_started=owners.update)
    assert result["frames"] == 1024
    assert {name: type(owner.host).__name__ for name, owner in owners.items() if name in TAKES} == \
        {"inference": "ToyHost", "replay": "ToyHost"}
    assert not any(owner.is_alive for owner in owners.values())


TAKES = ("inference", "replay")
