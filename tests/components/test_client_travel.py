"""Process clients are picklable capabilities: plain ``pickle`` (no process start in progress), then used in a pool
of spawned processes, as users hand them to ``concurrent.futures`` pools, later-started workers and job steps."""

from __future__ import annotations

import csv
import pickle
from concurrent.futures import ProcessPoolExecutor
from functools import partial

import pytest
import torch
from tensordict import TensorDict

from components.inference import InferenceServer, InferenceServerConfig
from components.logger import CSVLogger, Logger, LoggerConfig
from components.replay import ReplayBuffer, ReplayConfig
from transports.config import TransportConfig
from components.hosts.process import context as process_context

from tests.factories import echo_factory

pytestmark = pytest.mark.slow  # owners in processes of their own, a pool of processes calling them: seconds

REQUEST = TensorDict({"observation": torch.zeros(4)})
RESPONSE = TensorDict({"action": torch.zeros(4), "served": torch.zeros((), dtype=torch.long),
                       "policy_version": torch.zeros((), dtype=torch.long)})


@pytest.fixture(scope="module")
def pool():
    # processes of their own (the forkserver owners use, not forks of this one): clients arrive pickled
    with ProcessPoolExecutor(max_workers=2, mp_context=process_context()) as executor:
        list(executor.map(abs, [1, 2]))  # its workers and manager thread start here, not inside the first test
        yield executor


def _infer(blob: bytes, value: float) -> float:
    client = pickle.loads(blob)
    return client(TensorDict({"observation": torch.full((4,), value)}))["action"][0].item()


def _extend(blob: bytes, start: int) -> int:
    client = pickle.loads(blob)
    client.extend(TensorDict({"x": torch.arange(start, start + 5, dtype=torch.float32)}, [5]))
    return len(client)


def _log(blob: bytes, step: int) -> None:
    client = pickle.loads(blob)
    client.log_scalar("travelled", float(step), step)
    client.flush()


@pytest.mark.parametrize("transport", ["queue", "shared_memory", "process_slot"])
def test_a_pickled_inference_client_serves_every_process_of_a_pool(pool, transport):
    options = {"num_slots": 8} if transport != "queue" else {}
    with InferenceServer(InferenceServerConfig(placement="process"), policy_factory=partial(echo_factory),
                         transport=TransportConfig(transport, options), request_layout=REQUEST,
                         response_layout=RESPONSE) as server:
        # process_slot: one slot per process, so each task gets a client of its own; the others share one
        blobs = [pickle.dumps(server.client()) for _ in range(8)] if transport == "process_slot" else \
            [pickle.dumps(server.client())] * 8
        answers = list(pool.map(_infer, blobs, [float(i) for i in range(8)]))
    assert answers == [2.0 * i for i in range(8)]  # every answer reached the process that asked


@pytest.mark.parametrize("transport", ["queue", "shared_memory"])
def test_a_pickled_replay_client_writes_from_every_process_of_a_pool(pool, transport):
    with ReplayBuffer(ReplayConfig(capacity=100, batch_size=4, placement="process"), transport=transport) as rb:
        blob = pickle.dumps(rb.client())
        list(pool.map(_extend, [blob] * 6, range(0, 30, 5)))
        client = rb.client()
        assert len(client) == 30
        assert set(rb.state_dict()["storage"]["x"][:30].tolist()) == set(float(i) for i in range(30))


def test_a_pickled_logger_client_logs_from_every_process_of_a_pool(pool, tmp_path):
    logger = Logger(LoggerConfig(placement="process"), backend=CSVLogger(str(tmp_path))).start()
    try:
        blob = pickle.dumps(logger.client())
        list(pool.map(_log, [blob] * 4, range(4)))
    finally:
        logger.shutdown()
    with open(tmp_path / "metrics.csv") as f:
        steps = sorted(int(row["step"]) for row in csv.DictReader(f) if row["tag"] == "travelled")
    assert steps == [0, 1, 2, 3]
