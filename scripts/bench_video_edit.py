"""Served video edits against served creates of the same video, through the real server and SDK.

Starts `omni-run --model DIR` (a Wan2.2 text-to-video folder: the tiny one by default,
or e.g. `scripts/make_sized_wan.py`'s TI2V-5B-sized folder on a GPU), makes a video with
`client.videos.create` (the same-run baseline: a full schedule of --steps), then edits it
with `client.videos.edit` at each --strength (the VAE encode of the source, then
round(steps x strength) steps). Each job is timed from its submit to `completed` (the
server's long-poll, no sleeping), and the edit's MP4 is checked to have the source's size
and frame count. Prints one JSON line.

`--engine`: the same pair on the video engine in this process (no server, bus or MP4: where
PyAV is missing, as on the lent GPU host), the create's frames as the edit's source.

    python scripts/bench_video_edit.py --model DIR --size 1280x704 --seconds 3 --steps 8 --strength 0.5 1.0
    python scripts/bench_video_edit.py --model DIR --device cuda --engine --size 1280x704 --frames 49 --steps 4
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

JOB_WAIT_S = 1800
"""Longest a job may take."""
LONG_POLL_S = 600
"""The server's longest long-poll (`wait_s`); a job running longer is asked again."""


def _timed(client, submit) -> tuple[float, str]:
    t0 = time.perf_counter()
    job = submit()
    done = job
    while done.status in ("queued", "in_progress") and time.perf_counter() - t0 < JOB_WAIT_S:
        done = client.videos.retrieve(job.id, extra_query={"wait_s": LONG_POLL_S, "past": "in_progress"})
    assert done.status == "completed", done.error
    return time.perf_counter() - t0, job.id


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, help="a Wan2.2 text-to-video folder (default: the tiny wan2_2)")
    ap.add_argument("--size", default="32x32")
    ap.add_argument("--seconds", default="0.25")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--strength", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--engine", action="store_true", help="time the engine in-process instead")
    ap.add_argument("--device", default="cpu", help="with --engine")
    ap.add_argument("--frames", type=int, default=5, help="with --engine")
    args = ap.parse_args()
    if args.engine:
        return engine_main(args)

    import av
    import openai

    from omni_actors.models.tiny import make_tiny
    from tests.api.model_server import ModelRun

    with tempfile.TemporaryDirectory(prefix="omni-bench-edit-") as tmp:
        model = args.model or make_tiny("wan2_2", Path(tmp) / "wan2_2", seed=0)
        run = ModelRun(Path(tmp), Path(model), Path(tmp) / "data")
        try:
            t0 = time.perf_counter()
            run.wait_ready()
            startup_s = time.perf_counter() - t0
            client = openai.OpenAI(base_url=f"{run.url}/v1", api_key="unused", timeout=JOB_WAIT_S, max_retries=0)
            steps = {"num_inference_steps": args.steps, "seed": 1}
            create_s, source = _timed(client, lambda: client.videos.create(
                prompt="waves on a beach", size=args.size, seconds=args.seconds, extra_body=steps))
            edits = {}
            for strength in args.strength:
                edit_s, job = _timed(client, lambda s=strength: client.videos.edit(
                    prompt="the beach on fire", video=openai.omit,
                    extra_body={"video": {"id": source}, **steps, "strength": s}))
                data = client.videos.download_content(job).read()
                with av.open(io.BytesIO(data)) as f:
                    frames = [fr for fr in f.decode(video=0)]
                edits[str(strength)] = {"s": round(edit_s, 3), "vs_create": round(edit_s / create_s, 3),
                                        "size": f"{frames[0].width}x{frames[0].height}", "frames": len(frames)}
        finally:
            run.stop()
    print(json.dumps({"bench": "video_edit", "model": str(args.model or "tiny wan2_2"), "size": args.size,
                      "seconds": args.seconds, "steps": args.steps, "startup_s": round(startup_s, 2),
                      "create_s": round(create_s, 3), "edits": edits}))


def engine_main(args: argparse.Namespace) -> None:
    from omni_actors.models.tiny import make_tiny
    from omni_actors.workers.engine import EngineContext
    from omni_actors.workers.engines.video import VideoEngine

    width, height = (int(v) for v in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="omni-bench-edit-") as tmp:
        model = args.model or make_tiny("wan2_2", Path(tmp) / "wan2_2", seed=0)
        t0 = time.perf_counter()
        engine = VideoEngine(EngineContext(
            stage_id=0, replica=0, model_stage="diffusion", model_path=Path(model), device=args.device,
            max_num_seqs=1, dtype="auto", gpu_memory_utilization=0.9, tensor_parallel_size=1, engine_extras={},
        ))  # fmt: skip
        load_s = time.perf_counter() - t0
        params = {"width": width, "height": height, "num_frames": args.frames, "num_inference_steps": args.steps,
                  "seed": 1}

        def run(rid: str, inputs: dict, extra: dict) -> tuple[float, dict]:
            t = time.perf_counter()
            engine.add(rid, inputs, {**params, **extra})
            final = None
            while engine.has_work():
                for out in engine.step():
                    assert out.error is None, out.error
                    if out.finished:
                        final = out.payload
            assert final is not None
            return time.perf_counter() - t, final

        run("warm", {"prompt": "warm up"}, {"num_inference_steps": 1})
        create_s, made = run("create", {"prompt": "waves on a beach"}, {})
        edits = {}
        for strength in args.strength:
            edit_s, out = run(f"edit{strength}", {"prompt": "the beach on fire", "video": made["frames"]},
                              {"strength": strength})
            f, h, w = out["frames"].shape[:3]
            edits[str(strength)] = {"s": round(edit_s, 3), "vs_create": round(edit_s / create_s, 3),
                                    "size": f"{w}x{h}", "frames": f}
        engine.close()
    print(json.dumps({"bench": "video_edit", "mode": "engine", "model": str(args.model or "tiny wan2_2"),
                      "device": args.device, "size": args.size, "frames": args.frames, "steps": args.steps,
                      "load_s": round(load_s, 2), "create_s": round(create_s, 3), "edits": edits}))


if __name__ == "__main__":
    main()
