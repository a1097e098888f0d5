"""transports._startup: tensordict imports without torch's compiler frontend, and its compiler marks are made, exactly
as tensordict asked, once the compiler is imported."""

import subprocess
import sys

import pytest

from tests.helpers import ROOT

FRESH = """
import sys, transports, tensordict, tensordict.nn
print("dynamo after tensordict:", "torch._dynamo" in sys.modules)
"""


@pytest.mark.slow
def test_a_fresh_process_of_ours_imports_tensordict_without_the_compiler():
    proc = subprocess.run([sys.executable, "-c", FRESH], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "dynamo after tensordict: False"


def test_tensordicts_compiler_marks_are_made_once_the_compiler_is_imported():
    import tensordict.base
    import tensordict.utils
    import torch._dynamo
    import torch.compiler
    from torch._dynamo import trace_rules

    from transports import _startup

    assert id(tensordict.base._foreach_copy_compiled) in trace_rules._allowed_callable_ids  # allow_in_graph
    assert tensordict.utils._lock_warn._dynamo_marked_constant is True  # assume_constant_result
    assert _startup._deferred == []
    for mark, original in _startup._originals.items():  # the compiler's own functions are back
        assert getattr(torch.compiler, mark) is original
