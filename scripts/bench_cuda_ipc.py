"""Same-GPU handoff benchmark: a 64 MiB CUDA tensor from one worker process to another by IPC handle.

Two real processes (this script started twice more, as `--role producer` and
`--role consumer`) talk over a ZeroMQ ipc PAIR socket with the bus's own
messages and codec. Each round the producer makes a fresh tensor (the caching
allocator hands back the block the last round freed, as in a stage that steps),
encodes it with `PayloadCodec(cuda_ipc=True)` and sends a Feed; the consumer
decodes it, synchronizes its stream and answers with a Release once the tensor
has ended, which frees the producer's lease. Handoff time is the producer's
send stamp (taken before encoding) to the consumer's decoded-and-synced stamp
(CLOCK_MONOTONIC, shared by both processes).

Paths, same run: "segment" (the allocation's handle, mapped once by the
consumer, an IPC event per handoff: bus.cuda_ipc's fast path) and "torch"
(torch's per-storage reduction: open and close per handoff; run first, so the
two never map one allocation in the consumer at once). "message": the same Feed
without the tensor, what the bus itself costs per handoff.

Phases (p50 each, so a run says where the time goes): the producer's encode
and send, the consumer's wait for the message, decode, and stream sync.

Streamed ("stream_*"): what a stage that streams chunks sees. The producer
sends `rounds` handoffs back to back from a pool of POOL tensors (each mapped
by the consumer in a warm-up pass, as a stepping stage's blocks are), without
waiting for each Release; the consumer decodes and syncs each. Bandwidth is
rounds x size over the producer's first send stamp to the consumer's last
synced stamp; its baseline is `rounds` back-to-back device-to-device copies of
the same tensors, synchronized at the end.

Baseline, same run, in the producer: `dst.copy_(src)` of the same tensor on the
same device (device-to-device copy), synchronized. Target: handoff speed >= 0.5x
the copy's (`speed_vs_d2d_copy` = copy p50 / segment handoff p50; the message-less
ratio is reported beside it). Every round checks the bytes (checksum on both sides).

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
from omni_actors.bus.codec import PayloadCodec, leases_released_on_receipt
from omni_actors.bus.shm import SegmentCache

EXIT_TIMEOUT_S = 60.0
RECV_TIMEOUT_MS = 60_000
PATHS = ("torch", "segment")
POOL = 8
"""Tensors the streamed phase cycles through."""
PROFILE = os.environ.get("OMNI_BENCH_PROFILE") == "1"
"""cProfile the segment path's encode (producer) and decode + sync (consumer); stats go to stderr."""


class _Prof:
    def __init__(self) -> None:
        import cProfile

        self.p = cProfile.Profile() if PROFILE else None

    def on(self, path: str) -> None:
        if self.p is not None and path == "segment":
            self.p.enable()

    def off(self) -> None:
        if self.p is not None:
            self.p.disable()

    def report(self, who: str) -> None:
        if self.p is not None:
            import pstats

            print(f"---- {who}", file=sys.stderr)
            pstats.Stats(self.p, stream=sys.stderr).sort_stats("tottime").print_stats(14)
"""Tensors the streamed phase cycles through."""


def _sock(endpoint: str, bind: bool) -> tuple[zmq.Context, zmq.Socket]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, RECV_TIMEOUT_MS)
    (sock.bind if bind else sock.connect)(endpoint)
    return ctx, sock


def _checksum(t: object) -> float:
    return float(t.float().sum().item())  # type: ignore[attr-defined]


def producer(endpoint: str, mib: int, rounds: int) -> None:
    import torch

    torch.manual_seed(0)
    ctx, sock = _sock(endpoint, bind=False)
    codecs = {path: PayloadCodec("producer", None, SegmentCache(), cuda_ipc=True) for path in PATHS}
    codecs["torch"].cuda_export = None  # torch's reduction only
    n = mib * (1 << 20) // 2
    copies: list[float] = []
    phases: dict[str, list[float]] = {"encode": [], "send": []}
    prof = _Prof()
    for path in PATHS:
        codec = codecs[path]
        for _ in range(rounds):
            src = torch.randn(n, device="cuda", dtype=torch.float32).to(torch.bfloat16)
            checksum = _checksum(src)
            if path == PATHS[0]:
                dst = torch.empty_like(src)
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                dst.copy_(src)
                torch.cuda.synchronize()
                copies.append(time.perf_counter() - t0)
                del dst
            torch.cuda.synchronize()
            sent = time.perf_counter()
            prof.on(path)
            payload = codec.encode({"x": src, "sent": sent, "checksum": checksum, "path": path})
            encoded = time.perf_counter()
            prof.off()
            sock.send(m.encode(m.Feed("bench", 0, payload)))
            if path == "segment":
                phases["encode"].append(encoded - sent)
                phases["send"].append(time.perf_counter() - encoded)
            reply = m.decode(sock.recv())
            assert isinstance(reply, m.Release)
            codec.free([ref.lease for ref in reply.leases])
            del src
            sent = time.perf_counter()
            sock.send(m.encode(m.Feed("bench", 0, m.Payload(data={"sent": sent, "path": "message"}))))
            assert isinstance(m.decode(sock.recv()), m.Release)
        assert codec.leased == 0, f"{path}: {codec.leased} leases never came back"
    prof.report("producer: encode")
    stream = _stream(sock, codecs["segment"], n, rounds)
    exporter = codecs["segment"].cuda_export
    sock.send(msgspec.json.encode({"copy_s": copies, "segment_path_off": exporter.unavailable if exporter else None,
                                   "phases": phases, **stream}))
    sock.close(0)
    ctx.term()


def _stream(sock: zmq.Socket, codec: PayloadCodec, n: int, rounds: int) -> dict[str, float]:
    """Streamed handoffs from a pool (mapped in a warm-up pass), then the same copies back to back."""
    import torch

    pool = [torch.randn(n, device="cuda", dtype=torch.float32).to(torch.bfloat16) for _ in range(POOL)]
    sums = [_checksum(t) for t in pool]
    torch.cuda.synchronize()
    for warm, count in ((True, POOL), (False, rounds)):
        t0 = time.perf_counter()
        for i in range(count):
            k = i % POOL
            payload = codec.encode({"x": pool[k], "sent": t0, "checksum": sums[k], "path": "warm" if warm else "stream"})
            sock.send(m.encode(m.Feed("bench", 0, payload)))
        for _ in range(count):
            reply = m.decode(sock.recv())
            assert isinstance(reply, m.Release)
            codec.free([ref.lease for ref in reply.leases])
    dst = torch.empty_like(pool[0])
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(rounds):
        dst.copy_(pool[i % POOL])
    torch.cuda.synchronize()
    return {"stream_copy_s": time.perf_counter() - t0}


def consumer(endpoint: str, rounds: int) -> None:
    import torch

    torch.cuda.init()
    ctx, sock = _sock(endpoint, bind=True)
    codec = PayloadCodec("consumer", None, SegmentCache())
    times: dict[str, list[float]] = {"torch": [], "segment": [], "message": [], "stream": [], "warm": []}
    phases: dict[str, list[float]] = {"wait": [], "decode": [], "sync": []}
    paths_seen: dict[str, set[str]] = {}
    prof = _Prof()
    bad = 0
    for _ in range(2 * len(PATHS) * rounds + POOL + rounds):
        msg = m.decode(sock.recv())
        received = time.perf_counter()
        assert isinstance(msg, m.Feed)
        path = msg.payload.data.get("path", "")
        prof.on(path)
        data = codec.decode(msg.payload)
        decoded = time.perf_counter()
        if path == "message":
            times[path].append(time.perf_counter() - data["sent"])
            sock.send(m.encode(m.Release([])))
            continue
        x = data["x"]
        torch.cuda.current_stream().synchronize()
        synced = time.perf_counter()
        prof.off()
        times[path].append(synced - data["sent"])
        if path == "segment":
            phases["wait"].append(received - data["sent"])
            phases["decode"].append(decoded - received)
            phases["sync"].append(synced - decoded)
        ref = msg.payload.arrays["x"]
        paths_seen.setdefault(path, set()).add("segment" if ref.cuda_segment else "torch" if ref.cuda else "host")
        checked = path != "stream"  # (the streamed pool's bytes are checked in its warm-up pass)
        if not (x.is_cuda and x.dtype == torch.bfloat16) or (checked and abs(_checksum(x) - data["checksum"]) > 1e-3 * max(
            1.0, abs(data["checksum"])
        )):
            bad += 1
        del x, data
        if path == "segment" and len(times[path]) == rounds:
            codec.cuda_import.close()  # (nothing mapped is left behind)
        if path == "stream" and len(times[path]) == rounds:
            codec.cuda_import.close()
        released = leases_released_on_receipt(msg.payload) + codec.cuda_released()
        sock.send(m.encode(m.Release(released)))
    prof.report("consumer: decode + sync")
    result = msgspec.json.decode(sock.recv())
    imp = codec.cuda_import
    print(json.dumps({
        "times": times, "copy_s": result["copy_s"], "bad_rounds": bad, "segment_path_off": result["segment_path_off"],
        "paths_seen": {k: sorted(v) for k, v in paths_seen.items()}, "opens": imp.opens, "reuses": imp.reuses,
        "mapped_after": imp.mapped, "phases": {**result["phases"], **phases}, "stream_copy_s": result["stream_copy_s"],
    }), flush=True)
    codec.close()
    sock.close(0)
    ctx.term()


def _p50(xs: list[float]) -> float:
    return statistics.median(xs[1:] or xs)  # the first round warms up


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
        cons = subprocess.Popen([*me, "--role", "consumer", "--rounds", str(a.rounds)],
                                stdout=subprocess.PIPE, text=True)
        prod = subprocess.Popen([*me, "--role", "producer", "--mib", str(a.mib), "--rounds", str(a.rounds)])
        out, _ = cons.communicate(timeout=EXIT_TIMEOUT_S + 2 * a.rounds)
        prod.wait(EXIT_TIMEOUT_S)
        if cons.returncode or prod.returncode:
            print(json.dumps({"error": f"consumer exit {cons.returncode}, producer exit {prod.returncode}"}))
            return 1
    r = json.loads(out.strip().splitlines()[-1])
    t = r["times"]
    seg, tor, msg, copy = _p50(t["segment"]), _p50(t["torch"]), _p50(t["message"]), _p50(r["copy_s"])
    print(json.dumps({
        "bench": "cuda_ipc", "mib": a.mib, "rounds": a.rounds, "equal": r["bad_rounds"] == 0,
        "bad_rounds": r["bad_rounds"], "paths_seen": r["paths_seen"], "segment_path_off": r["segment_path_off"],
        "consumer_maps_opened": r["opens"], "consumer_maps_reused": r["reuses"], "mapped_after": r["mapped_after"],
        "handoff_first_ms": round(t["segment"][0] * 1e3, 3), "handoff_p50_ms": round(seg * 1e3, 3),
        "torch_path_first_ms": round(t["torch"][0] * 1e3, 3), "torch_path_p50_ms": round(tor * 1e3, 3),
        "message_p50_ms": round(msg * 1e3, 3), "d2d_copy_p50_ms": round(copy * 1e3, 3),
        "handoff_gbps": round(a.mib / 1024 / seg, 1), "d2d_copy_gbps": round(a.mib / 1024 / copy, 1),
        "speed_vs_d2d_copy": round(copy / seg, 2),
        "speed_vs_d2d_copy_without_message": round(copy / max(seg - msg, 1e-9), 2),
        "torch_path_speed_vs_d2d_copy": round(copy / tor, 2),
        "phases_p50_us": {k: round(_p50(v) * 1e6, 1) for k, v in r["phases"].items()},
        "stream_gbps": round(a.rounds * a.mib / 1024 / max(t["stream"]), 1),
        "stream_copy_gbps": round(a.rounds * a.mib / 1024 / r["stream_copy_s"], 1),
        "stream_speed_vs_d2d_copy": round(r["stream_copy_s"] / max(t["stream"]), 2), "target": 0.5,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())
