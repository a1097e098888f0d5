"""The compatibility table: every cell, and the messages users see."""

import itertools
import os

import pytest

from components import compat
from components.errors import IncompatibleCombinationError, NotImplementedYetError
from components.hosts import HOSTS
from components.replay import ReplayBuffer, ReplayConfig
from components.resolution import resolve_component
from launcher.matrix import README_BEGIN, README_END
from transports import TransportConfig, transport_kinds
from transports.resolver import TransportContext

from tests.helpers import ROOT

PLACEMENTS = tuple(HOSTS)  # every registered placement
ALL = list(itertools.product(compat.COMPONENTS, PLACEMENTS, [k for k in transport_kinds() if k != "auto"]))


@pytest.mark.parametrize("component, placement, kind", ALL)
def test_every_cell_resolves_or_is_rejected(component, placement, kind):
    cell = compat.TABLE.get((component, placement))
    ctx = TransportContext(placement, layouts_known=True, path=f"components.{component}.transport")
    if cell is None:
        with pytest.raises(IncompatibleCombinationError) as info:
            compat.resolve(component, kind, ctx)
        assert f"{component} cannot be placed on {placement!r}" in str(info.value)
        return
    if not cell.takes_transport:
        with pytest.raises(IncompatibleCombinationError, match="takes no transport"):
            compat.resolve(component, kind, ctx)
        return
    if kind in cell.transports:
        resolution = compat.resolve(component, kind, ctx)
        assert resolution.kind == kind and resolution.reason == "explicit"
        assert compat.status(component, placement, kind) in (compat.SUPPORTED, compat.NOT_YET)
    else:
        with pytest.raises(IncompatibleCombinationError) as info:
            compat.resolve(component, kind, ctx)
        message = str(info.value)
        assert f"{component} placed on {placement!r} does not support transport {kind!r}" in message
        assert f"full_key: components.{component}.transport" in message
        assert "supported: auto, " in message


@pytest.mark.parametrize("component, placement", sorted(compat.TABLE))
def test_auto_resolves_to_a_listed_transport(component, placement):
    cell = compat.TABLE[(component, placement)]
    for known in (True, False):
        resolution = compat.resolve(component, "auto", TransportContext(placement, layouts_known=known))
        if cell.takes_transport:
            assert resolution.kind in cell.transports
            assert resolution.reason.startswith("auto: ")
        else:
            assert resolution.kind == compat.NO_TRANSPORT


def test_auto_rules_pinned():
    def auto(component, placement, **kw):
        return compat.resolve(component, None, TransportContext(placement, **kw)).kind

    assert auto("inference", "direct") == "direct"
    assert auto("inference", "thread") == "thread"
    assert auto("inference", "process", layouts_known=True) == "shared_memory"
    assert auto("inference", "process", layouts_known=True, one_request_per_worker=True) == "process_slot"
    assert auto("inference", "process", layouts_known=False) == "queue"
    assert auto("inference", "ray") == "ray"
    assert auto("replay", "process", layouts_known=True) == "shared_memory"
    assert auto("replay", "process") == "queue"
    assert auto("logger", "process", layouts_known=True) == "queue"
    assert auto("weight_sync", "process") == "shared_memory"
    assert auto("inference", "distributed") == "distributed"


def test_pinned_messages():
    with pytest.raises(IncompatibleCombinationError) as info:
        compat.resolve("inference", "shared_memory", TransportContext("ray", path="transport"))
    assert str(info.value) == (
        "inference placed on 'ray' does not support transport 'shared_memory'\n"
        "    supported: auto, ray, distributed\n"
        "    full_key: transport"
    )
    with pytest.raises(IncompatibleCombinationError) as info:
        compat.get_cell("logger", "submitit", path="components.logger.placement")
    assert str(info.value) == (
        "logger cannot be placed on 'submitit'\n"
        "    supported: direct, thread, process, ray, monarch\n"
        "    full_key: components.logger.placement"
    )
    with pytest.raises(NotImplementedYetError) as info:
        compat.ensure_built("inference", "distributed", "distributed", path="components.inference.placement")
    assert str(info.value) == (
        "inference placed on 'distributed' over transport 'distributed' is not implemented yet\n"
        "    supported: direct, thread, process, ray, monarch\n"
        "    full_key: components.inference.placement"
    )
    with pytest.raises(IncompatibleCombinationError) as info:  # a placement the table plans is not offered as built
        compat.get_cell("replay", "rpc", path="components.replay.placement")
    assert str(info.value) == (
        "replay cannot be placed on 'rpc' (planned, not built yet: distributed)\n"
        "    supported: direct, thread, process, ray, monarch\n"
        "    full_key: components.replay.placement"
    )


def test_one_resolution_per_component_through_the_table():
    for component in ("inference", "replay", "logger", "weight_sync"):
        resolved = resolve_component(component, "direct", TransportConfig("auto"))
        assert (resolved.placement, resolved.transport, resolved.placement_from) == ("direct", "direct", "explicit")
        assert resolved.transport_reason.startswith("auto: ") and resolved.built
    with pytest.raises(IncompatibleCombinationError, match="logger placed on 'process' does not support transport"):
        resolve_component("logger", "process", "shared_memory")


def test_owner_construction_checks_the_table_before_anything_starts():
    with pytest.raises(NotImplementedYetError, match="replay placed on 'distributed' over transport 'distributed'"):
        ReplayBuffer(ReplayConfig(capacity=8, placement="distributed"), transport="distributed")
    with pytest.raises(IncompatibleCombinationError, match="does not support transport 'process_slot'"):
        ReplayBuffer(ReplayConfig(capacity=8, placement="process"), transport="process_slot")
    with pytest.raises(IncompatibleCombinationError, match="cannot be placed on 'submitit'"):
        ReplayBuffer(ReplayConfig(capacity=8, placement="submitit"))
    buffer = ReplayBuffer(ReplayConfig(capacity=8), transport=TransportConfig("direct"))
    assert (buffer.placement, buffer.transport_kind, buffer.transport_config.kind) == ("direct", "direct", "direct")


def test_matrix_cli_prints_the_table(capsys):
    from launcher import matrix

    matrix.main()
    out = capsys.readouterr().out
    assert out.strip() == compat.render_markdown()
    assert out.count("\n") == len(compat.COMPONENTS) * len(PLACEMENTS) + 2


def test_readme_holds_the_same_table():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert README_BEGIN in text and README_END in text, "README.md lacks the matrix markers"
    inside = text.split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip()
    assert inside == compat.render_markdown(), "README matrix is stale: paste the output of python -m launcher.matrix"
