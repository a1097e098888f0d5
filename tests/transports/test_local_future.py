"""LocalFuture's done callback: what a Monarch actor answers its response ports with."""

import threading

import pytest

from transports.kernel.errors import ServiceTimeoutError
from transports.local import LocalFuture


def test_a_callback_runs_once_whether_added_before_or_after_the_answer():
    seen = []
    before = LocalFuture()
    before.add_done_callback(lambda f: seen.append(("before", f.result())))
    before.set_result(1)
    before.set_result(2)  # the first answer wins; the callback does not run again
    after = LocalFuture()
    after.set_exception(KeyError("gone"))
    after.add_done_callback(lambda f: seen.append(("after", type(f._error).__name__)))
    assert seen == [("before", 1), ("after", "KeyError")]


def test_a_callback_racing_the_answer_runs_exactly_once():
    for _ in range(300):
        future, calls = LocalFuture(), []
        setter = threading.Thread(target=future.set_result, args=(7,))
        setter.start()
        future.add_done_callback(calls.append)
        setter.join()
        assert calls == [future]


def test_without_an_answer_result_times_out_and_no_callback_runs():
    future, calls = LocalFuture(), []
    future.add_done_callback(calls.append)
    with pytest.raises(ServiceTimeoutError):
        future.result(0.01)
    assert calls == []
