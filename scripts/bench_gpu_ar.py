"""AR decode benchmark: HfAREngine (static slots + CUDA graphs, and dynamic) against transformers `generate`.

Builds a Qwen2-1.5B-sized causal LM with random weights on --device (hidden
1536, 28 layers, 12 heads / 2 KV heads, MLP 8960, vocab 151936, tied
embeddings), saves it in the real Hugging Face format (safetensors, config,
generation config, an offline Qwen tokenizer), then measures in the same run:

- generate: `AutoModelForCausalLM.from_pretrained(...).generate`, greedy, one
  call per batch (batch rows share the prompt length, so no padding);
- engine modes: HfAREngine with CausalLMAdapter loading the same folder,
  `kv_cache` static + `cuda_graphs` on, static eager, and dynamic; a batch of
  B is B requests added at once, stepped until all finish. `static_fused`
  (+ graphs), `static_fused_compiled` (+ compile + graphs) and
  `static_fused_eager` run our own decode step (`fused_decode`,
  hf_ar_fused.py; on CUDA one step queued ahead, hf_ar_lookahead.py;
  `static_fused_compiled` compiles one layer's code shared by every layer
  (the default `compile_scope: layer`; `_step`: the whole step per bucket);
  `static_fused_compiled_sync` and `static_graphs_sync` are those without it;
  `static_fused_compiled_sdpa` with the compiled step's attention left to SDPA
  (hf_ar_slots.COMPILED_MATH_ATTENTION off, the baseline of the written-out attention);
  `static_fused_compiled_lt` with GEMMs on cuBLASLt, `engine_extras.blas`: that choice is the
  process's, so name it after the modes it is compared with); on CPU graphs
  and compile are off, so `static_fused` runs the fused step eagerly.

`graph_vs_eager` (modes with graphs or the fused step): one decode step's
logits from the mode's step against the transformers step run eagerly on the
same inputs. `same_ids_as_static_eager`: each mode's greedy ids against
static eager's.

Per batch size: decode tokens/s (B x new tokens / wall time, prefill
included), TTFT p50 (add -> first token) and ITL p50 (gap between a
request's tokens). Every request: --prompt-len random prompt ids, exactly
--new-tokens greedy tokens (ignore_eos). One warm-up of each shape first.

    python scripts/bench_gpu_ar.py --device cuda --dtype bfloat16
    python scripts/bench_gpu_ar.py --device cpu --dtype float32 --tiny     # smoke run
    python scripts/bench_gpu_ar.py --device cpu --dtype float32 --tiny --modes static_eager,static_fused

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ADAPTER = "omni_actors.workers.engines.hf_ar:CausalLMAdapter"
SIZES = {
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
             "num_attention_heads": 12, "num_key_value_heads": 2},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2},
}  # fmt: skip
TOKENS: dict[str, dict[str, list[list[int]]]] = {}
"""Greedy ids of each engine mode's measured runs, to check the modes agree."""
MODES = {
    "static_fused_compiled": {
        "kv_cache": "static",
        "cuda_graphs": True,
        "compile": True,
        "fused_decode": True,
    },
    "static_fused_compiled_dyn": {
        "kv_cache": "static",
        "cuda_graphs": True,
        "compile": True,
        "compile_dynamic": True,
        "fused_decode": True,
    },
    "static_fused_compiled_step": {
        "kv_cache": "static",
        "cuda_graphs": True,
        "compile": True,
        "compile_scope": "step",
        "fused_decode": True,
    },
    "static_fused_compiled_lt": {
        "kv_cache": "static",
        "cuda_graphs": True,
        "compile": True,
        "fused_decode": True,
        "blas": "cublaslt",
    },
    "static_fused_compiled_warm": {
        "kv_cache": "static",
        "cuda_graphs": True,
        "compile": True,
        "fused_decode": True,
        "warm_graphs": True,
    },
    "static_fused_compiled_sdpa": {
        "kv_cache": "static",
        "cuda_graphs": True,
        "compile": True,
        "fused_decode": True,
        "_sdpa": True,
    },
    "static_fused_compiled_sync": {
        "kv_cache": "static",
        "cuda_graphs": True,
        "compile": True,
        "fused_decode": True,
        "lookahead": False,
    },
    "static_fused_autotuned": {
        "kv_cache": "static",
        "cuda_graphs": True,
        "compile": True,
        "compile_mode": "max-autotune-no-cudagraphs",
        "fused_decode": True,
    },
    "static_fused": {"kv_cache": "static", "cuda_graphs": True, "fused_decode": True, "compile": False},
    "static_fused_eager": {"kv_cache": "static", "cuda_graphs": False, "fused_decode": True, "compile": False},
    "static_compiled": {"kv_cache": "static", "cuda_graphs": True, "compile": True, "fused_decode": False},
    "static_graphs": {"kv_cache": "static", "cuda_graphs": True, "fused_decode": False},
    "static_graphs_sync": {"kv_cache": "static", "cuda_graphs": True, "lookahead": False, "fused_decode": False},
    "static_eager": {"kv_cache": "static", "cuda_graphs": False, "fused_decode": False},
    "dynamic": {"kv_cache": "dynamic", "cuda_graphs": False},
}


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the checkpoint is written (default: a temporary folder, removed at the end)",
    )
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model (smoke run)")
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--modes", default="generate,static_graphs,static_eager,dynamic")
    ap.add_argument("--profile", action="store_true", help="torch.profiler table of one engine run")
    return ap.parse_args()


def build(args: argparse.Namespace) -> dict:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from omni_actors.models.tiny.qwen2_5_omni import (
        QWEN2_5_OMNI_EXTRA,
        QWEN2_5_OMNI_SPECIALS,
        build_qwen_tokenizer,
    )

    t0 = time.perf_counter()
    config = Qwen2Config(
        vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
        tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=151643, eos_token_id=151645,
        **SIZES["tiny" if args.tiny else "1.5b"],
    )  # fmt: skip
    torch.manual_seed(0)
    with torch.device(args.device):
        model = Qwen2ForCausalLM(config).eval()
    model.to(getattr(torch, args.dtype))
    params = sum(p.numel() for p in model.parameters())
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(bos_token_id=151643, eos_token_id=151645).save_pretrained(args.out)
    build_qwen_tokenizer(QWEN2_5_OMNI_SPECIALS, QWEN2_5_OMNI_EXTRA, "").save_pretrained(args.out)
    del model
    return {"params": params, "build_s": round(time.perf_counter() - t0, 2)}


def prompts(batch: int, length: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 151000, (batch, length), generator=g).tolist()


def sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def bench_generate(args: argparse.Namespace, batches: list[int]) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(args.out, dtype=dtype).to(args.device).eval()
    n = args.new_tokens
    res = {}
    for b in batches:
        ids = torch.tensor(prompts(b, args.prompt_len, 1), device=args.device)

        def gen(tokens: int, ids=ids, model=model) -> float:
            sync(args.device)
            t = time.perf_counter()
            model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                min_new_tokens=tokens, do_sample=False, pad_token_id=0,
            )  # fmt: skip
            sync(args.device)
            return time.perf_counter() - t

        gen(4)  # warm-up
        ttft = gen(1)
        total = gen(n)
        res[f"b{b}"] = {
            "tokens_per_s": round(b * n / total, 1),
            "ttft_p50_ms": round(ttft * 1e3, 2),
            "itl_p50_ms": round((total - ttft) / (n - 1) * 1e3, 2),
        }
    del model
    return res


def engine_ctx(args: argparse.Namespace, extras: dict, slots: int):
    from omni_actors.workers.engine import EngineContext

    return EngineContext(
        stage_id=0, replica=0, model_stage="llm", model_path=args.out, device=args.device,
        max_num_seqs=slots, dtype=args.dtype, gpu_memory_utilization=0.9,
        tensor_parallel_size=1,
        engine_extras={"adapter": ADAPTER, "max_model_len": args.prompt_len + args.new_tokens + 64,
                       **extras},
    )  # fmt: skip


def run_batch(engine, args: argparse.Namespace, b: int, seed: int) -> dict:
    params = {"max_tokens": args.new_tokens, "ignore_eos": True}
    sync(args.device)
    t0 = time.perf_counter()
    added = {}
    for i, ids in enumerate(prompts(b, args.prompt_len, seed)):
        added[f"q{i}"] = time.perf_counter()
        engine.add(f"q{i}", {"prompt_token_ids": ids}, params)
    last: dict[str, float] = {}
    ttft, gaps = [], []
    count = 0
    ids: dict[str, list[int]] = {rid: [] for rid in added}
    while engine.has_work():
        outs = engine.step()
        now = time.perf_counter()  # step() synced: sampling reads the tokens
        for out in outs:
            assert out.error is None, out.error
            count += len(out.payload["token_ids"])
            rid = out.request_id
            ids[rid] += out.payload["token_ids"]
            if rid in last:
                gaps.append(now - last[rid])
            else:
                ttft.append(now - added[rid])
            last[rid] = now
    total = time.perf_counter() - t0
    assert count == b * args.new_tokens, count
    return {
        "tokens_per_s": round(count / total, 1),
        "ttft_p50_ms": round(statistics.median(ttft) * 1e3, 2),
        "itl_p50_ms": round(statistics.median(gaps) * 1e3, 2),
        "ids": [ids[rid] for rid in added],
    }


def check_graph(engine, args: argparse.Namespace, b: int) -> dict:
    """One decode step's logits from the mode's step (captured graph, fused step) against the
    transformers step run eagerly on the same inputs (both write the same KV position)."""
    import torch

    for i, ids in enumerate(prompts(b, args.prompt_len, 3)):
        engine.add(f"g{i}", {"prompt_token_ids": ids}, {"max_tokens": 8, "ignore_eos": True})
    for _ in range(3):  # prefill, then two decode steps (graph replays)
        engine.step()
    seqs = list(engine.seqs.values())
    with torch.inference_mode():
        batch, length = engine.slots.shape_for()
        embeds = engine.adapter.decode_embeds(seqs).to(engine.device)
        rows = engine.slots.load_inputs(batch, seqs, embeds)
        eager = engine._static_forward(batch, length).logits[rows].float().clone()
        graph = engine.graphs.run(batch, length).logits[rows].float().clone()
    for seq in seqs:
        engine.abort(seq.request_id)
    return {
        "rows": len(seqs),
        "max_abs_logit_diff": round(float((eager - graph).abs().max()), 6),
        "logit_scale": round(float(eager.abs().max()), 3),
        "same_argmax": round(float((eager.argmax(-1) == graph.argmax(-1)).float().mean()), 3),
    }


def bench_engine(args: argparse.Namespace, extras: dict, batches: list[int]) -> dict:
    import torch

    from omni_actors.workers.engines import hf_ar_slots
    from omni_actors.workers.engines.hf_ar import HfAREngine

    key, extras = json.dumps(extras), dict(extras)
    hf_ar_slots.COMPILED_MATH_ATTENTION = not extras.pop(
        "_sdpa", False
    )  # (read when a step compiles)
    t0 = time.perf_counter()
    engine = HfAREngine(engine_ctx(args, extras, max(batches)))
    res: dict = {"load_s": round(time.perf_counter() - t0, 2), "first_run_s": {}}
    for b in batches:
        t0 = time.perf_counter()
        run_batch(engine, args, b, seed=100 + b)  # warm-up (compiles, captures this shape's graphs)
        res["first_run_s"][f"b{b}"] = round(time.perf_counter() - t0, 2)
        res[f"b{b}"] = run_batch(engine, args, b, seed=1)
    if args.profile and extras.get("cuda_graphs"):
        from torch.profiler import ProfilerActivity, profile

        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
        with profile(activities=acts) as prof:
            run_batch(engine, args, max(batches), seed=2)
        table = prof.key_averages()
        if args.device == "cuda":
            print(table.table(sort_by="cuda_time_total", row_limit=20), file=sys.stderr)
        print(table.table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
    res["cuda_graphs_on"] = bool(engine.graphs and engine.graphs.enabled)
    res["fused_on"] = engine.fused is not None
    if res["cuda_graphs_on"] or res["fused_on"]:
        res["graph_vs_eager"] = check_graph(engine, args, max(batches))
    TOKENS[key] = {k: v.pop("ids") for k, v in res.items() if k.startswith("b")}
    engine.close()
    del engine
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    return res


def _prefix(a: list[int], b: list[int]) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def main() -> None:
    args = parse_args()
    if args.out is None:
        with tempfile.TemporaryDirectory() as tmp:
            args.out = Path(tmp) / "model"
            run(args)
    else:
        run(args)


def run(args: argparse.Namespace) -> None:
    batches = [int(b) for b in args.batches.split(",")]
    made = build(args)
    results = {}
    for mode in args.modes.split(","):
        if mode == "generate":
            results[mode] = bench_generate(args, batches)
        else:
            results[mode] = bench_engine(args, MODES[mode], batches)
        print(
            json.dumps({"mode": mode, **results[mode]}), file=sys.stderr, flush=True
        )  # a partial run keeps it
    speedup = {}
    if "generate" in results:
        for mode in results:
            if mode != "generate":
                speedup[mode] = {
                    k: round(v["tokens_per_s"] / results["generate"][k]["tokens_per_s"], 2)
                    for k, v in results[mode].items()
                    if k.startswith("b")
                }
    agree = {}
    ref = TOKENS.get(json.dumps(MODES["static_eager"]))
    for mode in results:
        got = TOKENS.get(json.dumps(MODES.get(mode, {})))
        if ref is None or got is None or mode == "static_eager":
            continue
        agree[mode] = {  # fraction of requests whose greedy ids equal static eager's
            k: round(sum(a == b for a, b in zip(got[k], ref[k], strict=True)) / len(ref[k]), 3)
            for k in ref
        }
        agree[mode]["common_prefix_p50"] = {  # tokens before the first difference
            k: statistics.median(_prefix(a, b) for a, b in zip(got[k], ref[k], strict=True))
            for k in ref
        }
    print(json.dumps({
        "bench": "gpu_ar", "model": "qwen2-tiny" if args.tiny else "qwen2-1.5b-sized",
        "device": args.device, "dtype": args.dtype, "prompt_len": args.prompt_len,
        "new_tokens": args.new_tokens, **made, "results": results, "speedup_vs_generate": speedup,
        "same_ids_as_static_eager": agree,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
