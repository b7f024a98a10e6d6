"""Qwen2.5-Omni's fast Token2Wav pieces equal transformers' own modules (tiny checkpoint, float32).

The fast pieces do the same arithmetic in the same order, so they are
bit-equal on this CPU; the tests allow 1e-5 so that another BLAS or kernel
choice does not fail them.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.models.qwen2_5_omni.fast_token2wav import (  # noqa: E402
    DiTVelocity,
    FastAntiAliasedActivation,
    install_fast_vocoder,
)
from omni_actors.workers.engine import EngineContext  # noqa: E402

ATOL = 1e-5
ADAPTER = "omni_actors.models.qwen2_5_omni.code2wav:Qwen2_5OmniCode2WavAdapter"


@pytest.fixture(scope="module")
def tiny_dir(tiny_model) -> Path:
    return tiny_model("qwen2_5_omni")


def _token2wav(path: Path):
    from transformers import Qwen2_5OmniToken2WavModel
    from transformers.utils import logging as hf_logging

    from omni_actors.models.qwen2_5_omni.loading import load_config

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = Qwen2_5OmniToken2WavModel.from_pretrained(
            path, config=load_config(path).token2wav_config, dtype=torch.float32,
            key_mapping={r"^token2wav\.": ""},
        )  # fmt: skip
    finally:
        hf_logging.set_verbosity(level)
    # The tiny checkpoint's SnakeBeta parameters are all zero; make them matter.
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in model.code2wav_bigvgan_model.named_parameters():
            if name.endswith((".alpha", ".beta")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    return model.eval()


@pytest.fixture(scope="module")
def token2wav(tiny_dir):
    return _token2wav(tiny_dir)


@torch.inference_mode()
def _loaded_adapter(path: Path):
    """The code2wav stage's adapter (the one GenerationEngine runs), loaded from `path` on CPU."""
    from omni_actors.config.pipeline import resolve

    ctx = EngineContext(
        stage_id=2, replica=0, model_stage="code2wav", model_path=path, device="cpu",
        max_num_seqs=8, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={},
    )  # fmt: skip
    adapter = resolve(ADAPTER)(ctx)
    adapter.load()
    return adapter


def test_fast_vocoder_equals_transformers(token2wav):
    ref = token2wav.code2wav_bigvgan_model
    fast = copy.deepcopy(ref)
    assert install_fast_vocoder(fast) == 37  # 6 resblocks x 6 + the post activation
    assert not any(type(m).__name__ == "Qwen2_5OmniAntiAliasedActivation1d" for m in fast.modules())
    gen = torch.Generator().manual_seed(1)
    for batch, frames in ((1, 48), (3, 128), (1, 7)):
        mel = torch.randn(batch, 80, frames, generator=gen) - 3
        want, got = ref(mel), fast(mel)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_fast_activation_on_odd_lengths_and_many_channels(token2wav):
    act = token2wav.code2wav_bigvgan_model.resblocks[0].activations[2]
    fast = FastAntiAliasedActivation(act)
    gen = torch.Generator().manual_seed(2)
    channels = act.act.alpha.shape[0]
    for length in (1, 2, 13, 301):
        x = torch.randn(2, channels, length, generator=gen)
        torch.testing.assert_close(fast(x), act(x), atol=ATOL, rtol=0)


@torch.inference_mode()
def test_dit_velocity_equals_the_dit_forward(tiny_dir, token2wav):
    dit = token2wav.code2wav_dit_model
    spk = torch.load(tiny_dir / "spk_dict.pt", weights_only=True)["Chelsie"]
    gen = torch.Generator().manual_seed(3)
    for batch, codes_n in ((1, 36), (2, 60)):
        codes = torch.randint(0, 8000, (batch, codes_n), generator=gen)
        frames = codes_n * dit.repeats
        cond = spk["cond"].float().reshape(1, 1, -1).repeat(batch, frames, 1)
        ref = spk["ref_mel"].float().reshape(1, -1, 80).repeat(batch, 1, 1)
        velocity = DiTVelocity.for_codes(dit, codes, cond, ref, 0.5)
        for t in (0.0, 0.37, 1.0):
            x = torch.randn(batch, frames, 80, generator=gen)
            out = dit(
                hidden_states=x, quantized_code=codes, speaker_embedding=cond,
                condition_vector=ref, time_step=torch.tensor(t), apply_cfg=True,
            )  # fmt: skip
            guided, null = torch.chunk(out, 2, dim=0)
            want = guided + (guided - null) * 0.5
            torch.testing.assert_close(velocity(torch.tensor(t), x), want, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_adapter_decode_equals_transformers_modules(tiny_dir):
    """The adapter (fast DiT velocity, fast vocoder, one window at a time) against a decode of
    the same windows with transformers' DiT forward and its batched BigVGAN."""
    from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

    adapter = _loaded_adapter(tiny_dir)
    ref_model = _token2wav(tiny_dir)
    # The reference's random SnakeBeta parameters in the adapter's (fast) vocoder too.
    adapter.model.code2wav_bigvgan_model = copy.deepcopy(ref_model.code2wav_bigvgan_model)
    install_fast_vocoder(adapter.model.code2wav_bigvgan_model)
    gen = torch.Generator().manual_seed(4)
    windows = [torch.randint(0, 8000, (36,), generator=gen) for _ in range(3)]
    starts = [0, 12, 48]
    data = [{"speaker": "Chelsie", "seed": s} for s in (0, 1, 2)]
    got = adapter.decode(windows, starts, data)
    big, low = adapter._noise(2**63 - 1, 5, 2), adapter._noise(-(2**63), 5, 2)  # any int64 seed (no overflow)
    assert big.shape == low.shape and not torch.equal(big, low)

    dit = ref_model.code2wav_dit_model
    spk = adapter.speakers["Chelsie"]
    codes = torch.stack(windows)
    frames = 36 * dit.repeats
    cond = spk["cond"].float().reshape(1, 1, -1).repeat(3, frames, 1)
    ref = spk["ref_mel"].float().reshape(1, -1, 80).repeat(3, 1, 1)
    noise = torch.stack(
        [adapter._noise(d["seed"], s, 36) for d, s in zip(data, starts, strict=True)]
    )

    def velocity(t, x):
        out = dit(
            hidden_states=x, quantized_code=codes, speaker_embedding=cond, condition_vector=ref,
            time_step=t, apply_cfg=True,
        )  # fmt: skip
        guided, null = torch.chunk(out, 2, dim=0)
        return guided + (guided - null) * 0.5

    times = torch.linspace(0, 1, 10)
    times = times + -1.0 * (torch.cos(torch.pi / 2 * times) - 1 + times)
    mel = RungeKutta4ODESolver(function=velocity, initial_value=noise).integrate(times)[-1]
    want = ref_model.code2wav_bigvgan_model(mel.permute(0, 2, 1))
    assert len(got) == 3
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=ATOL, rtol=0)


@torch.inference_mode()
def test_vocoder_on_the_kept_codes_only_equals_the_whole_window(tiny_dir, token2wav):
    """decode_part vocodes the kept codes plus the measured receptive radius: the kept
    samples equal those of vocoding the whole window."""
    from omni_actors.models.qwen2_5_omni.fast_token2wav import receptive_radius

    adapter = _loaded_adapter(tiny_dir)
    adapter.model.code2wav_bigvgan_model = copy.deepcopy(token2wav.code2wav_bigvgan_model)
    install_fast_vocoder(adapter.model.code2wav_bigvgan_model)
    radius = receptive_radius(adapter.model.code2wav_bigvgan_model, 80)
    assert 2 <= radius < 40  # ~12 frames for the tiny vocoder; 128 would mean "not found"
    adapter.vocoder_margin = radius + 1
    gen = torch.Generator().manual_seed(5)
    windows = [torch.randint(0, 8000, (60,), generator=gen) for _ in range(2)]
    data = [{"speaker": "Chelsie", "seed": 7}] * 2
    whole = adapter.decode(windows, [0, 24], data)
    spc = adapter.samples_per_code
    for keep in ([(24, 48), (0, 12)], [(30, None), (59, None)]):
        parts = adapter.decode_part(windows, [0, 24], data, keep)
        for (wav, offset), full, (lo, hi) in zip(parts, whole, keep, strict=True):
            assert offset <= lo * spc
            end = full.shape[0] if hi is None else hi * spc
            torch.testing.assert_close(
                wav[lo * spc - offset : end - offset], full[lo * spc : end], atol=ATOL, rtol=0
            )
            assert wav.shape[0] < full.shape[0]  # it did skip work
