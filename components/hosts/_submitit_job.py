"""What runs in a job of the ``submitit`` placement (see `components.hosts.submitit`): join the driver's Ray
cluster if it has one, connect back to the driver, then serve the target as a ``process`` child does."""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import time
from multiprocessing.connection import Client

from .child import child_main
from .connected import keep_alive


def ray_cluster() -> tuple[str, str] | None:
    """``(address, namespace)`` of the Ray cluster this driver is connected to, if any: a job joins it before it
    unpickles its target's factory (which may hold Ray clients, whose actor handles need a connected worker)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None
    context = ray.get_runtime_context()
    return context.gcs_address, context.namespace


def job_main(factory: bytes, address: tuple[str, int], key: bytes, name: str,
              ray_at: tuple[str, str] | None = None) -> None:
    """In the job: join the driver's Ray cluster (``ray_at``) if it has one, connect back to the driver, then build
    and serve the target as a ``process`` child does. Signals keep their meaning here: ``scancel`` ends the job at once
    (submitit's own handler would ignore its SIGTERM until Slurm's KillWait ran out).

    Once the target closed, the job leaves with ``os._exit(0)``, as a multiprocessing child does: the interpreter's
    own finalization would tear down threads still blocked in a transport's receive (gloo aborts the process then,
    and Slurm would record the job FAILED). submitit writes no result file: the job returns nothing."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # submitit ignores it; here scancel ends the job at once
    deadline = time.monotonic() + 60.0
    while True:
        try:
            conn = Client(address, family="AF_INET", authkey=key)
            keep_alive(conn.fileno())  # a driver whose node or link is lost ends this job too
            break
        except ConnectionRefusedError:
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{name}: the driver at {address[0]}:{address[1]} refused the connection for 60 s "
                                   "(it stopped, or submitit.host is not an address of its node)") from None
            time.sleep(1.0)
    if ray_at is not None:
        import ray

        ray.init(address=ray_at[0], namespace=ray_at[1], log_to_driver=False)
    served = child_main(pickle.loads(factory), conn, own_signals=False)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(0 if served else 1)  # 1: the target failed to build (the driver has its error)
