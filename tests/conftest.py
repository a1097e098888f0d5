"""Shared fixtures: composing the real config tree, leak checks, and one Ray cluster for the session.

Plain helpers (bounded waits, the CLI, process states) live in ``tests/helpers.py``; small real building blocks
(policies, env factories, owners) in ``tests/factories.py``.
"""

from __future__ import annotations

import os
import sys

# The checkout under test comes first, here and in every child: multiprocessing children get this sys.path, Ray
# workers and ``python -m launcher`` subprocesses get PYTHONPATH. So ``tests`` and the packages are this tree's.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if sys.path[0] != ROOT:
    sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [ROOT, *(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != ROOT)])
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # before Ray is first imported: loopback only

import shutil  # noqa: E402
import threading  # noqa: E402
from contextlib import ExitStack  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402
from hydra import compose, initialize_config_module  # noqa: E402

import launcher.schema  # noqa: E402
from launcher.conventions import normalize_argv  # noqa: E402

from tests import startup  # noqa: E402
from tests.helpers import our_live_actors, wait_until  # noqa: E402

pytest_plugins = ["tests.slurm"]  # the one-node Slurm of the slurm tests (local_slurm)


def pytest_configure(config):
    # The process that runs the session (the xdist controller, or the only process) names the run, so its workers
    # and it agree on who started a Slurm for it (tests/slurm.py).
    if not hasattr(config, "workerinput"):
        run = os.environ.setdefault("PYTEST_XDIST_TESTRUNUID", os.urandom(8).hex())
        if hasattr(config.option, "testrunuid") and config.option.testrunuid is None:
            config.option.testrunuid = run


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # every worker has ended: a Slurm this run started stops now
        from tests.slurm import stop_if_started_by

        stop_if_started_by(os.environ["PYTEST_XDIST_TESTRUNUID"])

launcher.schema.register()
torch.set_num_threads(1)


@pytest.fixture
def compose_cfg():
    """compose_cfg(*overrides) -> the composed DictConfig, exactly as ``python -m launcher`` builds it."""

    def _compose(*overrides: str):
        with initialize_config_module(config_module="conf", version_base=None):
            return compose(config_name="config", overrides=normalize_argv(list(overrides)))

    return _compose


@pytest.fixture(autouse=True)
def startup_cost(request, monkeypatch):
    """A test not marked ``slow`` may not start what costs seconds (tests/startup.py says what): the quick loop stays
    quick, and a module that forgets its marker fails here, naming what it started."""
    if request.node.get_closest_marker("slow") is None:
        startup.guard(monkeypatch, request.node.nodeid)
    yield


@pytest.fixture(autouse=True)
def no_leaked_threads():
    """Every test leaves no thread of ours behind."""
    before = set(threading.enumerate())
    yield
    leaked = [t for t in threading.enumerate() if t not in before and t.is_alive() and not t.daemon]
    assert not leaked, f"threads left running: {leaked}"


# ---------------------------------------------------------------------------------------------- Ray
class SharedRayCluster:
    """The session's local Ray cluster on 127.0.0.1, in a temp dir of its own: started on first use, stopped at
    the end of the session, or earlier by a test that needs a cluster of its own (``stop``; the next user starts
    a fresh one). A cold start costs 3-6 s and a shutdown ~1.5 s, so the tests share it."""

    def __init__(self):
        self._stack: ExitStack | None = None

    @property
    def running(self) -> bool:
        return self._stack is not None

    def ensure(self) -> None:
        if self._stack is not None:
            return
        from components.hosts.ray import RayClusterConfig, ray_cluster
        from transports.ray import import_ray

        ray = import_ray()
        assert not ray.is_initialized(), "another Ray connection is open: whoever opened it must close it"
        temp_dir = f"/tmp/rt{os.getpid()}_{os.urandom(2).hex()}"  # short: Ray's Unix sockets live there
        stack = ExitStack()
        stack.callback(shutil.rmtree, temp_dir, ignore_errors=True)  # the session's logs and sockets
        try:
            started = stack.enter_context(ray_cluster(RayClusterConfig(num_cpus=2, temp_dir=temp_dir, namespace="tests")))
            assert started
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def stop(self) -> None:
        """Stop the cluster (if running); no actor of ours may be alive at that point."""
        if self._stack is None:
            return
        stack, self._stack = self._stack, None
        with stack:
            try:
                wait_until(lambda: our_live_actors() == [], timeout=10)
            except AssertionError:
                assert our_live_actors() == [], "actors left alive"


@pytest.fixture(scope="session")
def shared_ray():
    """The session's :class:`SharedRayCluster` (not started by this fixture)."""
    shared = SharedRayCluster()
    yield shared
    shared.stop()


@pytest.fixture(scope="module")
def ray_session(shared_ray):
    """A running shared cluster, for module fixtures that hold owners across tests (ensured per module: a module with
    a cluster of its own may have stopped it since, on this worker)."""
    shared_ray.ensure()
    return shared_ray


@pytest.fixture
def submitit_local(tmp_path):
    """Hosts on ``submitit`` submit to submitit's local executor (real jobs as subprocesses, no Slurm), with their
    job folder under the test's ``tmp_path``; the Slurm path runs in tests/launcher/test_slurm_collectors.py."""
    from components.hosts.submitit import SubmititHost

    with SubmititHost.session({"cluster": "local", "connect_timeout": 120}, run_dir=str(tmp_path)):
        yield


@pytest.fixture
def ray_cluster(shared_ray):
    """The shared local Ray cluster, running; the test leaves no actor of its own alive."""
    shared_ray.ensure()
    before = our_live_actors()
    yield
    if shared_ray.running:
        try:
            wait_until(lambda: our_live_actors() == before, timeout=10)
        except AssertionError:
            assert our_live_actors() == before, "actors left alive"


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


# A rough cost of a test by its marks, in seconds: what orders the modules (below).
_COST = (("hosts", 30.0), ("slurm", 30.0), ("slow", 5.0))


def _cost(item) -> float:
    return next((seconds for mark, seconds in _COST if item.get_closest_marker(mark) is not None), 0.2)


def pytest_collection_modifyitems(config, items):
    # The longest modules first, each kept whole (module fixtures are built once): the two workers then end on short
    # tests, and one does not idle while the other finishes a minute-long Slurm or hosts test. Tests with a Ray cluster
    # of their own stop the shared one; they run last, so it starts only once.
    module_cost: dict[str, float] = {}
    for item in items:
        module_cost[item.nodeid.split("::")[0]] = module_cost.get(item.nodeid.split("::")[0], 0.0) + _cost(item)
    first_seen = {module: i for i, module in enumerate(module_cost)}
    items.sort(key=lambda item: ("own_ray_cluster" in getattr(item, "fixturenames", ()),
                                 -module_cost[item.nodeid.split("::")[0]], first_seen[item.nodeid.split("::")[0]]))
    # ``gpu`` tests need CUDA (``@pytest.mark.gpu(devices=2)``: that many devices); skipped saying so where it lacks
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_items:
        have = _cuda_devices()
        for item in gpu_items:
            need = item.get_closest_marker("gpu").kwargs.get("devices", 1)
            if have < need:
                there = "none" if have == 0 else f"only {have}"
                item.add_marker(pytest.mark.skip(reason=f"needs {need} CUDA device{'s' if need > 1 else ''} "
                                                        f"(this machine has {there}); benchmarks/gpu_check.sh runs "
                                                        "it where there is a GPU"))


@pytest.fixture(scope="module")
def own_ray_cluster(shared_ray):
    """For a module that builds a Ray cluster of its own (e.g. two raylets): the shared one is stopped first (and
    started again by its next user; ``pytest_collection_modifyitems`` runs these modules last)."""
    shared_ray.stop()
