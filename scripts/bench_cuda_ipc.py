"""Same-GPU handoff benchmark: a 64 MiB CUDA tensor from one worker process to another by IPC handle.

Two real processes (this script started twice more, as `--role producer` and
`--role consumer`) talk over a ZeroMQ ipc PAIR socket with the bus's own
messages and codec. Each round the producer makes a fresh tensor, encodes it
with `PayloadCodec(cuda_ipc=True)` (an IPC handle under a lease, no host copy)
and sends a Feed; the consumer decodes it (maps the allocation), synchronizes
and answers with a Release, which frees the producer's lease. Handoff time is
the producer's send stamp to the consumer's mapped-and-synced stamp
(CLOCK_MONOTONIC, shared by both processes).

Baseline, same run, in the producer: `dst.copy_(src)` of the same tensor on the
same device (device-to-device copy), synchronized. Target: handoff speed >= 0.5x
the copy's (`speed_vs_d2d_copy` = copy time / handoff time).

The first round checks the bytes (the consumer's checksum equals the producer's).

    .venv/bin/python scripts/bench_cuda_ipc.py [--mib 64] [--rounds 50]

Prints one JSON line. Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import msgspec
import zmq

from omni_actors.bus import messages as m
from omni_actors.bus.codec import PayloadCodec, leases_of
from omni_actors.bus.shm import SegmentCache

EXIT_TIMEOUT_S = 60.0
RECV_TIMEOUT_MS = 60_000


def _sock(endpoint: str, bind: bool) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    (sock.bind if bind else sock.connect)(endpoint)
    return ctx, sock


def producer(endpoint: str, mib: int, rounds: int) -> None:
    import torch

    torch.manual_seed(0)
    ctx, sock = _sock(endpoint, bind=False)
    codec = PayloadCodec("producer", None, SegmentCache(), cuda_ipc=True)
    n = mib * (1 << 20) // 2
    copies = []
    for i in range(rounds):
        src = torch.randn(n, device="cuda", dtype=torch.float32).to(torch.bfloat16)
        checksum = float(src.float().sum().item()) if i == 0 else 0.0
        dst = torch.empty_like(src)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        dst.copy_(src)
        torch.cuda.synchronize()
        copies.append(time.perf_counter() - t0)
        del dst
        sent = time.perf_counter()
        payload = codec.encode({"x": src, "sent": sent, "checksum": checksum})
        sock.send(m.encode(m.Feed("bench", 0, payload)))
        reply = m.decode(sock.recv())
        assert isinstance(reply, m.Release)
        codec.free([ref.lease for ref in reply.leases])
        del src
    assert codec.leased == 0
    sock.send(msgspec.json.encode({"copy_s": copies}))
    sock.close(0)
    ctx.term()


def consumer(endpoint: str, rounds: int) -> None:
    import torch

    torch.cuda.init()
    ctx, sock = _sock(endpoint, bind=True)
    codec = PayloadCodec("consumer", None, SegmentCache())
    times, ok = [], True
    for i in range(rounds):
        msg = m.decode(sock.recv())
        assert isinstance(msg, m.Feed)
        data = codec.decode(msg.payload)
        x = data["x"]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - data["sent"])
        assert x.is_cuda and x.dtype == torch.bfloat16
        if i == 0:
            ok = abs(float(x.float().sum().item()) - data["checksum"]) < 1e-3 * max(1.0, abs(data["checksum"]))
        del x, data
        sock.send(m.encode(m.Release(leases_of(msg.payload))))
    result = msgspec.json.decode(sock.recv())
    print(json.dumps({"handoff_s": times, "copy_s": result["copy_s"], "equal": ok}), flush=True)
    sock.close(0)
    ctx.term()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--rounds", type=int, default=50)
    p.add_argument("--role", choices=("producer", "consumer"))
    p.add_argument("--endpoint")
    a = p.parse_args()
    if a.role == "producer":
        producer(a.endpoint, a.mib, a.rounds)
        return 0
    if a.role == "consumer":
        consumer(a.endpoint, a.rounds)
        return 0
    with tempfile.TemporaryDirectory(prefix="omni-ipc-") as tmp:
        endpoint = f"ipc://{tmp}/bench.sock"
        me = [sys.executable, os.path.abspath(__file__), "--endpoint", endpoint]
        cons = subprocess.Popen([*me, "--role", "consumer", "--rounds", str(a.rounds)], stdout=subprocess.PIPE, text=True)
        prod = subprocess.Popen([*me, "--role", "producer", "--mib", str(a.mib), "--rounds", str(a.rounds)])
        out, _ = cons.communicate(timeout=EXIT_TIMEOUT_S + a.rounds)
        prod.wait(EXIT_TIMEOUT_S)
        if cons.returncode or prod.returncode:
            print(json.dumps({"error": f"consumer exit {cons.returncode}, producer exit {prod.returncode}"}))
            return 1
    r = json.loads(out.strip().splitlines()[-1])
    hand, copy = r["handoff_s"][1:] or r["handoff_s"], r["copy_s"][1:] or r["copy_s"]  # round 0 warms up
    p50_hand, p50_copy = statistics.median(hand), statistics.median(copy)
    print(json.dumps({
        "bench": "cuda_ipc", "mib": a.mib, "rounds": a.rounds, "equal": r["equal"],
        "handoff_first_ms": round(r["handoff_s"][0] * 1e3, 3),
        "handoff_p50_ms": round(p50_hand * 1e3, 3), "d2d_copy_p50_ms": round(p50_copy * 1e3, 3),
        "handoff_gbps": round(a.mib / 1024 / p50_hand, 1), "d2d_copy_gbps": round(a.mib / 1024 / p50_copy, 1),
        "speed_vs_d2d_copy": round(p50_copy / p50_hand, 2), "target": 0.5,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
