"""Loading Higgs-Audio-V2's audio tokenizer without torchaudio: a torch resampler and a contained import.

Why this module exists: transformers' `modeling_higgs_audio_v2_tokenizer` does `import
torchaudio` at its top and uses it for one call only, `torchaudio.functional.resample`, in
`_extract_semantic_features` (encoding a reference clip: the 24 kHz clip goes to the 16 kHz
semantic model). Decoding codes to audio never resamples. torchaudio cannot be installed
beside this environment's CPU torch (PyPI's wheels are CUDA builds that break it), and
transformers guards the class with a lazy `requires(backends=("torchaudio",))` dummy.

So `tokenizer_class()` imports the modeling module itself (not through `transformers`'
lazy namespace, which would hand back the dummy) while `sys.modules["torchaudio"]` is a
stand-in whose only attribute is `functional.resample`, our `resample` below; sys.modules
is restored right after the import (the module keeps its own reference to the stand-in).
transformers itself (and the tokenizer's config module) is imported first, without the
stand-in: its start-up probes which packages exist and must not find it. Nothing else ever
sees the stand-in. It is used even where a real torchaudio exists, so encoding is the same
everywhere.

`resample` is torchaudio's documented default ("sinc_interp_hann"): a windowed-sinc
low-pass at `rolloff` (0.99) of the lower Nyquist rate, `lowpass_filter_width` (6) zero
crossings a side, a Hann window; rates reduced by their gcd, the signal filtered as a
polyphase conv1d (one kernel per output phase, stride = the reduced input rate), and
`ceil(new * length / orig)` samples kept.
"""

from __future__ import annotations

import importlib
import math
import sys
import types
from pathlib import Path
from typing import Any

import torch

from omni_actors.models.audio_tokenizer_folder import audio_tokenizer_folder

MODELING_MODULE = "transformers.models.higgs_audio_v2_tokenizer.modeling_higgs_audio_v2_tokenizer"
DEFAULT_FOLDER = "audio_tokenizer"
CONFIG_MODULE = "transformers.models.higgs_audio_v2_tokenizer.configuration_higgs_audio_v2_tokenizer"
LOWPASS_FILTER_WIDTH = 6
ROLLOFF = 0.99


def _sinc_kernels(orig: int, new: int, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, int]:
    """[new, 1, taps] polyphase kernels for reduced rates orig -> new, and the padding `width`."""
    cutoff = min(orig, new) * ROLLOFF  # in units of the reduced rates
    width = math.ceil(LOWPASS_FILTER_WIDTH * orig / cutoff)
    taps = torch.arange(-width, width + orig, dtype=torch.float64, device=device) / orig
    phases = -torch.arange(new, dtype=torch.float64, device=device)[:, None] / new
    t = ((phases + taps[None]) * cutoff).clamp(-LOWPASS_FILTER_WIDTH, LOWPASS_FILTER_WIDTH)
    window = torch.cos(t * math.pi / LOWPASS_FILTER_WIDTH / 2) ** 2
    x = t * math.pi
    sinc = torch.where(x == 0, torch.ones_like(x), torch.sin(x) / torch.where(x == 0, torch.ones_like(x), x))
    kernels = sinc * window * (cutoff / orig)
    return kernels[:, None].to(dtype), width


def resample(waveform: torch.Tensor, orig_freq: int, new_freq: int, **_: Any) -> torch.Tensor:
    """`waveform` [..., time] at `orig_freq` -> [..., ceil(new_freq * time / orig_freq)] at `new_freq`."""
    orig_freq, new_freq = int(orig_freq), int(new_freq)
    if orig_freq <= 0 or new_freq <= 0:
        raise ValueError(f"resample: rates must be positive, got {orig_freq} -> {new_freq}")
    if orig_freq == new_freq:
        return waveform
    g = math.gcd(orig_freq, new_freq)
    orig, new = orig_freq // g, new_freq // g
    shape = waveform.shape
    flat = waveform.reshape(-1, shape[-1])
    length = shape[-1]
    kernels, width = _sinc_kernels(orig, new, flat.dtype, flat.device)
    padded = torch.nn.functional.pad(flat, (width, width + orig))
    out = torch.nn.functional.conv1d(padded[:, None], kernels, stride=orig)  # [n, new, steps]
    out = out.transpose(1, 2).reshape(flat.shape[0], -1)
    keep = math.ceil(new * length / orig)
    return out[:, :keep].reshape(*shape[:-1], keep)


def _stand_in() -> types.ModuleType:
    torchaudio = types.ModuleType("torchaudio")
    functional = types.ModuleType("torchaudio.functional")
    functional.resample = resample
    torchaudio.functional = functional
    torchaudio.__doc__ = "omni_actors stand-in: only functional.resample (models/higgs_audio_v2/codec_loading.py)"
    return torchaudio


def tokenizer_class() -> type:
    """transformers' `HiggsAudioV2TokenizerModel`, its module imported beside the torchaudio stand-in."""
    module = sys.modules.get(MODELING_MODULE)
    if module is None:
        # transformers and the config module first, with the real (absent) torchaudio: its own
        # start-up probes which packages exist, and must not find the stand-in
        importlib.import_module(CONFIG_MODULE)
        saved = {name: sys.modules.get(name) for name in ("torchaudio", "torchaudio.functional")}
        stand_in = _stand_in()
        sys.modules["torchaudio"], sys.modules["torchaudio.functional"] = stand_in, stand_in.functional
        try:
            module = importlib.import_module(MODELING_MODULE)
        finally:
            for name, old in saved.items():
                if old is None:
                    sys.modules.pop(name, None)
                else:
                    sys.modules[name] = old
    return module.HiggsAudioV2TokenizerModel


def tokenizer_folder(model_path: Path) -> Path:
    """The audio tokenizer folder `processor_config.json` names (models/audio_tokenizer_folder.py);
    `audio_tokenizer/` when the processor names none."""
    return audio_tokenizer_folder(model_path, DEFAULT_FOLDER, "audio tokenizer", "bosonai/higgs-audio-v2-tokenizer")


def load_tokenizer(model_path: Path, device: str) -> Any:
    """The audio tokenizer of a Higgs folder (float32, eval, on `device`); ValueError naming its folder."""
    folder = tokenizer_folder(model_path)
    cls = tokenizer_class()
    try:
        model = cls.from_pretrained(folder, dtype="float32")
    except Exception as err:
        raise ValueError(f"{folder}: cannot load the Higgs audio tokenizer ({err})") from err
    return model.to(device).eval()
