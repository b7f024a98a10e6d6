"""Cross-node bus benchmark: hop latency and a 64 MiB handoff over TCP + CURVE vs raw ZeroMQ TCP.

A worker process (this script again, `--role worker`) connects to the
orchestrator's bus the way a worker on another node does: a DEALER over
`tcp://` with CURVE keys read from its stdin, arrays as message frames (no
shared memory, the codec without an arena). The bench process drives the
real `AsyncRouter` (with its `BusAuth` ZAP handler) and measures:

    hop        a Feed with a small payload out, the worker's StageOutput back (round trip)
    handoff    a 64 MiB float32 array from the worker (PayloadCodec -> frame, zero-copy send)
               until it is decoded here (request to array in hand)

Baseline, same run, same processes: a raw ZeroMQ DEALER/ROUTER pair over TCP
without CURVE and without our codec: the same round trip with bytes of the
same size, and the same 64 MiB sent as one frame (zero-copy both ends).
Rounds alternate bus and raw so background load lands on both.
Targets: hop p50 <= 2x the raw round trip; handoff >= 0.5x raw bandwidth.

    .venv/bin/python scripts/bench_cluster.py [--rounds 200] [--big-rounds 10] [--mib 64]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import msgspec
import numpy as np
import zmq

from omni_actors.bus import messages as m
from omni_actors.bus.codec import PayloadCodec
from omni_actors.bus.shm import SegmentCache
from omni_actors.bus.sockets import AsyncRouter, BusAuth, WorkerSocket, read_curve_keys

RECV_TIMEOUT_MS = 60_000
EXIT_TIMEOUT_S = 30.0
IDENT = b"s0r0g0"
SMALL = {"text": "hello", "token_ids": list(range(16))}


def worker(bus: str, raw: str, mib: int) -> None:
    keys = read_curve_keys()
    sock = WorkerSocket(bus, IDENT, keys)
    ctx = zmq.Context()
    plain = ctx.socket(zmq.DEALER)
    plain.setsockopt(zmq.IDENTITY, IDENT)
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(raw)
    codec = PayloadCodec(IDENT.decode(), None, SegmentCache())
    big = np.random.default_rng(0).standard_normal(mib * (1 << 20) // 4, dtype=np.float32)
    sock.send([m.Ready(0, 0, 0)])
    plain.send(b"ready")
    poller = zmq.Poller()
    poller.register(sock.sock, zmq.POLLIN)
    poller.register(plain, zmq.POLLIN)
    running = True
    while running:
        for s, _ in poller.poll(RECV_TIMEOUT_MS):
            if s is plain:
                body = plain.recv()
                plain.send(big, copy=False) if body == b"big" else plain.send(body)
                continue
            for msg in sock.recv_nowait():
                match msg:
                    case m.Feed(request_id="big"):
                        sock.send([m.StageOutput("big", 0, codec.encode({"x": big}))])
                    case m.Feed(request_id=rid, payload=payload):
                        sock.send([m.StageOutput(rid, 0, payload)])
                    case m.Shutdown():
                        running = False
    sock.close()
    plain.close(0)
    ctx.term()


class Bench:
    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.auth = BusAuth(self.ctx)
        self.got: list[m.Message] = []
        self.router = AsyncRouter(self.ctx, "tcp://127.0.0.1:0", lambda _i, msg: self.got.append(msg),
                                  auth=self.auth)
        self.raw = self.ctx.socket(zmq.ROUTER)
        self.raw.setsockopt(zmq.LINGER, 0)
        port = self.raw.bind_to_random_port("tcp://127.0.0.1")
        self.raw_endpoint = f"tcp://127.0.0.1:{port}"
        self.codec = PayloadCodec("orch", None, SegmentCache())

    def bus_recv(self) -> m.Message:
        while not self.got:
            if not self.router.sock.poll(RECV_TIMEOUT_MS):
                raise TimeoutError("no reply from the worker")
            self.router._on_readable()
        return self.got.pop(0)

    def bus_round(self, payload: m.Payload) -> float:
        t0 = time.perf_counter()
        self.router.send_nowait(IDENT, m.Feed("hop", 0, payload))
        self.router.flush()
        out = self.bus_recv()
        assert isinstance(out, m.StageOutput)
        self.codec.decode(out.payload)
        return time.perf_counter() - t0

    def raw_round(self, body: bytes) -> float:
        t0 = time.perf_counter()
        self.raw.send_multipart([IDENT, body])
        self.raw.recv_multipart()
        return time.perf_counter() - t0

    def bus_big(self, nbytes: int) -> float:
        t0 = time.perf_counter()
        self.router.send_nowait(IDENT, m.Feed("big", 0, m.Payload()))
        self.router.flush()
        out = self.bus_recv()
        assert isinstance(out, m.StageOutput)
        x = self.codec.decode(out.payload)["x"]
        dt = time.perf_counter() - t0
        assert x.nbytes == nbytes
        return dt

    def raw_big(self, nbytes: int) -> float:
        t0 = time.perf_counter()
        self.raw.send_multipart([IDENT, b"big"])
        _, frame = self.raw.recv_multipart(copy=False)
        dt = time.perf_counter() - t0
        assert len(frame.buffer) == nbytes
        return dt


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--big-rounds", type=int, default=10)
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--role", choices=("worker",))
    p.add_argument("--bus")
    p.add_argument("--raw")
    a = p.parse_args()
    if a.role == "worker":
        worker(a.bus, a.raw, a.mib)
        return 0
    load_before = [round(x, 2) for x in os.getloadavg()]
    b = Bench()
    b.raw.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    keys = b.auth.issue()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--role", "worker", "--bus", b.router.endpoint, "--raw", b.raw_endpoint,
         "--mib", str(a.mib)], stdin=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(msgspec.json.encode(keys) + b"\n")
    proc.stdin.close()
    try:
        assert isinstance(b.bus_recv(), m.Ready)
        b.raw.recv_multipart()
        payload = m.Payload(data=SMALL)
        body = m.encode(m.Feed("hop", 0, payload))  # the raw round trip carries as many bytes
        hop, raw_hop = [], []
        for i in range(a.rounds + 10):
            h, r = b.bus_round(payload), b.raw_round(body)
            if i >= 10:  # warm-up
                hop.append(h)
                raw_hop.append(r)
        nbytes = a.mib * (1 << 20)
        big, raw_big = [], []
        for i in range(a.big_rounds + 1):
            g, r = b.bus_big(nbytes), b.raw_big(nbytes)
            if i:
                big.append(g)
                raw_big.append(r)
        b.router.send_nowait(IDENT, m.Shutdown())
        b.router.flush()
        proc.wait(EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        b.router.close()
        b.raw.close(0)
        b.auth.close()
        b.ctx.term()
    p50 = statistics.median
    mib_s = a.mib / p50(big)
    raw_mib_s = a.mib / p50(raw_big)
    print(json.dumps({
        "bench": "cluster_bus", "transport": "tcp loopback", "rounds": a.rounds, "mib": a.mib,
        "hop_rtt_p50_us": round(p50(hop) * 1e6, 1), "hop_rtt_p99_us": round(sorted(hop)[int(0.99 * len(hop)) - 1] * 1e6, 1),
        "raw_tcp_rtt_p50_us": round(p50(raw_hop) * 1e6, 1),
        "hop_vs_raw": round(p50(hop) / p50(raw_hop), 2), "hop_target_max": 2.0,
        "handoff_p50_ms": round(p50(big) * 1e3, 1), "raw_tcp_p50_ms": round(p50(raw_big) * 1e3, 1),
        "handoff_mib_s": round(mib_s), "raw_tcp_mib_s": round(raw_mib_s),
        "handoff_vs_raw": round(mib_s / raw_mib_s, 2), "handoff_target_min": 0.5,
        "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
