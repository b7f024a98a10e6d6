"""Does striping one large array over N CURVE connections help? 64 MiB over 1, 2, 4 streams vs raw TCP.

An evaluation for the cluster bus (docs/benchmarks.md, "Cluster bus"), not the bus itself: libzmq
encrypts each connection's frames on the one I/O thread that owns it, so one connection uses one
core for XSalsa20-Poly1305 on each side. Here a sender process (this script, `--role sender`)
holds N CURVE DEALER connections (a context with N I/O threads) to one CURVE ROUTER (N I/O threads,
allowed by the bus's own `BusAuth` ZAP handler), cuts the array into the bus's frames
(codec.FRAME_CHUNK_BYTES, zero-copy views) and sends stream k the k-th contiguous share as one
message; the receiver copies each share into place as it arrives (one copy, as the bus's
`attach_frames` does). Baseline in the same run, rounds alternated: the same 64 MiB as one
zero-copy frame over a raw ZeroMQ TCP DEALER/ROUTER.

    .venv/bin/python scripts/bench_curve_streams.py [--mib 64] [--rounds 8] [--streams 1 2 4]

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import time

import msgspec
import numpy as np
import zmq

from omni_actors.bus.codec import FRAME_CHUNK_BYTES
from omni_actors.bus.sockets import BusAuth, CurveKeys, read_curve_keys

RECV_TIMEOUT_MS = 60_000
EXIT_TIMEOUT_S = 30.0


def _shares(nbytes: int, n: int) -> list[tuple[int, int]]:
    """Stream k's byte range, cut on frame boundaries."""
    frames = -(-nbytes // FRAME_CHUNK_BYTES)
    bounds = [min(nbytes, (frames * k // n) * FRAME_CHUNK_BYTES) for k in range(n + 1)]
    return list(itertools.pairwise(bounds))


def sender(curve: str, raw: str, mib: int, streams: list[int]) -> None:
    keys = read_curve_keys()
    big = np.random.default_rng(0).standard_normal(mib * (1 << 20) // 4, dtype=np.float32)
    view = memoryview(big).cast("B")
    contexts = {n: zmq.Context(n) for n in streams}
    socks: dict[int, list[zmq.Socket]] = {}
    for n in streams:
        socks[n] = []
        for k in range(n):
            s = contexts[n].socket(zmq.DEALER)
            s.curve_serverkey, s.curve_publickey, s.curve_secretkey = (
                keys.server_key.encode(), keys.public_key.encode(), keys.secret_key.encode())
            s.setsockopt(zmq.IDENTITY, f"{n}:{k}".encode())
            s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SNDHWM, 0)
            s.connect(curve)
            s.send(b"hello")
            socks[n].append(s)
    ctx = zmq.Context()
    plain = ctx.socket(zmq.DEALER)
    plain.setsockopt(zmq.LINGER, 0)
    plain.connect(raw)
    plain.send(b"hello")
    control = socks[streams[0]][0]
    poller = zmq.Poller()
    poller.register(control, zmq.POLLIN)
    poller.register(plain, zmq.POLLIN)
    while True:
        ready = dict(poller.poll(RECV_TIMEOUT_MS))
        if plain in ready:
            plain.recv()
            plain.send(view, copy=False)
        if control in ready:
            cmd = control.recv()
            if cmd == b"quit":
                break
            n = int(cmd)
            for s, (lo, hi) in zip(socks[n], _shares(len(view), n), strict=True):
                parts = [view[i : min(hi, i + FRAME_CHUNK_BYTES)] for i in range(lo, hi, FRAME_CHUNK_BYTES)]
                s.send_multipart(parts, copy=False)
    for ss in socks.values():
        for s in ss:
            s.close(0)
    plain.close(0)
    for c in contexts.values():
        c.term()
    ctx.term()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--streams", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--role", choices=("sender",))
    p.add_argument("--curve")
    p.add_argument("--raw")
    a = p.parse_args()
    if a.role == "sender":
        sender(a.curve, a.raw, a.mib, a.streams)
        return 0
    nbytes = a.mib * (1 << 20)
    ctx = zmq.Context(max(a.streams))
    auth = BusAuth(ctx)
    router = ctx.socket(zmq.ROUTER)
    auth.serve(router)
    router.setsockopt(zmq.LINGER, 0)
    router.setsockopt(zmq.RCVHWM, 0)
    router.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    curve = f"tcp://127.0.0.1:{router.bind_to_random_port('tcp://127.0.0.1')}"
    raw = ctx.socket(zmq.ROUTER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    raw_endpoint = f"tcp://127.0.0.1:{raw.bind_to_random_port('tcp://127.0.0.1')}"
    keys: CurveKeys = auth.issue()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--role", "sender", "--curve", curve, "--raw", raw_endpoint, "--mib", str(a.mib),
         "--streams", *map(str, a.streams)], stdin=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(msgspec.json.encode(keys) + b"\n")
    proc.stdin.close()
    load_before = [round(x, 2) for x in os.getloadavg()]
    times: dict[str, list[float]] = {"raw": [], **{str(n): [] for n in a.streams}}
    try:
        for _ in range(sum(a.streams)):
            router.recv_multipart()  # every stream's hello
        raw_peer, _ = raw.recv_multipart()
        control = f"{a.streams[0]}:0".encode()
        out = np.empty(nbytes, np.uint8)
        expected = np.random.default_rng(0).standard_normal(nbytes // 4, dtype=np.float32)
        for i in range(a.rounds + 1):
            t0 = time.perf_counter()
            raw.send_multipart([raw_peer, b"go"])
            _, frame = raw.recv_multipart(copy=False)
            dt = time.perf_counter() - t0
            assert len(frame.buffer) == nbytes
            if i:
                times["raw"].append(dt)
            for n in a.streams:
                shares = _shares(nbytes, n)
                t0 = time.perf_counter()
                router.send_multipart([control, str(n).encode()])
                for _ in range(n):
                    ident, *parts = router.recv_multipart(copy=False)
                    pos = shares[int(ident.bytes.split(b":")[1])][0]
                    for f in parts:
                        m = len(f.buffer)
                        out[pos : pos + m] = np.frombuffer(f.buffer, np.uint8)
                        pos += m
                dt = time.perf_counter() - t0
                if i:
                    times[str(n)].append(dt)
                if i == 1:  # (outside the timing) every stream count reassembles the exact bytes
                    assert np.array_equal(out.view(np.float32), expected), f"{n} streams: bytes differ"
                    out[:] = 0
        router.send_multipart([control, b"quit"])
        proc.wait(EXIT_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        router.close(0)
        raw.close(0)
        auth.close()
        ctx.term()
    raw_mib_s = a.mib / statistics.median(times["raw"])
    result = {}
    for n in a.streams:
        mib_s = a.mib / statistics.median(times[str(n)])
        result[str(n)] = {"mib_s": round(mib_s), "vs_raw": round(mib_s / raw_mib_s, 2)}
    print(json.dumps({
        "bench": "curve_streams", "transport": "tcp loopback", "mib": a.mib, "rounds": a.rounds,
        "cpus": os.cpu_count(), "frame_bytes": FRAME_CHUNK_BYTES, "raw_tcp_mib_s": round(raw_mib_s),
        "curve_streams": result, "load_before": load_before, "load_after": [round(x, 2) for x in os.getloadavg()],
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
