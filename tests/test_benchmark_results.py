"""What a benchmark records (benchmarks/_results.py): plain JSON that names no directory of the machine it ran on."""

import json
import math
import os
import sys

from tests.helpers import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import _results  # noqa: E402


def test_a_recorded_run_is_plain_json_with_paths_relative_to_the_checkout(tmp_path):
    run = _results.Results("probe", argv=["--quick"])
    where = os.path.join(_results.ROOT, "transports", "queue.py") + ":206(_receive)"
    run.table("profile", ["calls", "where"], [[3, where], [math.nan, "{built-in method posix.sched_yield}"]])
    path = run.save(str(tmp_path))
    text = open(path).read()
    assert _results.ROOT not in text
    (saved,) = json.loads(text)["runs"]
    assert saved["tables"][0]["rows"] == [[3, "transports/queue.py:206(_receive)"],
                                          [None, "{built-in method posix.sched_yield}"]]
    assert saved["command"] == "python benchmarks/probe.py --quick"
