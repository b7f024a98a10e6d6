"""Qwen3-TTS Base checkpoints: what a reference clip gives the voice-clone prompt (speaker row, clip codes).

- Speaker row (the x-vector): the talker-wide output of the folder's ECAPA-TDNN
  (`speaker_encoder.*`, modules.py) over a log-mel spectrogram of the clip at 24 kHz:
  1024-point STFT (Hann window of 1024, hop 256, no centring: the clip is
  reflect-padded by (1024 - 256) / 2 on each side), magnitudes sqrt(re^2 + im^2 + 1e-9),
  128 Slaney-normalised mel bands (Slaney mel scale) from 0 to 12 kHz, then
  log(max(x, 1e-5)); frames on the time axis. It takes the place of a named speaker's
  code in the prompt.
- Clip codes (in-context mode, when the clip's transcript is known): the codec's
  Mimi encoder (`speech_tokenizer/` `encoder.*`) over the clip, its first
  `encoder_valid_num_quantizers` code groups, ceil(samples / 1920) frames.

Both encoders run once per voice: `ClonePrompts` keeps a voice's parts (speaker row, and
clip codes in in-context mode) in a bounded LRU keyed by the custom voice's id and a hash
of the clip's samples and transcript, so a repeated voice skips both encoders. The
encoders are deterministic, so a hit gives exactly what a fresh encode would.

The mel filters come from transformers' `mel_filter_bank`, which builds the same
Slaney filters as librosa's `filters.mel` (the original's; librosa is not installed
here): checked once against librosa-built Whisper filters (16 kHz, 201 bins, 80 and
128 bands), equal to 1e-9.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import torch

SAMPLE_RATE = 24000
N_FFT = 1024
HOP = 256
WINDOW = 1024
MELS = 128
FMIN = 0.0
FMAX = 12000.0
MAG_EPS = 1e-9
LOG_FLOOR = 1e-5
MEL_PAD = (N_FFT - HOP) // 2
"""Reflect padding on each side of the clip before the STFT (no centring)."""
MIN_SAMPLES = N_FFT
"""A clip shorter than one STFT window (about 43 ms) gives no spectrogram; the speaker encoder may
need more (`min_clip_samples`)."""
CLONE_CACHE_SIZE = 32
"""Voices whose clone prompt parts a talker worker keeps (engine_extras["clone_cache_size"]; 0: none)."""


def min_clip_samples(speaker_encoder: torch.nn.Module) -> int:
    """The shortest clip (24 kHz samples) the speaker encoder takes. Its convolutions reflect-pad
    the mel frames ("same" padding), and a reflect pad must be shorter than its input: with
    transformers' default dilations (1, 2, 3, 4, 1), as the tiny folder has them, a clip of 1050-1279
    samples (4 frames) failed the dilation-4 layer with a RuntimeError (a 500) where a 400 was due."""
    pad = 0
    for conv in speaker_encoder.modules():
        if isinstance(conv, torch.nn.Conv1d) and conv.padding_mode == "reflect":
            if conv.padding == "same":
                total = conv.dilation[0] * (conv.kernel_size[0] - 1)
                pad = max(pad, total - total // 2)  # the larger side
            else:
                pad = max(pad, int(conv.padding[0]))
    frames = pad + 1  # mel frames of n samples: (n + 2 * MEL_PAD - N_FFT) // HOP + 1
    return max(MIN_SAMPLES, (frames - 1) * HOP + N_FFT - 2 * MEL_PAD)


class CloneEncoder:
    """The speaker encoder and the codec encoder of one Base folder, on the talker's device."""

    def __init__(self, path: Path, speaker_encoder: torch.nn.Module, device: Any) -> None:
        from transformers.audio_utils import mel_filter_bank

        from omni_actors.models.qwen3_tts.codec_model import load_codec

        _decoder, codec, config = load_codec(path, device, encoder=True)
        del _decoder  # the codec stage decodes; here only the encoder is needed
        self.codec, self.speaker, self.device = codec, speaker_encoder, device
        self.min_samples = min_clip_samples(speaker_encoder)
        self.groups = int(config.get("encoder_valid_num_quantizers") or config["encoder_config"]["num_quantizers"])
        self.frame = int(config.get("encode_downsample_rate", 1920))
        bank = mel_filter_bank(
            num_frequency_bins=N_FFT // 2 + 1, num_mel_filters=MELS, min_frequency=FMIN, max_frequency=FMAX,
            sampling_rate=SAMPLE_RATE, norm="slaney", mel_scale="slaney",
        )  # fmt: skip
        self.filters = torch.from_numpy(np.ascontiguousarray(bank.T)).float().to(device)  # [mels, bins]
        self.window = torch.hann_window(WINDOW, device=device)

    def check(self, samples: int, voice: str = "") -> None:
        """ValueError (a 400 naming `voice`) for a clip too short to clone."""
        if samples < self.min_samples:
            which = f"custom voice {voice!r}" if voice else "the custom voice"
            raise ValueError(f"voice: the clip of {which} is too short ({samples} samples at 24 kHz, "
                             f"{self.min_samples} needed); make the voice again from a longer sample")

    def mel(self, audio: np.ndarray) -> torch.Tensor:
        """[1, frames, 128] log-mel of a 24 kHz clip (module docstring)."""
        self.check(audio.size)
        y = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)).to(self.device)[None, None]
        y = torch.nn.functional.pad(y, (MEL_PAD, MEL_PAD), mode="reflect")[:, 0]
        spec = torch.stft(y, N_FFT, hop_length=HOP, win_length=WINDOW, window=self.window, center=False,
                          normalized=False, onesided=True, return_complex=True)  # fmt: skip
        mag = torch.sqrt(spec.real.square() + spec.imag.square() + MAG_EPS)
        return torch.log((self.filters @ mag).clamp(min=LOG_FLOOR)).transpose(1, 2)

    @torch.inference_mode()
    def speaker_row(self, audio: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
        """The clip's speaker embedding: one talker-wide row."""
        return self.speaker(self.mel(audio).to(dtype))[0]

    @torch.inference_mode()
    def codes(self, audio: np.ndarray) -> torch.Tensor:
        """[frames, groups] int64 codes of a 24 kHz clip."""
        x = torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)).to(self.device)[None, None]
        out = self.codec.encode(x, return_dict=True).audio_codes[0, : self.groups]
        return out[:, : -(-audio.size // self.frame)].T.long()


class CloneCacheStats(msgspec.Struct, frozen=True):
    hits: int
    misses: int
    entries: int


class ClonePrompts:
    """A voice's clone prompt parts, encoded once: bounded LRU of `size` voices (module docstring)."""

    def __init__(self, encoder: CloneEncoder, size: int = CLONE_CACHE_SIZE) -> None:
        if size < 0:
            raise ValueError(f"engine_extras.clone_cache_size: expected 0 or more, got {size}")
        self.encoder, self.size = encoder, size
        self.entries: OrderedDict[tuple[str, bytes], tuple[torch.Tensor, torch.Tensor | None]] = OrderedDict()
        self.hits = self.misses = 0

    @staticmethod
    def key(voice_id: str, audio: np.ndarray, transcript: str) -> tuple[str, bytes]:
        """(the custom voice's id, a digest of its clip's samples and transcript)."""
        digest = hashlib.blake2b(np.ascontiguousarray(audio, dtype=np.float32).tobytes(), digest_size=16)
        digest.update(b"\0" + transcript.encode())
        return voice_id, digest.digest()

    def parts(
        self, key: tuple[str, bytes], audio: np.ndarray, dtype: torch.dtype, codes: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(speaker row, clip codes [frames, groups] when `codes`, else None) of one voice. The tensors
        are shared between the voice's requests: read them, never write them."""
        hit = self.entries.get(key)
        if hit is not None and (hit[1] is not None or not codes):
            self.hits += 1
            self.entries.move_to_end(key)
            return hit[0], hit[1] if codes else None
        self.misses += 1
        row = hit[0] if hit is not None else self.encoder.speaker_row(audio, dtype)
        clip = self.encoder.codes(audio) if codes else None
        if self.size:
            self.entries[key] = (row, clip)
            self.entries.move_to_end(key)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
        return row, clip

    def statistics(self) -> CloneCacheStats:
        return CloneCacheStats(self.hits, self.misses, len(self.entries))
