"""Load and data at CI scale: many concurrent callers on every inference and replay cell, no answer or row lost,
duplicated or misrouted, the owner's memory flat. The checks are those of ``benchmarks/load.py`` (defined in
``benchmarks/_load.py``), which runs them at full scale (64 clients x 10,000 requests, 8 producers x 10,000
extends).

Scale here: 64 clients x 100 requests per inference cell and 8 producers x 250 extends per replay cell; Ray over
Ray calls (about 400 requests/s on 2 cores) makes 64 x 25 requests and 8 x 100 extends. The memory bound (at most
10% growth of the owner's RSS after the warm-up) is asserted here too, but at this scale it only catches a leak
of more than a few KiB per call; the benchmark's full-scale runs are the real memory check.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

# as the package path: a Ray actor unpickles the cells' policy by it (the checkout is on every worker's path)
from benchmarks._load import INFERENCE_CELLS, REPLAY_CELLS, Result, Workers, check_answers, check_rows, run_cell
from transports.segments import segments_of

SCALE = {"inference": (64, 100), "replay": (8, 250)}
RAY_CALLS_SCALE = {"inference": (64, 25), "replay": (8, 100)}  # a Ray call costs milliseconds here
CELLS = [("inference", c) for c in INFERENCE_CELLS] + [("replay", c) for c in REPLAY_CELLS]


@pytest.fixture(scope="module")
def workers():
    """Four spawned client processes, shared by the process cells (each cell hands them its clients)."""
    pool = Workers(4)
    yield pool
    pool.close()


@pytest.mark.slow
@pytest.mark.parametrize("component, cell", CELLS, ids=[f"{c}-{cell.replace('/', '-')}" for c, cell in CELLS])
def test_no_answer_or_row_is_lost_duplicated_or_misrouted_and_memory_stays_flat(component, cell, request):
    pool = request.getfixturevalue("workers") if cell.startswith("process/") else None
    if cell.startswith("ray/"):
        request.getfixturevalue("ray_cluster")
    before = set(segments_of([os.getpid()]))
    r = run_cell(component, cell, *(RAY_CALLS_SCALE if cell == "ray/ray" else SCALE)[component], workers=pool)
    assert r.errors == []
    assert (r.lost, r.duplicated, r.misrouted) == (0, 0, 0), r
    assert r.flat, f"{cell}: owner RSS {r.rss_warm:.0f} -> {r.rss_end:.0f} MiB ({r.growth:+.1f}%)"
    assert set(segments_of([os.getpid(), r.pid])) <= before, "shared-memory segments left behind"


# ---------------------------------------------------------------------------------------------- the checks themselves
def test_the_answer_check_tells_lost_duplicated_and_misrouted_apart():
    r = Result("inference", "x/y", calls=2 * 5)
    outcome = {"ok": 6, "failed": [(1, 4)], "errors": ["client 1 request 4: timed out"],
               "wrong": [(0, 1, 0, 0),    # (0, 0) was answered to its own request too: duplicated
                         (0, 2, 1, 3),    # (1, 3) went to client 0; client 1's request 3 got (7, 7): misrouted
                         (1, 3, 7, 7)]}   # a pair nobody sent: misrouted
    check_answers(r, outcome, callers=2, calls=5, served=11)
    assert (r.lost, r.duplicated, r.misrouted) == (4, 1 + 1, 2)  # one duplicate answer, one request served twice


class _Sampler:
    """Stands in for a replay client: one epoch of the given (id, index) rows, in batches."""

    def __init__(self, ids, index):
        self.rows = list(zip(ids, index))

    def sample(self, n):
        batch, self.rows = self.rows[:n], self.rows[n:]
        return {"id": _Array([i for i, _ in batch]), "index": _Array([p for _, p in batch])}


class _Array(list):
    def numpy(self):
        return np.asarray(self, dtype=np.int64)


def test_the_row_check_finds_rows_missing_repeated_or_moved():
    r = Result("replay", "x/y", calls=2, rows=8)
    outcome = {"ids": [np.arange(4), np.arange(4, 8)], "positions": [np.arange(4), np.array([4, 5, 6, 6])]}
    # rows 6 and 7 were both acknowledged at position 6 (7 last); the epoch returns row 6 twice, at positions 5
    # and 6 (neither is its own), and never row 5
    sampled = _Sampler([0, 1, 2, 3, 4, 6, 6, 7], [0, 1, 2, 3, 4, 5, 6, 6])
    check_rows(r, outcome, sampled, capacity=8)
    assert (r.lost, r.duplicated, r.misrouted) == (1, 1 + 1, 2)
