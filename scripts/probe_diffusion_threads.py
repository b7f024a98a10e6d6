"""Probe: does running each diffusers call in a fresh thread cost time on CUDA?

DiffusionEngine runs every batch's `pipe(...)` in a new thread. On the H200 the
engine reached 0.43x of calling the pipeline directly at batch 1 (see
docs/benchmarks.md, GPU section). This probe times the same pipeline call
(batch 1 and 4) five ways, in images/s:

    main        pipe() in the main thread (the direct baseline)
    new_thread  pipe() in a new threading.Thread per call
    one_thread  pipe() always in the same long-lived thread
    engine      DiffusionEngine as it is (a new thread per batch)
    engine_one  DiffusionEngine with its batch threads run on one long-lived thread

    python scripts/probe_diffusion_threads.py --model DIR --device cuda --dtype float16

Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPT = "a photo of a cat sitting on the red chair in the garden"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--calls", type=int, default=6)
    args = ap.parse_args()

    import torch

    from omni_actors.workers.engine import EngineContext
    from omni_actors.workers.engines import diffusion as d

    pipe = d.load_pipeline(args.model, args.device, args.dtype)

    def call(batch: int) -> None:
        gens = [torch.Generator("cpu").manual_seed(i) for i in range(batch)]
        pipe(prompt=[PROMPT] * batch, num_inference_steps=args.steps, width=args.size,
             height=args.size, generator=gens, output_type="np")  # fmt: skip

    def in_new_thread(batch: int) -> None:
        t = threading.Thread(target=call, args=(batch,))
        t.start()
        t.join()

    pool = ThreadPoolExecutor(1)

    def in_one_thread(batch: int) -> None:
        pool.submit(call, batch).result()

    def rate(fn: Any, batch: int) -> float:
        fn(batch)  # warm-up
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn(batch)
        return round(args.calls * batch / (time.perf_counter() - t0), 3)

    out: dict[str, Any] = {"probe": "diffusion_threads", "device": args.device,
                           "size": args.size, "steps": args.steps, "calls": args.calls}  # fmt: skip
    for name, fn in (("main", call), ("new_thread", in_new_thread), ("one_thread", in_one_thread)):
        out[name] = {f"batch{b}": rate(fn, b) for b in (1, 4)}

    ctx = EngineContext(
        stage_id=0, replica=0, model_stage="diffusion", model_path=args.model,
        device=args.device, max_num_seqs=4, dtype=args.dtype, gpu_memory_utilization=0.9,
        tensor_parallel_size=1,
    )  # fmt: skip

    def engine_rate(engine: Any, c: int) -> float:
        params = {"num_inference_steps": args.steps, "width": args.size, "height": args.size}

        def round_(tag: str) -> None:
            for i in range(c):
                engine.add(f"{tag}-{i}", {"prompt": PROMPT}, {**params, "seed": i})
            while engine.has_work():
                for o in engine.step():
                    if o.error:
                        raise RuntimeError(o.error)

        round_("warm")
        t0 = time.perf_counter()
        for r in range(args.calls):
            round_(str(r))
        return round(args.calls * c / (time.perf_counter() - t0), 3)

    engine = d.DiffusionEngine(ctx)
    out["engine"] = {f"c{c}": engine_rate(engine, c) for c in (1, 4)}
    engine.close()

    batch_pool = ThreadPoolExecutor(1, thread_name_prefix="diffusion-batch")

    def start(self: Any) -> None:
        self._future = batch_pool.submit(self._run)

    def join(self: Any) -> None:
        try:
            self._future.result(timeout=d.BATCH_EXIT_TIMEOUT_S)
        except Exception:
            pass

    d._Batch.start, d._Batch.join = start, join
    engine = d.DiffusionEngine(ctx)
    out["engine_one"] = {f"c{c}": engine_rate(engine, c) for c in (1, 4)}
    engine.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
