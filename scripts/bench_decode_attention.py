"""One decode position's attention over slot K/V: the ways it can be written, timed alone.

The fused decode steps (hf_ar_fused.FusedDecoder, fused_passes.PassStack) attend one query
position per row over a slot cache through `hf_ar_slots.attend_one` (query heads grouped per
KV head, an additive mask for the slots' lengths, SDPA). This times that (the same-run
baseline, `sdpa_mask`) against the other ways of writing it, each compiled and replayed as
one function of --layers chained calls (as a step makes one per layer, the mask
built once), replayed as a CUDA graph:

- `math`: q @ K^T, the mask, softmax, @ V written out (inductor fuses the softmax);
- `flex`: torch's flex_attention with the lengths as a score_mod (its decoding kernel splits
  the keys across blocks), query heads grouped by `enable_gqa`.

Qwen2-1.5B's geometry by default (12 query heads, 2 KV heads, head dim 128), bfloat16.
Per (rows, length): microseconds per call (the graph's time / layers), and each variant's max |diff| from the baseline.

    python3 scripts/bench_decode_attention.py --device cuda
    python3 scripts/bench_decode_attention.py --device cpu --dtype float32 --rows 1 --lengths 64   # smoke

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni_actors.workers.engines.hf_ar_slots import additive_mask, attend_one


def inputs(rows: int, length: int, args, device, dtype):
    g = torch.Generator(device="cpu").manual_seed(rows * 1000 + length)
    q = torch.randn(rows, args.heads, 1, args.dim, generator=g).to(device, dtype)
    keys = torch.randn(rows, args.kv_heads, length, args.dim, generator=g).to(device, dtype)
    values = torch.randn(rows, args.kv_heads, length, args.dim, generator=g).to(device, dtype)
    lengths = torch.randint(length // 2, length, (rows,), generator=g).to(device)
    return q, keys, values, lengths


def sdpa_mask(q, keys, values, lengths, scale, layers):
    blocked = torch.arange(keys.shape[2], device=keys.device)[None] > lengths[:, None]
    mask = additive_mask(blocked, q.dtype)  # (once a step, as the fused steps build it)
    return chained(lambda x: attend_one(x, keys, values, mask, scale), q, layers)


def math(q, keys, values, lengths, scale, layers):
    blocked = torch.arange(keys.shape[2], device=keys.device)[None] > lengths[:, None]
    mask = blocked[:, None, None, :]

    def attend(x):
        rows, heads, _, dim = x.shape
        kv_heads = keys.shape[1]
        grouped = x.reshape(rows, kv_heads, heads // kv_heads, dim)
        scores = (grouped @ keys.transpose(-1, -2)).float() * scale  # [rows, kv, group, n]
        probs = scores.masked_fill(mask, torch.finfo(torch.float32).min).softmax(-1)
        return (probs.to(x.dtype) @ values).reshape(rows, 1, heads * dim)

    return chained(attend, q, layers)


def flex(q, keys, values, lengths, scale, layers):
    from torch.nn.attention.flex_attention import flex_attention

    def visible(score, b, h, q_idx, kv_idx):
        return torch.where(kv_idx <= lengths[b], score, -float("inf"))

    def attend(x):
        out = flex_attention(x, keys, values, score_mod=visible, scale=scale, enable_gqa=True)
        rows, heads, _, dim = x.shape
        return out.transpose(1, 2).reshape(rows, 1, heads * dim)

    return chained(attend, q, layers)


def chained(attend, q, layers: int):
    """`layers` calls, each query the last output added to q (as layers feed each other)."""
    out = attend(q)
    for _ in range(layers - 1):
        out = attend(q + out.view(q.shape[0], 1, q.shape[1], q.shape[3]).transpose(1, 2))
    return out


VARIANTS = {"sdpa_mask": sdpa_mask, "math": math, "flex": flex}


def timed(fn, args_, layers: int, reps: int, device) -> float:
    """Microseconds per call: `layers` calls replayed as one CUDA graph (a plain loop on CPU)."""

    def block():
        return fn(*args_, layers)

    for _ in range(3):
        block()
    if device.type == "cuda":
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            block()
            with torch.cuda.graph(graph, stream=stream):
                block()
        torch.cuda.current_stream().wait_stream(stream)
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1000.0 / (reps * layers)
    t0 = time.perf_counter()
    for _ in range(reps):
        block()
    return (time.perf_counter() - t0) * 1e6 / (reps * layers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    scale = args.dim**-0.5
    results: dict[str, dict] = {}
    for name in args.variants.split(","):
        fn = torch.compile(VARIANTS[name], fullgraph=True, dynamic=False)
        row: dict[str, dict] = {}
        for rows in args.rows:
            for length in args.lengths:
                data = inputs(rows, length, args, device, dtype)
                try:
                    with torch.no_grad():
                        got = fn(*data, scale, args.layers)
                        want = sdpa_mask(*data, scale, args.layers)
                        us = timed(fn, (*data, scale), args.layers, args.reps, device)
                    row[f"r{rows}_n{length}"] = {
                        "us": round(us, 2),
                        "max_abs_diff": round(float((got - want).abs().max()), 5),
                    }
                except (
                    Exception
                ) as exc:  # (a variant this torch cannot compile is reported, not fatal)
                    row[f"r{rows}_n{length}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
        results[name] = row
    print(
        json.dumps(
            {
                "bench": "decode_attention",
                "device": args.device,
                "dtype": args.dtype,
                "torch": torch.__version__,
                "heads": args.heads,
                "kv_heads": args.kv_heads,
                "dim": args.dim,
                "layers": args.layers,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
