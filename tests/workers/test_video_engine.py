"""VideoEngine on tiny video and audio checkpoints: frames, decode phase, batching, abort, refusals."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers")

from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext, EngineOutput
from omni_actors.workers.engines.video import CONVERT_BLOCK_VALUES, VideoEngine, _video_uint8

MAX_STEPS = 100


def _engine(path: Path, extras: dict | None = None, device: str = "cpu") -> VideoEngine:
    return VideoEngine(EngineContext(
        stage_id=0, replica=0, model_stage="diffusion", model_path=path, device=device, max_num_seqs=4,
        dtype="auto", gpu_memory_utilization=0.9, tensor_parallel_size=1, engine_extras=extras or {},
    ))  # fmt: skip


def _drain(engine: VideoEngine) -> dict[str, list[EngineOutput]]:
    outs: dict[str, list[EngineOutput]] = {}
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            return outs
        for out in engine.step():
            outs.setdefault(out.request_id, []).append(out)
    raise AssertionError("the engine did not finish")


@pytest.fixture(scope="module")
def hunyuan(tmp_path_factory) -> VideoEngine:
    # HunyuanVideo-1.5 has no step callback: the engine pauses it through scheduler.step.
    engine = _engine(make_tiny("hunyuan_video_1_5", tmp_path_factory.mktemp("hy"), seed=0),
                     {"size_multiple": 16, "frame_multiple": 4, "fps": 24, "max_batch": 1})
    yield engine
    engine.close()


def test_progress_per_step_then_decode_then_frames(hunyuan):
    hunyuan.add("a", {"prompt": "a cat walks"}, {"width": 32, "height": 16, "num_frames": 5,
                                                 "num_inference_steps": 3, "seed": 1})
    hunyuan.add("b", {"prompt": "the sea"}, {"width": 32, "height": 16, "num_frames": 5,
                                             "num_inference_steps": 3, "seed": 2})
    outs = _drain(hunyuan)
    assert hunyuan.batches_started == 2  # its pipeline cannot batch: max_batch 1
    phases = [(o.payload["phase"], o.payload["step"]) for o in outs["a"][:-1]]
    assert phases == [("denoise", 1), ("denoise", 2), ("decode", 3)]
    last = outs["a"][-1]
    assert last.finished and last.error is None, last.error
    assert last.payload["frames"].shape == (5, 16, 32, 3) and last.payload["frames"].dtype == np.uint8
    assert last.payload["fps"] == 24
    assert not np.array_equal(last.payload["frames"], outs["b"][-1].payload["frames"])


def test_abort_between_steps_ends_the_batch(hunyuan):
    hunyuan.add("long", {"prompt": "x"}, {"width": 16, "height": 16, "num_frames": 5,
                                          "num_inference_steps": 50})
    first = hunyuan.step()
    assert [o.payload["step"] for o in first] == [1]
    hunyuan.abort("long")
    assert not hunyuan.has_work()
    hunyuan.add("next", {"prompt": "y"}, {"width": 16, "height": 16, "num_frames": 5,
                                          "num_inference_steps": 1})
    assert _drain(hunyuan)["next"][-1].payload["frames"].shape == (5, 16, 16, 3)


@pytest.mark.parametrize(("params", "field"), [
    ({"width": 24, "height": 16}, "size"),
    ({"num_frames": 6}, "num_frames"),
    ({"num_frames": 100_001}, "num_frames"),
    ({"seconds": 1.0, "num_inference_steps": 0}, "num_inference_steps"),
    ({"guidance_scale": 5.0}, "guidance_scale"),  # its call takes none (its guider holds it): was dropped unsaid
])  # fmt: skip
def test_refusals_name_the_field(hunyuan, params, field):
    with pytest.raises(ValueError, match=field):
        hunyuan.add("bad", {"prompt": "x"}, params)
    with pytest.raises(ValueError, match="image"):
        hunyuan.add("bad", {"prompt": "x", "image": np.zeros((8, 8, 3), np.uint8)}, {})
    assert not hunyuan.has_work()


def _reference_uint8(frames: np.ndarray) -> np.ndarray:
    """The conversion as first written: what the frames must stay, bit for bit."""
    return (np.clip(frames, 0.0, 1.0) * 255.0).round().astype(np.uint8)


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64])
def test_float_frames_to_uint8_bit_for_bit(dtype):
    # Rows of 256 x 3 values: a frame of 700 rows is cut into blocks with a short tail.
    h, w = 700, 256
    assert CONVERT_BLOCK_VALUES // (w * 3) < h and h % (CONVERT_BLOCK_VALUES // (w * 3))
    rng = np.random.default_rng(0)
    values = rng.random(2 * 3 * 3 * h * w) * 1.4 - 0.2  # outside [0, 1] too
    values[:511] = (np.arange(511) + 0.5) / 255.0  # exact halves after * 255
    values[511:515] = [-1.0, 0.0, 1.0, 2.0]
    # Laid out as Wan's frames are: [B, F, H, W, C] over [B, C, F, H, W] memory.
    frames = values.astype(dtype).reshape(2, 3, 3, h, w).transpose(0, 2, 3, 4, 1)
    got = _video_uint8(frames)
    assert got.dtype == np.uint8 and got.shape == frames.shape and got.flags.c_contiguous
    assert np.array_equal(got, _reference_uint8(frames))
    contiguous = np.ascontiguousarray(frames)
    assert np.array_equal(_video_uint8(contiguous), _reference_uint8(contiguous))


def test_torch_frames_to_uint8_bit_for_bit():
    import torch

    frames = torch.rand(1, 3, 8, 8, 3, generator=torch.Generator().manual_seed(0), dtype=torch.bfloat16)
    assert np.array_equal(_video_uint8(frames), _reference_uint8(frames.float().numpy()))


def test_channels_first_torch_frames_round_as_numpy_does():
    # What output_type "pt" gives on a GPU: [B, F, C, H, W], rounded to uint8 on its own device.
    import torch

    values = torch.rand(2, 3, 3, 8, 16, generator=torch.Generator().manual_seed(1)) * 1.4 - 0.2
    values.view(-1)[:255] = (torch.arange(255) + 0.5) / 255.0  # exact halves after * 255
    frames = values.to(torch.bfloat16)
    got = _video_uint8(frames, channels_first=True)
    assert got.shape == (2, 3, 8, 16, 3) and got.flags.c_contiguous
    want = _reference_uint8(frames.float().permute(0, 1, 3, 4, 2).numpy())
    assert np.array_equal(got, want)


def test_compatible_requests_share_a_batch_and_a_seed_repeats(tmp_path):
    engine = _engine(make_tiny("wan2_2", tmp_path / "wan", seed=0))
    try:
        params = {"width": 32, "height": 32, "num_frames": 5, "num_inference_steps": 2}
        engine.add("a", {"prompt": "a cat"}, {**params, "seed": 1})
        engine.add("b", {"prompt": "a boat"}, {**params, "seed": 2})
        engine.add("c", {"prompt": "a cat"}, {**params, "num_frames": 9, "seed": 1})  # another shape
        outs = _drain(engine)
        assert engine.batches_started == 2
        engine.add("a2", {"prompt": "a cat"}, {**params, "seed": 1})
        again = _drain(engine)
        # alone vs in a batch of two: the same frames within one level of 255 (a batch's float sums
        # may round apart: on one AMD EPYC host 1 value in 15,000 did, by one level)
        alone, batched = (x[-1].payload["frames"].astype(int) for x in (again["a2"], outs["a"]))
        assert np.abs(alone - batched).max() <= 1 and (alone != batched).mean() < 1e-3
        assert outs["c"][-1].payload["frames"].shape == (9, 32, 32, 3)
    finally:
        engine.close()


@pytest.mark.gpu
def test_on_cuda_frames_are_rounded_on_the_device_to_the_host_path_values(tmp_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    engine = _engine(make_tiny("wan2_2", tmp_path / "wan", seed=0), device="cuda")
    params = {"width": 32, "height": 32, "num_frames": 5, "num_inference_steps": 2, "seed": 3}
    made = {}
    try:
        for on_device in (True, False):  # False: output_type "np", rounded by numpy on the host
            engine._frames_on_device = on_device
            engine.add("a", {"prompt": "a cat"}, params)
            made[on_device] = _drain(engine)["a"][-1].payload["frames"]
    finally:
        engine.close()
    assert made[True].dtype == np.uint8 and made[True].shape == (5, 32, 32, 3)
    assert np.array_equal(made[True], made[False])


@pytest.mark.parametrize("family", ["wan2_2_i2v", "wan2_2_i2v-a14b"])
def test_first_frames_share_a_batch_and_each_makes_what_it_makes_alone(tmp_path, family):
    """TI2V-5B's layout and I2V-A14B's: with the family's `image_batches`, requests with their own first
    frames run in one call, each making the frames it makes alone; without it, one call each."""
    from omni_actors.config.pipeline import get_pipeline

    served = get_pipeline(family.removesuffix("-a14b")).stages[0].engine_defaults
    folder = make_tiny(family, tmp_path / "wan", seed=0)
    rng = np.random.default_rng(0)
    frames = {"a": rng.integers(0, 256, (24, 40, 3), np.uint8), "b": rng.integers(0, 256, (32, 32, 3), np.uint8)}
    params = {"width": 32, "height": 32, "num_frames": 5, "num_inference_steps": 2}
    made = {}
    for extras in ({"image_batches": served["image_batches"]}, {}):
        engine = _engine(folder, extras)
        try:
            engine.add("a", {"prompt": "a cat", "image": frames["a"]}, {**params, "seed": 1})
            engine.add("b", {"prompt": "a boat", "image": frames["b"]}, {**params, "seed": 2})
            outs = _drain(engine)
            assert engine.batches_started == (1 if extras else 2)
            made[bool(extras)] = {k: v[-1].payload["frames"] for k, v in outs.items()}
        finally:
            engine.close()
    batched, alone = made[True], made[False]
    assert batched["a"].shape == (5, 32, 32, 3) and not np.array_equal(batched["a"], batched["b"])
    for k in "ab":  # float sums of a batch of two may differ from one's by a rounding at most
        assert np.abs(batched[k].astype(int) - alone[k].astype(int)).max() <= 1, k
