"""TorchRL's process logger measured the way ``benchmarks/logger.py`` measures ours; run with TorchRL's python.

TorchRL's `ProcessLogger` (``torchrl.record.loggers``, torchrl 0.14) builds a logger in a child process and hands out
clients whose ``log_scalar`` waits for the child to have written the row, as our process-placed logger's does. This
script starts ``ProcessLogger(CSVLogger, ...)`` in a temporary directory and times ``client.log_scalar("train/loss",
0.5, step)``: warm-up calls discarded, then up to ``--calls`` calls or ``--budget`` seconds, whichever ends first.

TorchRL 0.14.1 needs tensordict<0.15, so it lives apart from this project's environment: in a virtual environment
of its own, or in a ``pip install --target`` directory put first on ``PYTHONPATH``. The script
stands alone: it imports torchrl, numpy and the standard library, and from this project only
``benchmarks/_harness.py`` beside it (numpy and the standard library), whose `latency` ours use too.

    python -m venv /tmp/trl && /tmp/trl/bin/pip install torch==2.13.0 torchrl==0.14.1
    /tmp/trl/bin/python benchmarks/torchrl_logger_peer.py --calls 1000
    # or, beside this project's torch:
    pip install --target /tmp/trl_pkgs --no-deps torchrl==0.14.1 "tensordict>=0.14,<0.15"
    PYTHONPATH=/tmp/trl_pkgs python benchmarks/torchrl_logger_peer.py --calls 1000

Prints one JSON object on stdout: ``{"torchrl": version, "tensordict": version, "logger":
"ProcessLogger(CSVLogger)", "p50", "p95", "rate", "n", "block_p50"}`` (latencies in microseconds, ``rate`` in
calls/s; ``block_p50``: the p50 of each of `BLOCKS` consecutive blocks of the calls).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time

TAG = "train/loss"
BLOCKS = 5
"""The measured calls are also reported as the p50 of each of this many consecutive blocks: how much it moved."""


def measure(calls: int, budget: float, warmup: int) -> dict:
    """Start TorchRL's `ProcessLogger` around its `CSVLogger` and time its client's acknowledged `log_scalar`."""
    import numpy as np
    import tensordict
    import torchrl
    from torchrl.record.loggers import CSVLogger, ProcessLogger

    from _harness import latency

    directory = tempfile.mkdtemp(prefix="bench_torchrl_logger_")
    try:
        owner = ProcessLogger(CSVLogger, exp_name="bench", log_dir=directory)
        try:
            client = owner.client()
            for step in range(warmup):
                client.log_scalar(TAG, 0.5, step)
            lat = []
            clock = time.perf_counter
            start = time.monotonic()
            for step in range(warmup, warmup + calls):
                t0 = clock()
                client.log_scalar(TAG, 0.5, step)
                lat.append(clock() - t0)
                if time.monotonic() - start > budget:
                    break
            wall = time.monotonic() - start
        finally:
            owner.shutdown()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    lat_us = np.asarray(lat) * 1e6
    blocks = [float(np.median(block)) for block in np.array_split(lat_us, BLOCKS) if len(block)]
    return {"torchrl": torchrl.__version__, "tensordict": tensordict.__version__, "logger": "ProcessLogger(CSVLogger)",
            **latency(lat_us, wall), "block_p50": blocks}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=5000, help="measured calls at most")
    parser.add_argument("--budget", type=float, default=15.0, help="seconds the measured calls may take at most")
    parser.add_argument("--warmup", type=int, default=50)
    args = parser.parse_args()
    result = measure(args.calls, args.budget, args.warmup)
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
