"""The test helpers that judge output: a filter must never hide a run's own error."""

from tests.helpers import tracebacks

MONARCH_EXIT = """Exception ignored in atexit callback: <function context.<locals>.<lambda> at 0x7f0c>
Traceback (most recent call last):
  File "/site-packages/monarch/_src/actor/actor_mesh.py", line 574, in <lambda>
    atexit.register(lambda: shutdown_context(host_timeout=0.3).get(timeout=1.0))
                            ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
TimeoutError: 
"""
OURS = """Traceback (most recent call last):
  File "launcher/run.py", line 10, in execute
    run()
ValueError: boom
"""


def test_tracebacks_leave_out_only_monarchs_exit_handler_timing_out():
    assert tracebacks(MONARCH_EXIT) == []
    assert tracebacks("no traceback here\n") == []
    (found,) = tracebacks(MONARCH_EXIT + OURS)
    assert found.endswith("ValueError: boom")
    other_error = MONARCH_EXIT.replace("TimeoutError: ", "RuntimeError: the actor system is gone")
    assert len(tracebacks(other_error)) == 1  # the same handler failing otherwise is reported
