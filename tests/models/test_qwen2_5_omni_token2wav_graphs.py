"""Token2Wav windows as CUDA graph replays (token2wav_graphs): the same decode as the eager path.

On CPU: the sync-free RK4 and vocoder are the same arithmetic as transformers' solver
and BigVGAN forward (equal), and the whole-window path (batch padding included) gives
the samples the adapter's eager path keeps. On a GPU: replays equal eager decodes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.models.qwen2_5_omni.fast_token2wav import DiTVelocity  # noqa: E402
from omni_actors.models.qwen2_5_omni.token2wav_graphs import (  # noqa: E402
    Vocoder,
    WindowGraphs,
    integrate_rk4,
    padded_batch,
)
from omni_actors.workers.engine import EngineContext  # noqa: E402

ADAPTER = "omni_actors.models.qwen2_5_omni.code2wav:Qwen2_5OmniCode2WavAdapter"


@pytest.fixture(scope="module")
def tiny_dir(tiny_model) -> Path:
    return tiny_model("qwen2_5_omni")


@torch.inference_mode()
def _adapter(path: Path, device: str = "cpu", **extras):
    from omni_actors.config.pipeline import resolve

    ctx = EngineContext(
        stage_id=2, replica=0, model_stage="code2wav", model_path=path, device=device,
        max_num_seqs=8, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras=extras,
    )  # fmt: skip
    adapter = resolve(ADAPTER)(ctx)
    adapter.load()
    # SnakeBeta's exp(alpha) random (the tiny checkpoint's alpha is zero), the same in every adapter.
    gen = torch.Generator().manual_seed(0)
    for mod in adapter.model.code2wav_bigvgan_model.modules():
        if hasattr(mod, "inv_beta"):
            noise = torch.randn(mod.alpha.shape, generator=gen) * 0.5
            mod.alpha.copy_(torch.exp(noise).to(mod.alpha.device))
    return adapter


def _windows(n: int, count: int, seed: int) -> tuple[list, list[int], list[dict]]:
    gen = torch.Generator().manual_seed(seed)
    windows = [torch.randint(0, 8000, (n,), generator=gen) for _ in range(count)]
    starts = [12 * i for i in range(count)]
    data = [{"speaker": "Chelsie", "seed": i} for i in range(count)]
    return windows, starts, data


@torch.inference_mode()
def test_rk4_and_vocoder_without_syncs_equal_transformers(tiny_dir):
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

    adapter = _adapter(tiny_dir)
    windows, starts, data = _windows(36, 2, seed=1)
    codes, cond, ref, noise = adapter._inputs(windows, starts, data)
    dit = adapter.model.code2wav_dit_model
    velocity = DiTVelocity.for_codes(dit, codes, cond, ref, 0.5)
    want = RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(adapter.times)[-1]
    got = integrate_rk4(velocity, noise, adapter.times)
    assert torch.equal(got, want)
    bigvgan = adapter.model.code2wav_bigvgan_model
    wav = Vocoder(bigvgan)(got)
    assert wav.shape == (2, 36 * adapter.samples_per_code)
    assert torch.equal(wav, bigvgan(got.permute(0, 2, 1)).reshape(2, -1))


def test_batches_pad_to_powers_of_two():
    assert [padded_batch(b) for b in (1, 2, 3, 4, 5, 8, 9)] == [1, 2, 4, 4, 8, 8, 16]


@torch.inference_mode()
def test_whole_window_path_keeps_the_eager_samples(tiny_dir):
    """WindowGraphs (eager here: no GPU) decodes whole windows, padding 3 rows to 4; the kept
    samples equal what the adapter's own eager path sends."""
    adapter = _adapter(tiny_dir)
    windows, starts, data = _windows(60, 3, seed=2)
    keep = [(24, 48), (0, 12), (30, None)]
    eager = adapter.decode_part(windows, starts, data, keep)
    graphs = WindowGraphs(
        adapter.model.code2wav_dit_model, adapter.model.code2wav_bigvgan_model, adapter.times,
        0.5, enabled=False,
    )  # fmt: skip
    mel, wav = graphs.run(*adapter._inputs(windows, starts, data))
    assert mel.shape == (3, 60 * adapter.repeats, adapter.mel_dim) and wav.shape[0] == 3
    spc = adapter.samples_per_code
    for (part, offset), row, (lo, hi) in zip(eager, wav, keep, strict=True):
        end = row.shape[0] if hi is None else hi * spc
        torch.testing.assert_close(
            part[lo * spc - offset : end - offset], row[lo * spc : end], atol=1e-5, rtol=0
        )
    # The padded row did not leak into the others: the same windows one at a time.
    alone = graphs.run(*adapter._inputs(windows[1:2], starts[1:2], data[1:2]))[1]
    torch.testing.assert_close(alone[0], wav[1], atol=1e-5, rtol=0)
    assert not graphs.slots  # nothing captured off a GPU


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@torch.inference_mode()
def test_replays_equal_eager_decodes_on_cuda(tiny_dir):
    eager = _adapter(tiny_dir, "cuda", cuda_graphs=False)
    graphed = _adapter(tiny_dir, "cuda")
    assert eager.windows is None and graphed.windows.enabled
    warmed = len(graphed.windows.slots)
    assert warmed >= 4  # the standard window lengths, captured at load
    assert graphed.window_lengths() == (24, 60, 84, 108, 132, 168)  # windows widen to one of them
    assert eager.window_lengths() == ()
    for n, count in ((24, 1), (60, 1), (60, 3), (37, 2), (37, 2), (37, 2)):
        windows, starts, data = _windows(n, count, seed=n + count)
        keep = [(0, None)] * count
        want = eager.decode_part(windows, starts, data, keep)
        got = graphed.decode_part(windows, starts, data, keep)
        for (g, go), (w, wo) in zip(got, want, strict=True):
            assert go == wo and g.shape == w.shape
            torch.testing.assert_close(g, w, atol=2e-4, rtol=0)
    assert graphed.windows.enabled
    assert (2, 37) in graphed.windows.slots  # a length seen a second time got its graph
    assert len(graphed.windows.slots) > warmed


@pytest.mark.parametrize(
    ("extras", "field"),
    [
        ({"precision": "fp8"}, "engine_extras.precision"),
        ({"graph_first_batches": [1, 0]}, "engine_extras.graph_first_batches"),
        ({"graph_first_batches": "1,2"}, "engine_extras.graph_first_batches"),
    ],
)
def test_bad_code2wav_extras_name_the_field_on_any_device(tiny_dir, extras, field):
    with pytest.raises(ValueError, match=field):
        _adapter(tiny_dir, **extras)


def test_cpu_decodes_in_float32_whatever_precision_says(tiny_dir):
    adapter = _adapter(tiny_dir, precision="bfloat16", graph_first_batches=[1, 2])
    assert adapter.precision == "float32" and adapter.windows is None
    assert adapter.window_lengths() == ()  # on a CPU a wider window only costs more
    assert adapter.first_batches == [1, 2]
