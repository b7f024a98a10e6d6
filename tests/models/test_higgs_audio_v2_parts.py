"""Higgs-Audio-V2's own pieces without a model: the torchaudio-free resampler, the delay pattern's
masks and frames, the prompt's delayed clip block and placeholder expansion, the tokenizer import."""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

from omni_actors.models.higgs_audio_v2.codec_loading import resample, tokenizer_class
from omni_actors.models.higgs_audio_v2.delay import FREE, DelayState, forced_codes, step_masks
from omni_actors.models.higgs_audio_v2.prompt import delayed, expand_ids

BOS, EOS, N = 1024, 1025, 4


@pytest.mark.parametrize(("orig", "new", "length"), [(24000, 16000, 1000), (16000, 24000, 999), (44100, 16000, 441),
                                                      (24000, 16000, 1), (8000, 11025, 37)])  # fmt: skip
def test_resampled_length_is_ceil_new_times_length_over_orig(orig: int, new: int, length: int) -> None:
    out = resample(torch.randn(length), orig, new)
    assert out.shape == (math.ceil(new * length / orig),)


def test_a_sine_keeps_its_frequency_and_amplitude_24k_to_16k() -> None:
    t = torch.arange(24000, dtype=torch.float64) / 24000
    out = resample(0.5 * torch.sin(2 * math.pi * 440 * t), 24000, 16000)
    ref = 0.5 * torch.sin(2 * math.pi * 440 * torch.arange(16000, dtype=torch.float64) / 16000)
    middle = slice(200, -200)  # the edges see the zero padding
    assert torch.allclose(out[middle], ref[middle], atol=2e-3)
    spectrum = torch.fft.rfft(out).abs()
    assert int(spectrum.argmax()) == 440  # 1 s of signal: bin k is k Hz


def test_a_tone_above_the_new_nyquist_is_filtered_out() -> None:
    t = torch.arange(24000, dtype=torch.float64) / 24000
    out = resample(torch.sin(2 * math.pi * 10000 * t), 24000, 16000)
    assert out[200:-200].abs().max() < 0.02


def test_equal_rates_are_the_identity_and_batch_shapes_are_kept() -> None:
    x = torch.randn(2, 3, 500)
    assert resample(x, 16000, 16000) is x
    out = resample(x, 24000, 16000)
    assert out.shape == (2, 3, 334)
    assert torch.allclose(out[1, 2], resample(x[1, 2], 24000, 16000), atol=1e-6)
    with pytest.raises(ValueError, match="positive"):
        resample(x, 0, 16000)


def test_tokenizer_module_imports_without_torchaudio_and_leaves_no_stand_in() -> None:
    cls = tokenizer_class()
    assert cls.__name__ == "HiggsAudioV2TokenizerModel" and "torchaudio" not in sys.modules
    module = sys.modules[cls.__module__]
    assert module.torchaudio.functional.resample is resample


def forced_of(state: DelayState) -> np.ndarray:
    """[groups] the codes a state's next step must draw (FREE where free): `forced_codes` of one row."""
    eos_at = torch.tensor([-1 if state.eos_at is None else state.eos_at])
    return forced_codes(torch.tensor([state.step]), eos_at, state.groups, state.bos, state.eos)[0].numpy()


def test_the_ramp_forces_bos_then_frames_undo_the_delay() -> None:
    state = DelayState(N, BOS, EOS)
    steps = []
    for t in range(N + 3):
        forced = forced_of(state)
        assert list(forced) == [BOS if k >= t else FREE for k in range(N)]
        codes = np.where(forced == BOS, BOS, 10 * t + np.arange(N))
        steps.append(codes)
        frame, done = state.push(codes)
        assert not done
        if t < N:
            assert frame is None
        else:  # frame f = t - N takes codebook k from step f + 1 + k
            f = t - N
            assert list(frame) == [steps[f + 1 + k][k] for k in range(N)]


def test_an_eos_forces_the_codebooks_in_turn_and_the_all_eos_step_ends() -> None:
    state = DelayState(N, BOS, EOS)
    for _ in range(N + 2):
        state.push(np.arange(N))
    s = state.step
    state.push(np.array([1, EOS, 2, 3]))  # any codebook's eos starts the end
    frames = []
    for j in range(N + 1):
        forced = forced_of(state)
        assert list(forced == EOS) == [k <= j for k in range(N)]
        frame, done = state.push(np.where(forced == EOS, EOS, 5))
        if done:
            assert j == N - 1 and state.step == s + N + 1
            break
        frames.append(frame)
    assert all(f.max() <= BOS - 1 for f in frames)  # eos codes in a frame are clipped into the codebook


def test_step_masks_keep_only_the_forced_code_and_never_bos_when_free() -> None:
    a, b = DelayState(N, BOS, EOS), DelayState(N, BOS, EOS)
    for _ in range(2):
        b.push(np.zeros(N))
    forced = forced_codes(torch.tensor([a.step, b.step]), torch.tensor([-1, -1]), N, BOS, EOS)
    assert forced.tolist() == [list(forced_of(a)), list(forced_of(b))]
    keep = step_masks(forced, 1026, BOS)
    assert keep.shape == (2, N, 1026)
    assert keep[0, :, BOS].all() and not keep[0, :, :BOS].any()
    assert not keep[1, 0, BOS] and keep[1, 0, :BOS].all() and keep[1, 0, EOS]
    assert keep[1, 2:, BOS].all() and not keep[1, 2:, 0].any()


def test_a_clip_block_is_bos_framed_and_delayed() -> None:
    codes = np.arange(2 * N).reshape(N, 2)  # [N, T=2]
    block = delayed(codes, BOS, EOS)
    assert block.shape == (2 + 2 + N - 1, N)
    for k in range(N):
        assert list(block[:, k]) == [BOS] * (k + 1) + list(codes[k]) + [EOS] * (N - k)


def test_placeholders_expand_to_audio_and_delay_ids() -> None:
    assert expand_ids([1, 9, 2], 9, 8, [10], N) == [1] + [9] * 7 + [8] * 3 + [2]
    with pytest.raises(ValueError, match="reference_audio"):
        expand_ids([1, 2], 9, 8, [10], N)
    with pytest.raises(ValueError, match="reference_audio"):
        expand_ids([9, 9], 9, 8, [10], N)


def test_ras_redraws_only_codes_repeated_in_the_window_from_the_raw_logits() -> None:
    from omni_actors.models.higgs_audio_v2.ras import EMPTY, ras_settings, redraw_repeats

    assert ras_settings(object()) is None
    assert ras_settings(type("G", (), {"ras_win_len": 7, "ras_win_max_num_repeat": 2})()) == (7, 2)
    window = torch.tensor([[[EMPTY] * N, [5, BOS, 7, EOS], [5, BOS, 8, EOS]]])  # [1, w=3, N]
    raw = torch.full((1, N, 1026), -50.0)
    raw[0, :, 3] = 50.0  # a plain draw from the raw logits gives 3
    codes = torch.tensor([[5, BOS, 7, EOS]])
    uniform = torch.rand(1, N, 1026)
    # 5 twice: redrawn; bos/eos never count; 7 once: kept; an empty window place counts as nothing
    assert redraw_repeats(codes, raw, window, 2, BOS, EOS, uniform).tolist() == [[3, BOS, 7, EOS]]
    empty = torch.full((1, 3, N), EMPTY)
    assert redraw_repeats(codes, raw, empty, 2, BOS, EOS, uniform).tolist() == codes.tolist()
