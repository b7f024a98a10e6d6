"""DiffusionEngine on tiny random-weight diffusers checkpoints: sizes, seeds, batching, progress, abort, load errors."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers")

from omni_actors.errors import ConfigError
from omni_actors.models.tiny.diffusion import make_tiny_diffusion
from omni_actors.workers.engine import EngineContext, EngineOutput
from omni_actors.workers.engines.diffusion import DiffusionEngine

MAX_STEPS = 200


def _ctx(path: Path, max_num_seqs: int = 4, extras: dict | None = None) -> EngineContext:
    return EngineContext(
        stage_id=0,
        replica=0,
        model_stage="diffusion",
        model_path=path,
        device="cpu",
        max_num_seqs=max_num_seqs,
        dtype="auto",
        gpu_memory_utilization=0.9,
        tensor_parallel_size=1,
        engine_extras=extras or {},
    )


def _drain(engine: DiffusionEngine) -> tuple[dict[str, list[EngineOutput]], int]:
    """Step until idle; outputs per request and the number of steps taken."""
    outs: dict[str, list[EngineOutput]] = {}
    steps = 0
    while engine.has_work():
        steps += 1
        assert steps < MAX_STEPS
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    return outs, steps


def _image(outs: dict[str, list[EngineOutput]], rid: str) -> np.ndarray:
    last = outs[rid][-1]
    assert last.finished and last.error is None, last.error
    return last.payload["images"]


@pytest.fixture(scope="module")
def sd_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_diffusion(tmp_path_factory.mktemp("sd"), seed=0, kind="sd")


@pytest.fixture(scope="module")
def engine(sd_dir: Path) -> DiffusionEngine:
    eng = DiffusionEngine(_ctx(sd_dir))
    yield eng
    eng.close()


def test_images_have_requested_size(engine: DiffusionEngine) -> None:
    engine.add(
        "a", {"prompt": "a cat"}, {"size": "48x40", "n": 2, "num_inference_steps": 2, "seed": 1}
    )
    engine.add("b", {"prompt": "a cat"}, {"num_inference_steps": 2, "seed": 1})
    outs, _ = _drain(engine)
    a, b = _image(outs, "a"), _image(outs, "b")
    assert a.shape == (2, 40, 48, 3) and a.dtype == np.uint8
    assert b.shape == (1, 32, 32, 3)  # native size: unet sample 16 x vae factor 2


def test_seeds_decide_images(engine: DiffusionEngine) -> None:
    params = {"num_inference_steps": 3, "n": 2}
    for rid, seed in (("s1", 7), ("s2", 7), ("s3", 8)):
        engine.add(rid, {"prompt": "the sea at night"}, {**params, "seed": seed})
        outs, _ = _drain(engine)  # one at a time: each runs alone
        assert outs[rid][-1].payload["seed"] == seed
        if rid == "s1":
            first = _image(outs, rid)
        elif rid == "s2":
            np.testing.assert_array_equal(_image(outs, rid), first)
        else:
            assert not np.array_equal(_image(outs, rid), first)
    assert not np.array_equal(first[0], first[1])  # the n images of one request differ


def test_compatible_requests_share_a_batch(engine: DiffusionEngine) -> None:
    before = engine.statistics().batches_started
    same = {"width": 32, "height": 32, "num_inference_steps": 3, "guidance_scale": 5.0}
    engine.add("alone", {"prompt": "a red chair"}, {**same, "seed": 3})
    alone, _ = _drain(engine)
    for i in range(3):
        engine.add(f"c{i}", {"prompt": "a red chair"}, {**same, "seed": 3 + i})
    engine.add("other-steps", {"prompt": "a red chair"}, {**same, "num_inference_steps": 2})
    engine.add("other-guidance", {"prompt": "a red chair"}, {**same, "guidance_scale": 2.0})
    outs, steps = _drain(engine)
    assert engine.statistics().batches_started - before == 1 + 3
    for i in range(3):
        assert all(o.payload["batch_size"] == 3 for o in outs[f"c{i}"])
    assert outs["other-steps"][-1].payload["batch_size"] == 1
    assert outs["other-guidance"][-1].payload["batch_size"] == 1
    assert steps == 4 + 3 + 4  # one denoising step per engine step, then the decode's; batches one after another
    # Batching does not change a request's result beyond float noise.
    diff = np.abs(_image(outs, "c0").astype(int) - _image(alone, "alone").astype(int))
    assert diff.max() <= 2


def test_batch_size_is_capped_by_max_num_seqs(sd_dir: Path) -> None:
    eng = DiffusionEngine(_ctx(sd_dir, max_num_seqs=2))
    for i in range(3):
        eng.add(f"r{i}", {"prompt": "a cat"}, {"num_inference_steps": 1, "seed": i})
    outs, steps = _drain(eng)
    assert [outs[f"r{i}"][-1].payload["batch_size"] for i in range(3)] == [2, 2, 1]
    assert steps == 2 * 2  # two batches of one step, each then its decode
    eng.close()
    eng = DiffusionEngine(_ctx(sd_dir, max_num_seqs=8, extras={"max_batch_images": 4}))
    for i, n in enumerate((3, 2, 1)):
        eng.add(f"r{i}", {"prompt": "a cat"}, {"num_inference_steps": 1, "n": n})
    outs, _ = _drain(eng)
    assert [outs[f"r{i}"][-1].payload["batch_size"] for i in range(3)] == [2, 1, 2]
    eng.close()


def test_progress_every_step(engine: DiffusionEngine) -> None:
    engine.add("p", {"prompt": "a boat"}, {"num_inference_steps": 4, "seed": 0})
    seen = []
    while engine.has_work():
        outs = engine.step()
        assert len(outs) == 1
        seen.append((outs[0].payload["step"], outs[0].payload["progress"], outs[0].payload.get("phase"),
                     outs[0].finished))
    assert seen == [(1, 0.25, "denoise", False), (2, 0.5, "denoise", False), (3, 0.75, "denoise", False),
                    (4, 1.0, "decode", False), (4, 1.0, None, True)]  # the last step too, as its decode starts
    assert not any(t.name == "diffusion-batch" for t in threading.enumerate())  # joined at the end


def test_abort_between_steps(engine: DiffusionEngine) -> None:
    engine.add("x", {"prompt": "a boat"}, {"num_inference_steps": 5, "seed": 0})
    engine.add("y", {"prompt": "a boat"}, {"num_inference_steps": 5, "seed": 1})
    engine.add("q", {"prompt": "a boat"}, {"num_inference_steps": 2, "seed": 1})  # queued
    first = engine.step() + engine.step()
    assert {o.request_id for o in first} == {"x", "y"}
    engine.abort("x")  # one of the batch: the batch goes on without it
    engine.abort("q")  # queued: never starts
    outs, _ = _drain(engine)
    assert set(outs) == {"y"} and outs["y"][-1].finished
    engine.add("z", {"prompt": "a boat"}, {"num_inference_steps": 5, "seed": 0})
    engine.step()
    engine.abort("z")  # the whole batch: its thread stops between steps
    assert not engine.has_work()
    assert not any(t.name == "diffusion-batch" for t in threading.enumerate())
    assert engine.step() == []
    engine.abort("unknown")
    engine.add("after", {"prompt": "a boat"}, {"num_inference_steps": 2, "seed": 0})
    outs, _ = _drain(engine)
    assert _image(outs, "after").shape == (1, 32, 32, 3)


@pytest.mark.parametrize(
    ("inputs", "params", "field"),
    [
        ({}, {}, "prompt"),
        ({"prompt": "a"}, {"size": "32by32"}, "size"),
        ({"prompt": "a"}, {"width": 30, "height": 32}, "width"),
        ({"prompt": "a"}, {"width": 32}, "width and height"),
        ({"prompt": "a"}, {"n": 0}, "n"),
        ({"prompt": "a"}, {"num_inference_steps": 0}, "num_inference_steps"),
        ({"prompt": "a"}, {"guidance_scale": "high"}, "guidance_scale"),
        ({"prompt": "a"}, {"seed": -1}, "seed"),
    ],
)
def test_invalid_params_rejected_at_add(
    engine: DiffusionEngine, inputs: dict, params: dict, field: str
) -> None:
    with pytest.raises(ValueError, match=field):
        engine.add("bad", inputs, params)
    assert not engine.has_work()


def test_duplicate_request_id_rejected(engine: DiffusionEngine) -> None:
    engine.add("dup", {"prompt": "a"}, {"num_inference_steps": 1})
    with pytest.raises(ValueError, match="dup"):
        engine.add("dup", {"prompt": "a"}, {})
    _drain(engine)


@pytest.mark.parametrize("kind", ["dit", "ddpm"])
def test_other_pipeline_kinds(tmp_path: Path, kind: str) -> None:
    eng = DiffusionEngine(_ctx(make_tiny_diffusion(tmp_path, seed=0, kind=kind)))
    eng.add("a", {}, {"num_inference_steps": 3, "seed": 0, "n": 2})
    eng.add("b", {}, {"num_inference_steps": 3, "seed": 1})
    outs, steps = _drain(eng)
    assert steps == 3 + 1
    assert [o.payload["step"] for o in outs["a"]] == [1, 2, 3, 3]  # (3: the last step's progress, then the images)
    assert _image(outs, "a").shape == (2, 32, 32, 3)
    assert outs["b"][-1].payload["batch_size"] == 2
    # A size the pipeline cannot be asked for is refused as it is taken.
    with pytest.raises(ValueError, match="size"):
        eng.add("wrong-size", {}, {"num_inference_steps": 1, "size": "64x64"})
    # Abort mid-run on this path too (a pipeline without a step callback).
    eng.add("c", {}, {"num_inference_steps": 4, "seed": 0})
    eng.step()
    eng.abort("c")
    assert not eng.has_work()
    eng.add("d", {}, {"num_inference_steps": 2, "seed": 0})
    outs, _ = _drain(eng)
    assert _image(outs, "d").shape == (1, 32, 32, 3)
    eng.close()


def test_failure_inside_pipeline_is_a_request_error(tmp_path: Path) -> None:
    eng = DiffusionEngine(_ctx(make_tiny_diffusion(tmp_path, seed=0, kind="dit")))
    eng.add("bad-label", {}, {"num_inference_steps": 2, "class_label": 5000})
    outs, _ = _drain(eng)
    (out,) = outs["bad-label"]
    assert out.finished and out.error and "images" not in out.payload
    eng.add("good", {}, {"num_inference_steps": 2, "class_label": 3})
    outs, _ = _drain(eng)
    assert _image(outs, "good").shape == (1, 32, 32, 3)
    eng.close()


def _broken_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def test_missing_model_index_names_the_file(sd_dir: Path, tmp_path: Path) -> None:
    path = _broken_copy(sd_dir, tmp_path / "ckpt")
    (path / "model_index.json").unlink()
    with pytest.raises(ConfigError, match=r"model_index\.json"):
        DiffusionEngine(_ctx(path))


def test_bad_component_config_names_the_file(sd_dir: Path, tmp_path: Path) -> None:
    path = _broken_copy(sd_dir, tmp_path / "ckpt")
    (path / "unet" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"unet/config\.json"):
        DiffusionEngine(_ctx(path))


def test_unknown_pipeline_class_names_the_file(sd_dir: Path, tmp_path: Path) -> None:
    path = _broken_copy(sd_dir, tmp_path / "ckpt")
    index = json.loads((path / "model_index.json").read_text())
    (path / "model_index.json").write_text(json.dumps({**index, "_class_name": "NoSuchPipeline"}))
    with pytest.raises(ConfigError, match=r"model_index\.json.*NoSuchPipeline"):
        DiffusionEngine(_ctx(path))


def test_missing_weights_fail_the_load(sd_dir: Path, tmp_path: Path) -> None:
    path = _broken_copy(sd_dir, tmp_path / "ckpt")
    for weights in (path / "vae").glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(ConfigError, match="vae"):
        DiffusionEngine(_ctx(path))


def test_part_full_queue_waits_briefly_after_a_batch(engine: DiffusionEngine) -> None:
    """After a batch of two, one request back waits out the gather window (its peer is usually
    milliseconds behind); as many as the batch had, or the window's end, start the batch at once."""
    from time import monotonic

    from omni_actors.workers.engines.diffusion_batch import BATCH_GATHER_S

    params = {"width": 32, "height": 32, "num_inference_steps": 2, "seed": 1}
    engine.add("g0", {"prompt": "a lamp"}, params)
    engine.add("g0b", {"prompt": "a lamp"}, params)
    outs, _ = _drain(engine)
    assert outs["g0"][-1].payload["batch_size"] == 2
    before_add = monotonic()
    engine.add("g1", {"prompt": "a lamp"}, params)
    after_add = monotonic()
    assert engine.gather_s(before_add) >= BATCH_GATHER_S  # queued after `before_add`
    assert engine.gather_s(after_add + BATCH_GATHER_S) == 0.0  # window over
    engine.add("g2", {"prompt": "a lamp"}, params)  # both back: start now
    assert engine.gather_s(before_add) == 0.0
    outs, _ = _drain(engine)
    assert all(outs[f"g{i}"][-1].payload["batch_size"] == 2 for i in (1, 2))


def test_a_lone_client_is_not_held_by_the_gather_window(engine: DiffusionEngine) -> None:
    """Concurrency 1: the last batch ran alone and nothing queued behind it, so the next request
    starts at once (waiting cannot bring company), and its image is the same as without a wait."""
    from time import monotonic

    params = {"width": 32, "height": 32, "num_inference_steps": 2, "seed": 5}
    engine.add("solo0", {"prompt": "a lamp"}, params)
    first, _ = _drain(engine)
    before_add = monotonic()
    engine.add("solo1", {"prompt": "a lamp"}, params)
    assert engine.gather_s(before_add) == 0.0
    again, _ = _drain(engine)
    assert again["solo1"][-1].payload["batch_size"] == 1
    assert np.array_equal(_image(first, "solo0"), _image(again, "solo1"))


def test_requests_queued_behind_a_lone_batch_wait_for_its_client(engine: DiffusionEngine) -> None:
    """Two requests queue while one runs alone (concurrency going from 1 to 3): when it ends, they
    wait for its client's next request, and the three run as one batch."""
    from time import monotonic

    from omni_actors.workers.engines.diffusion_batch import BATCH_GATHER_S

    params = {"width": 32, "height": 32, "num_inference_steps": 3, "seed": 2}
    engine.add("q0", {"prompt": "a lamp"}, params)
    engine.step()  # q0 starts alone
    engine.add("q1", {"prompt": "a lamp"}, params)
    engine.add("q2", {"prompt": "a lamp"}, params)
    done = False
    for _ in range(MAX_STEPS):
        before_end = monotonic()
        if any(o.request_id == "q0" and o.finished for o in engine.step()):
            done = True
            break
    assert done and engine.statistics().last_batch_size == 1
    assert engine.gather_s(before_end) >= BATCH_GATHER_S  # two queued, three were held
    engine.add("q3", {"prompt": "a lamp"}, params)
    assert engine.gather_s(before_end) == 0.0
    outs, _ = _drain(engine)
    assert all(outs[f"q{i}"][-1].payload["batch_size"] == 3 for i in (1, 2, 3))


def test_an_engine_that_ran_no_batch_yet_starts_a_lone_request_at_once(sd_dir: Path) -> None:
    from time import monotonic

    eng = DiffusionEngine(_ctx(sd_dir))
    try:
        before = monotonic()
        eng.add("first", {"prompt": "a lamp"}, {"num_inference_steps": 1})
        assert eng.gather_s(before) == 0.0
        outs, _ = _drain(eng)
        assert outs["first"][-1].finished
    finally:
        eng.close()
