"""Scoped defaults: nesting, thread and task locality, restore on exception, ignored in child processes."""

import asyncio
import multiprocessing as mp
import threading

import pytest

from components import ConfigurationError, IncompatibleCombinationError, service_backend, transport_backend
from components.replay import ReplayBuffer, ReplayConfig
from components.scope import choose_placement, choose_transport, current_service_backend, current_transport_backend


def test_nesting_restores_the_outer_value():
    assert current_service_backend() is None
    with service_backend("thread"):
        assert current_service_backend().value == "thread"
        with service_backend("multiprocessing"):  # alias
            assert current_service_backend().value == "process"
        assert current_service_backend().value == "thread"
    assert current_service_backend() is None


def test_restored_after_an_exception():
    with pytest.raises(RuntimeError):
        with transport_backend("queue"):
            raise RuntimeError("boom")
    assert current_transport_backend() is None


def test_thread_local():
    seen = {}

    def worker():
        seen["in_thread"] = current_service_backend()

    with service_backend("process"):
        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert current_service_backend().value == "process"
    assert seen["in_thread"] is None


def test_asyncio_task_local():
    async def task(name, delay, results):
        with service_backend(name):
            await asyncio.sleep(delay)
            results[name] = current_service_backend().value

    async def main():
        results = {}
        await asyncio.gather(task("thread", 0.02, results), task("process", 0.01, results))
        return results

    assert asyncio.run(main()) == {"thread": "thread", "process": "process"}


def _report(queue):
    s, t = current_service_backend(), current_transport_backend()
    queue.put((s and s.value, t and t.value))


@pytest.mark.parametrize("method", [pytest.param("spawn", marks=pytest.mark.slow), "fork"])  # spawn: seconds
def test_child_processes_ignore_the_scope(method):
    ctx = mp.get_context(method)
    queue = ctx.Queue()
    with service_backend("process"), transport_backend("shared_memory"):
        child = ctx.Process(target=_report, args=(queue,))
        child.start()
        got = queue.get(timeout=60)
        child.join(timeout=60)
    queue.close()
    queue.join_thread()
    assert child.exitcode == 0
    assert got == (None, None)


def test_precedence_explicit_then_context_then_default():
    assert choose_placement(None, "direct").value == "direct"
    with service_backend("thread"):
        assert choose_placement(None, "direct").value == "thread"
        assert choose_placement("direct", "process").value == "direct"
    with transport_backend("queue"):
        assert choose_transport(None).value == "queue"
        assert choose_transport("auto").value == "auto"  # an explicit "auto" wins over the context
    assert choose_transport(None).value == "auto"


def test_components_take_the_scope():
    with service_backend("direct"), transport_backend("direct"):
        buffer = ReplayBuffer(ReplayConfig(capacity=10))
    assert buffer.placement == "direct" and buffer.transport_kind == "direct"


def test_an_error_caused_by_a_context_says_so():
    with service_backend("submitit"):
        with pytest.raises(IncompatibleCombinationError) as info:
            ReplayBuffer(ReplayConfig(capacity=10))
    assert "service_backend('submitit')" in str(info.value)
    with transport_backend("process_slot"):  # replay never uses process_slot: the broad default falls back
        buffer = ReplayBuffer(ReplayConfig(capacity=10))
    assert buffer.transport_kind == "direct" and "never uses 'process_slot'" in buffer.transport_reason
    with transport_backend("ray"):  # replay takes 'ray', but not when placed directly: an error naming the context
        with pytest.raises(IncompatibleCombinationError) as info:
            ReplayBuffer(ReplayConfig(capacity=10))
    assert "transport_backend('ray')" in str(info.value)


def test_unknown_names_are_configuration_errors():
    with pytest.raises(ConfigurationError, match="unknown placement 'cloud'"):
        with service_backend("cloud"):
            pass
    with pytest.raises(ConfigurationError, match="unknown transport 'pigeon'"):
        with transport_backend("pigeon"):
            pass
