"""One contract for every registered request/reply transport, and for a transport written outside the project.

Cases come from the registry (:func:`transports.registry.descriptors`), so a transport is tested the day it is
registered; ``toy`` is the transport of :mod:`tests.transports.toy`, a module the test writes and registers itself.
Each transport is built by kind from the registry and served by the real serving core (an echo policy) on the host of
the first placement whose inference cell takes it (in this process for in-process and network kinds, in a child
process for the shared-memory ones, in an actor for ``ray`` and ``monarch``); its clients are the transport's own.
"""

from __future__ import annotations

import dataclasses
import inspect
import pickle
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from components import compat
from components.hosts import host_class
from components.inference import InferenceServerConfig
from components.inference.target import ServedPolicy
from transports import registry
from transports.kernel.errors import LayoutError, PeerFailureError, RemoteError, ServiceTimeoutError
from transports.kernel.options import fields_of

from tests.factories import SLOW_PASS_S, echo_factory
from tests.transports.toy import toy_transport

KINDS = [d.kind for d in registry.descriptors()] + ["toy"]
HEAVY = {"ray": "ray_session", "monarch": None}  # served in an actor: seconds to start (marked slow)
REQUEST = TensorDict({"observation": torch.zeros(4)})
RESPONSE = TensorDict({"action": torch.zeros(4), "served": torch.zeros((), dtype=torch.long),
                       "policy_version": torch.zeros((), dtype=torch.long)})
BUILT_IN_ARGUMENTS = {"self", "request_layout", "response_layout", "name", "operations"}


def ask(value: float) -> TensorDict:
    """A request whose observation is ``value`` everywhere (the echo answers ``2 * value``)."""
    return TensorDict({"observation": torch.full((4,), float(value))})


def _param(kind: str):
    return pytest.param(kind, marks=[pytest.mark.slow] if kind in HEAVY else [], id=kind)


def serving_placement(kind: str) -> str:
    """Where the kind is served here: the first placement whose inference cell takes it (the caller's process first)."""
    placements = [c.placement for c in compat.TABLE.values()
                  if c.component == "inference" and c.transports.get(kind) == compat.SUPPORTED]
    return next((p for p in ("thread", "process") if p in placements), placements[0])


class Served:
    """A transport of ``kind`` served by an echo policy on its placement's host; ``client()`` is one of its own."""

    def __init__(self, kind: str, **options):
        self.kind = kind
        self.descriptor = registry.describe(kind)
        self.transport = registry.build(kind, options, request_layout=REQUEST, response_layout=RESPONSE,
                                        name="contract")
        factory = partial(ServedPolicy, partial(echo_factory), self.transport.server_side(),
                          InferenceServerConfig(max_batch_size=8, timeout=0.002))
        self.host = host_class(serving_placement(kind))(
            "contract", factory, on_death=lambda reason: self.transport.mark_dead(stopped=False), concurrency=12)
        self.host.start()
        self.transport.bind(self.host)

    def client(self):
        return self.transport.client()

    def stop(self) -> None:
        """Stop the host, then tell the clients (idempotent)."""
        if self.transport.closed:
            return
        self.host.shutdown(10)
        self.transport.mark_dead(stopped=True)
        self.transport.close()


@pytest.fixture(scope="module")
def toy_registered(tmp_path_factory):
    with toy_transport(str(tmp_path_factory.mktemp("toy"))) as module:
        yield module


def _serve(request, kind: str, stack: ExitStack) -> Served:
    if kind == "toy":
        request.getfixturevalue("toy_registered")
    if HEAVY.get(kind):
        request.getfixturevalue(HEAVY[kind])
    served = Served(kind)
    stack.callback(served.stop)
    return served


@pytest.fixture(scope="module", params=[_param(k) for k in KINDS])
def served(request):
    """One served transport per kind, shared by the tests that leave it serving."""
    with ExitStack() as stack:
        yield _serve(request, request.param, stack)


# ---------------------------------------------------------------------------------------------- what it says of itself
@pytest.mark.parametrize("kind", [d.kind for d in registry.descriptors()])
def test_the_class_carries_its_registered_descriptor_and_takes_its_options(kind):
    descriptor = registry.describe(kind)
    cls = registry.transport_class(kind)
    assert cls.descriptor is descriptor and cls.kind == kind
    params = {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n not in BUILT_IN_ARGUMENTS}
    fields = fields_of(descriptor.options)
    assert set(params) == set(fields), f"{cls.__name__} takes {sorted(params)}, its options are {sorted(fields)}"
    for name, f in fields.items():  # one default per option: the options dataclass's
        assert params[name].default == f.default, name
    assert "name" in inspect.signature(cls.__init__).parameters  # every transport names its endpoint in messages
    if descriptor.wire is not None:
        assert descriptor.label().startswith(f"{kind} (")


def test_the_registry_knows_each_transport_by_its_names():
    from transports.kinds import normalize_transport_kind, transport_kinds

    for d in registry.descriptors():
        assert d.kind in transport_kinds()
        for alias in (d.kind, *d.aliases):
            assert normalize_transport_kind(alias.upper()) == d.kind
    with pytest.raises(ValueError, match="taken"):
        registry.register(dataclasses.replace(registry.describe("queue"), kind="queue2", aliases=("shm",)))


def test_options_are_checked_from_the_descriptor_alone():
    from transports.kernel.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="max_queue_size must be >= 1, got 0") as info:
        registry.check_options("queue", {"max_queue_size": 0}, path="components.inference.transport_options")
    assert info.value.path == "components.inference.transport_options.max_queue_size"
    with pytest.raises(ConfigurationError, match="takes no option 'slots'") as info:
        registry.check_options("shared_memory", {"slots": 4})
    assert "num_slots" in info.value.alternatives
    with pytest.raises(ConfigurationError, match="backend must be one of gloo, nccl"):
        registry.check_options("distributed", {"backend": "mpi"})


# ---------------------------------------------------------------------------------------------- serving
def test_the_transport_as_a_value_names_its_kind_and_options(served):
    config = served.transport.config
    assert config.kind == served.kind
    assert set(config.options) == set(fields_of(served.descriptor.options))


def test_every_caller_gets_its_own_answer_and_each_producer_keeps_its_order(served):
    clients = [served.client() for _ in range(4)]

    def work(i):
        futures = [clients[i].submit(ask(i * 100 + k)) for k in range(6)] if served.kind != "process_slot" else None
        if futures is None:  # one request in flight per slot: sequential by construction
            answers = [clients[i].submit(ask(i * 100 + k)).result(30) for k in range(6)]
        else:
            answers = [f.result(30) for f in futures]
        return [(a["action"][0].item(), a["served"].item()) for a in answers]

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(4)))
    for i, answers in enumerate(results):
        assert [action for action, _ in answers] == [2.0 * (i * 100 + k) for k in range(6)]
        passes = [p for _, p in answers]
        assert passes == sorted(passes), "a producer's requests were served out of order"


def test_a_copy_of_a_client_is_served_as_the_original(served):
    copy = pickle.loads(pickle.dumps(served.client()))
    assert copy.submit(ask(3)).result(30)["action"][0].item() == 6.0


def test_the_servers_error_is_raised_at_the_call_site_and_it_keeps_serving(served):
    client = served.client()
    with pytest.raises((ValueError, RemoteError), match="negative marker in the batch"):
        client.submit(ask(-2000)).result(30)
    assert client.submit(ask(1)).result(30)["action"][0].item() == 2.0


def test_a_timeout_is_not_a_dead_peer_and_the_answer_still_comes(served):
    future = served.client().submit(ask(2e5))  # the policy takes SLOW_PASS_S over it
    with pytest.raises(ServiceTimeoutError):
        future.result(SLOW_PASS_S / 10)
    assert future.result(30)["action"][0].item() == 4e5


def test_fixed_layouts_refuse_mistakes_in_the_caller_and_others_pass(served):
    client = served.client()
    if served.descriptor.fixed_layout:
        with pytest.raises(LayoutError, match="observation"):
            client.submit(TensorDict({"other": torch.zeros(4)}))
        with pytest.raises(LayoutError, match="observation"):
            client.submit(TensorDict({"observation": torch.zeros(4, dtype=torch.float64)}))
        extra = TensorDict({"observation": torch.ones(4), "extra": torch.zeros(2)})  # extra keys are not sent
        assert client.submit(extra).result(30)["action"][0].item() == 2.0
    else:  # any layout travels
        other = TensorDict({"observation": torch.ones(6)})
        assert client.submit(other).result(30)["action"].shape == (6,)
    assert client.submit(ask(5)).result(30)["action"][0].item() == 10.0  # and the server goes on


@pytest.mark.parametrize("kind", [_param(k) for k in KINDS])
def test_a_stopped_server_fails_waiting_and_later_requests_as_a_peer_failure(request, kind):
    with ExitStack() as stack:
        served = _serve(request, kind, stack)
        client = served.client()
        assert client.submit(ask(1)).result(30)["action"][0].item() == 2.0
        waiting = client.submit(ask(2e5)) if served.kind != "process_slot" else None
        served.stop()
        if waiting is not None:  # answered before the stop, or failed as a peer failure: never left waiting
            try:
                waiting.result(30)
            except PeerFailureError:
                pass
        with pytest.raises(PeerFailureError):
            client.submit(ask(1)).result(30)
