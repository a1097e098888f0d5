"""The owner/client contract, run against every component in every placement built so far.

Later placements add their factories to ``PLACEMENTS``; the assertions stay the same.
"""

import pickle

import pytest

from components import compat
from components.hosts import HOSTS
from components.hosts.process import context as process_context
from components.service import LIFECYCLE_METHODS, Service

from tests.helpers import PLACEMENT_FIXTURES, SLOW_PLACEMENTS
from tests.factories import owner_factories

PLACEMENTS = list(HOSTS)  # every placement with a host; a new one is tested the day it is registered
COMPONENTS = list(owner_factories("/tmp").keys())
# every (placement, component) the table says is built; nothing is skipped
CASES = [(p, c) for p in PLACEMENTS for c in COMPONENTS
         if (c.split("/")[0], p) in compat.TABLE and compat.TABLE[(c.split("/")[0], p)].built]


@pytest.fixture(params=[pytest.param(case, marks=[pytest.mark.slow] if case[0] in SLOW_PLACEMENTS else [])
                        for case in CASES], ids=[f"{p}-{c}" for p, c in CASES])
def owner_factory(request, tmp_path):
    placement, component = request.param
    if placement in PLACEMENT_FIXTURES:  # one Ray cluster for the session; submitit's local executor
        request.getfixturevalue(PLACEMENT_FIXTURES[placement])
    return placement, owner_factories(tmp_path, placement)[component]


def test_lifecycle_start_once_ready_alive_then_stopped_for_good_and_the_client_is_picklable_and_restricted(
        owner_factory):
    # one start per case (a Ray owner's start takes seconds): every lifecycle promise, and the client's, on one owner
    placement, factory = owner_factory
    owner = factory()
    assert isinstance(owner, Service)
    assert not owner.is_alive
    try:
        assert owner.start() is owner
        assert owner.is_alive
        assert owner.placement == placement
        with pytest.raises(RuntimeError, match="start\\(\\) called twice"):
            owner.start()
        _check_client(owner, placement)
    finally:
        owner.shutdown()
    assert not owner.is_alive
    owner.shutdown()  # idempotent
    owner.shutdown(timeout=1.0)
    assert not owner.is_alive
    with pytest.raises(RuntimeError):
        owner.start()  # a stopped owner does not restart either
    with pytest.raises(RuntimeError):
        owner.client()  # nor hand out clients


def test_shutdown_is_safe_before_start(owner_factory):
    _, factory = owner_factory
    never_started = factory()
    never_started.shutdown()
    never_started.shutdown()
    assert not never_started.is_alive


def test_client_needs_a_running_owner(owner_factory):
    _, factory = owner_factory
    owner = factory()
    with pytest.raises(RuntimeError, match="needs a started owner"):
        owner.client()


QUICK_CASES = [(p, c) for p, c in CASES if p not in SLOW_PLACEMENTS]


@pytest.mark.parametrize("placement, component", QUICK_CASES, ids=[f"{p}-{c}" for p, c in QUICK_CASES])
def test_the_context_manager_starts_and_stops(placement, component, tmp_path):
    # the Owner base's own code, the same for every placement: checked where an owner starts in milliseconds
    with owner_factories(tmp_path, placement)[component]() as owner:
        assert owner.is_alive
    assert not owner.is_alive


def _check_client(owner, placement):
    """A remote client has no lifecycle methods and travels (by pickling, or to a child process); a direct
    owner is its own client and refuses to travel."""
    client = owner.client()
    if placement == "direct":
        assert client is owner  # no proxy in one process
        with pytest.raises(TypeError, match="'direct' owner is its own client and works only inside its process"):
            pickle.dumps(client)
        return
    for name in LIFECYCLE_METHODS:
        assert not hasattr(client, name), f"client exposes lifecycle method {name!r}"
    if type(client).__name__ == "CollectorClient":  # iterated in the driver only
        with pytest.raises(TypeError, match="iterated in the driver"):
            pickle.dumps(client)
        return
    if placement == "thread" or not _needs_inheritance(client):
        clone = pickle.loads(pickle.dumps(client))
    else:  # multiprocessing queues and semaphores travel to worker processes as Process arguments
        clone = _through_a_child(client)
    assert type(clone) is type(client)


def _needs_inheritance(client) -> bool:
    try:
        pickle.dumps(client)
    except RuntimeError as exc:
        assert "inheritance" in str(exc)
        return True
    return False


def _echo_type(client, queue):
    queue.put(type(client).__name__)


def _through_a_child(client):
    ctx = process_context()  # the preloaded forkserver owners use: a child starts in milliseconds
    queue = ctx.Queue()
    child = ctx.Process(target=_echo_type, args=(client, queue))
    child.start()
    name = queue.get(timeout=60)
    child.join(timeout=30)
    queue.close()
    queue.join_thread()
    assert child.exitcode == 0 and name == type(client).__name__
    return client


def test_owners_stay_where_they_were_created(owner_factory):
    _, factory = owner_factory
    owner = factory()
    with pytest.raises(TypeError, match="cannot pickle"):
        pickle.dumps(owner)
