"""Both ends of a ``distributed`` endpoint, and a peer without the key, as processes to run on separate hosts.

    python -m tests.hosts.peer serve HOST        prints the endpoint's address (JSON), serves until stdin closes,
                                                 then prints what it saw (JSON: calls answered, connections refused)
    python -m tests.hosts.peer call ADDRESS N    N round trips, each answer checked; prints their latencies (JSON)
    python -m tests.hosts.peer attack ADDRESS [PORT...]   without the key: garbage, torch's store protocol, a wrong
                                                 key and a flood at the relay, then garbage at each PORT; prints what
                                                 happened (JSON)
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import socket
import sys
import threading
import time

import torch
from tensordict import TensorDict

from transports.distributed import DistributedTransport
from transports.distributed.transport import CALL, Address, DistributedClient

REQUEST = TensorDict({"obs": torch.zeros(4, 84, 84, dtype=torch.uint8)})  # one Atari frame stack: 28 KB
RESPONSE = TensorDict({"action": torch.zeros((), dtype=torch.int64)})


def serve(host: str) -> None:
    transport = DistributedTransport(REQUEST, RESPONSE, host=host, name="echo")
    endpoint = transport.server()
    transport.mark_serving(0)
    print(json.dumps(dataclasses.asdict(transport.address)), flush=True)
    stop, answered = threading.Event(), [0]

    def loop() -> None:
        while not stop.is_set():
            batch = endpoint.collect(16, 1, 0.0, 0.02)
            if batch is None:
                continue
            endpoint.reply(batch, [TensorDict({"action": td["obs"].sum(dtype=torch.int64)}) for td in batch.requests])
            answered[0] += len(batch.requests)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    sys.stdin.read()  # until the test closes our stdin
    stop.set()
    thread.join(5)
    refused = transport._relay.refused if transport._relay is not None else None  # noqa: SLF001 - the test's view
    endpoint.close()
    transport.close()
    print(json.dumps({"answered": answered[0], "refused": refused}), flush=True)


def call(address: dict, n: int) -> None:
    endpoint = DistributedClient(Address(**address)).bind(CALL, REQUEST, RESPONSE)
    started = time.perf_counter()
    endpoint.submit(REQUEST.clone()).result(60)
    connect_s = time.perf_counter() - started
    latencies = []
    for i in range(n):
        td = TensorDict({"obs": torch.full((4, 84, 84), i % 200, dtype=torch.uint8)})
        started = time.perf_counter()
        answer = endpoint.submit(td).result(60)
        latencies.append(time.perf_counter() - started)
        assert int(answer["action"]) == (i % 200) * 4 * 84 * 84, "a wrong answer"
    print(json.dumps({"connect_s": connect_s, "round_trips_s": latencies}), flush=True)


def attack(address: dict, others: list[int]) -> None:
    from torch.distributed import TCPStore

    from transports.distributed.relay import Entry

    host, port, seen = address["host"], address["port"], {}
    raw = socket.create_connection((host, port), timeout=10)
    raw.recv(64)
    raw.sendall(b"\x00garbage\xff" * 1000)
    seen["garbage"] = _closed(raw)
    try:  # torch's own store client, straight at the relay: it may not write a key
        TCPStore(host, port, None, False, timeout=datetime.timedelta(seconds=3)).set("hello/0", b"{}")
        seen["store"] = "wrote a key"
    except Exception as exc:  # noqa: BLE001 - any refusal will do
        seen["store"] = f"refused ({type(exc).__name__})"
    try:
        Entry(host, port, b"not the key".ljust(32, b"!"), 5.0, "attacker")
        seen["wrong_key"] = "admitted"
    except Exception as exc:  # noqa: BLE001
        seen["wrong_key"] = f"refused: {exc}"
    flood = []
    for _ in range(300):
        try:
            flood.append(socket.create_connection((host, port), timeout=2))
        except OSError:
            break
    seen["flood_closed"] = sum(_closed(s, 10.0) for s in flood)
    seen["flood"] = len(flood)
    for other in others:  # gloo's own listeners, whose addresses the store publishes: garbage must not kill them
        with socket.create_connection((host, other), timeout=10) as sock:
            sock.sendall(b"\x00garbage\xff" * 1000)
    seen["others"] = len(others)
    print(json.dumps(seen), flush=True)


def _closed(sock: socket.socket, timeout: float = 10.0) -> bool:
    """Whether the relay closed ``sock`` (within ``timeout``) without admitting it."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
            if b"rlsvc-challenge" not in data and len(data) > 64:
                return False
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False
    finally:
        sock.close()


if __name__ == "__main__":
    what, *rest = sys.argv[1:]
    if what == "serve":
        serve(rest[0])
    elif what == "call":
        call(json.loads(rest[0]), int(rest[1]))
    elif what == "attack":
        attack(json.loads(rest[0]), [int(p) for p in rest[1:]])
