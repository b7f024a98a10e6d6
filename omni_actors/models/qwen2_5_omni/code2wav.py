"""Code2wav adapter for GenerationEngine: Qwen2.5-Omni's Token2Wav (DiT flow matching + BigVGAN).

Decoding runs in float32 (the model needs it). The DiT is not causal, so a
window carries right context (lookahead) as well as left context, and chunk
boundaries are close to, not bit-equal with, a whole-utterance decode (window
sizes are whole DiT attention blocks, 12 codes, so blocks line up). The
flow's starting noise is drawn per code position from the request's seed, so
a position gets the same noise whichever window decodes it, and a request
decodes the same alone or batched.

The DiT velocity and the vocoder's activations run through fast_token2wav's
equivalent pieces; the vocoder decodes only the codes whose audio is sent (plus
its receptive radius), in batches of at most VOCODER_BATCH_FRAMES frames.

Inputs: {"codes": int [n]} (talker codes), optional "speaker".
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from omni_actors import logs
from omni_actors.config.speech import pick_voice
from omni_actors.models.qwen2_5_omni.fast_token2wav import (
    DiTVelocity,
    install_fast_vocoder,
    receptive_radius,
)
from omni_actors.models.qwen2_5_omni.loading import check_checkpoint, load_config, load_part
from omni_actors.models.qwen2_5_omni.token2wav_graphs import WindowGraphs
from omni_actors.workers.engine import timed
from omni_actors.workers.engines.generation_adapter import (
    FINAL_WINDOW_SLACK,
    ChunkPolicy,
    GenerationAdapter,
)
from omni_actors.workers.engines.hf_ar_graphs import cuda_graphs_wanted

log = logs.get(__name__)

DEFAULT_SPEAKER = "Chelsie"
NUM_STEPS = 10
GUIDANCE_SCALE = 0.5
SWAY_COEFFICIENT = -1.0
VOCODER_BATCH_FRAMES = 256
"""Most mel frames in one vocoder call. Measured on one CPU thread (tiny BigVGAN): batching
beats one window at a time up to ~300 frames in all (8 x 24 frames: 116 vs 181 ms) and loses
past ~500, where the activations leave the caches (8 x 128 frames: 624 vs 535 ms)."""
PRECISIONS = ("tf32", "float32", "bfloat16")
GPU_MAX_BATCH_CODES = 512
"""max_batch_codes under CUDA graphs: a replay costs about the same at any batch this small."""


class _LastCallCache(torch.nn.Module):
    """Wraps a pure module and returns its last output again when called on equal input.

    The DiT re-encodes the (constant) speaker reference mel with its ECAPA
    speaker encoder at every one of the ~36 ODE evaluations of a decode; that
    was a third of code2wav's time. The cached output is the very tensor the
    same computation produced, so results are unchanged.
    """

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self._key: torch.Tensor | None = None
        self._out: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        key = self._key
        if key is None or key.shape != x.shape or key.dtype != x.dtype or not torch.equal(key, x):
            self._out = self.inner(x)
            self._key = x.detach().clone()
        return self._out


class Qwen2_5OmniCode2WavAdapter(GenerationAdapter):
    sample_rate = 24000
    chunk_size = 24
    first_chunk_size = 12
    left_context = 24
    right_context = 12
    chunk_growth = 2.0
    max_chunk_size = 96
    """Windows of 24 / 48 / 96 new codes (+ 24 left, 12 right), all whole DiT blocks of 12 codes.
    Measured on one CPU thread: 5.2 ms per new code in 60-code windows, 3.3 in 132-code ones
    (longer windows cost more per code: 2.1 ms at 60, 2.4 at 132; the DiT's attention is
    quadratic and the vocoder's activations leave the caches)."""
    max_batch_codes = 256
    """Measured on CPU: 1.7-2.2 ms per window code at 4-8 windows a batch, no gain past ~250."""

    def load(self) -> None:
        with timed(self.ctx, "imports"):
            from transformers import Qwen2_5OmniToken2WavModel

        path = check_checkpoint(self.ctx.model_path, ("config.json", "spk_dict.pt"))
        config = load_config(path, self.ctx).token2wav_config
        self.model = load_part(
            Qwen2_5OmniToken2WavModel, path, config, "token2wav", self.ctx, float32=True
        )
        try:
            self.speakers = torch.load(path / "spk_dict.pt", weights_only=True)
        except Exception as err:
            raise ValueError(f"{path / 'spk_dict.pt'}: cannot read speakers ({err})") from err
        embed = self.model.code2wav_dit_model.input_embed
        embed.spk_encoder = _LastCallCache(embed.spk_encoder)
        install_fast_vocoder(self.model.code2wav_bigvgan_model)
        dit, vocoder = config.dit_config, config.bigvgan_config
        self.repeats, self.mel_dim = dit.repeats, dit.mel_dim
        self.num_codes = dit.num_embeds
        self.hop = 1
        for rate in vocoder.upsample_rates:
            self.hop *= rate
        self.samples_per_code = self.repeats * self.hop
        self.vocoder_margin = receptive_radius(self.model.code2wav_bigvgan_model, self.mel_dim) + 1
        """Mel frames decoded beyond the kept ones on each side: no kept sample depends on more."""
        times = torch.linspace(0, 1, NUM_STEPS, device=self.ctx.device)
        self.times = times + SWAY_COEFFICIENT * (torch.cos(torch.pi / 2 * times) - 1 + times)
        self.windows: WindowGraphs | None = None
        self._lengths: tuple[int, ...] = ()
        self.precision, self.first_batches = self._check_extras(self.ctx.engine_extras)
        if str(self.ctx.device).startswith("cuda"):
            torch.backends.cuda.matmul.allow_tf32 = self.precision != "float32"  # the worker's
        else:
            self.precision = "float32"
        if cuda_graphs_wanted(self.ctx):
            self._graphs_on()

    @staticmethod
    def _check_extras(extras: dict[str, Any]) -> tuple[str, list[int]]:
        """engine_extras.precision (on CUDA): "tf32" (default: float32 weights and activations,
        matmuls on TF32 tensor cores), "float32" (no TF32) or "bfloat16" (the DiT's matmuls under
        bfloat16 autocast; the ODE state, norms and the vocoder stay float32).
        engine_extras.graph_first_batches: batch sizes whose first-window graphs are captured at
        load (default 1, 2, 4, 8). Checked on every device, so a deploy's mistake shows anywhere."""
        precision = extras.get("precision", "tf32")
        if precision not in PRECISIONS:
            raise ValueError(
                f"engine_extras.precision must be one of {PRECISIONS}, got {precision!r}"
            )
        batches = extras.get("graph_first_batches", [1, 2, 4, 8])
        ok = isinstance(batches, (list, tuple)) and all(
            isinstance(b, int) and not isinstance(b, bool) and 1 <= b <= 256 for b in batches
        )
        if not ok:
            raise ValueError(
                f"engine_extras.graph_first_batches must be a list of batch sizes 1-256, got {batches!r}"
            )
        return precision, [int(b) for b in batches]

    def _dit_autocast(self) -> Any:
        if self.precision == "bfloat16":
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _graphs_on(self) -> None:
        """Token2Wav windows as CUDA graph replays, the standard window lengths captured now."""
        extras = self.ctx.engine_extras
        self.max_batch_codes = GPU_MAX_BATCH_CODES  # the default; the engine applies engine_extras' own
        policy = ChunkPolicy.of(self, extras)
        longest = policy.left_context + int(FINAL_WINDOW_SLACK * policy.cap) + policy.right_context
        self.windows = WindowGraphs(
            self.model.code2wav_dit_model, self.model.code2wav_bigvgan_model, self.times,
            GUIDANCE_SCALE, enabled=True, autocast=self._dit_autocast, max_codes=longest,
        )  # fmt: skip
        lengths = [policy.first_window, policy.first_chunk_size + policy.right_context]
        lengths += [
            policy.left_context + k * policy.chunk_size + policy.right_context
            for k in range(1, policy.cap // policy.chunk_size + 1)
        ]
        lengths.append(longest - policy.right_context)  # a streamed utterance's longest last window
        self._lengths = tuple(sorted(set(lengths)))
        speaker = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else sorted(self.speakers)[0]
        first, rest = lengths[0], lengths[1:]
        shapes = [(b, first) for b in self.first_batches]
        shapes += [(1, n) for n in rest]
        with timed(self.ctx, "cuda_graphs"), torch.inference_mode():
            for batch, n in shapes:
                windows = [torch.zeros(n, dtype=torch.long)] * batch
                data = [{"speaker": speaker, "seed": 0}] * batch
                self.windows.run(*self._inputs(windows, [0] * batch, data))
        log.info("code2wav.graphs_ready", lengths=lengths, graphs=len(self.windows.slots),
                 enabled=self.windows.enabled)  # fmt: skip

    def window_lengths(self) -> tuple[int, ...]:
        """Under CUDA graphs, the lengths captured at load: an utterance's last window is widened
        to one (more left context) rather than captured anew at its own length, which would cost
        about an eager decode. On a CPU every extra code costs: no preference."""
        return self._lengths if self.windows is not None and self.windows.enabled else ()

    def start(self, inputs: dict[str, Any], params: dict[str, Any]) -> Any:
        default = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else sorted(self.speakers)[0]
        speaker = pick_voice(params, inputs, sorted(self.speakers), default)  # as the talker picks it
        return {"speaker": speaker, "seed": int(params.get("seed") or 0)}

    def batch_key(self, data: Any) -> Any:
        return data["speaker"]  # reference mels of one speaker share a length

    def codes_of(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        if "codes" not in inputs:
            return None
        codes = torch.as_tensor(inputs["codes"], dtype=torch.long).reshape(-1)
        return codes[codes < self.num_codes]  # talker control codes have no sound

    def _noise(self, seed: int, start: int, length: int) -> torch.Tensor:
        rows = []
        for pos in range(start, start + length):
            gen = torch.Generator().manual_seed((seed * 1_000_003 + pos) % 2**64)  # any int64 seed fits
            rows.append(torch.randn(self.repeats, self.mel_dim, generator=gen))
        return torch.cat(rows)

    def decode(
        self, windows: list[torch.Tensor], starts: list[int], data: list[Any]
    ) -> list[torch.Tensor]:
        keep = [(0, None)] * len(windows)
        return [wav for wav, _ in self.decode_part(windows, starts, data, keep)]

    def decode_part(
        self,
        windows: list[torch.Tensor],
        starts: list[int],
        data: list[Any],
        keep: list[tuple[int, int | None]],
    ) -> list[tuple[torch.Tensor, int]]:
        """The DiT on whole windows (its attention needs them), the vocoder only on the kept
        codes and its receptive field: the rest of a window's audio is never sent. Under CUDA
        graphs (token2wav_graphs) the whole window is decoded and the same samples kept."""
        from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import RungeKutta4ODESolver

        codes, cond, ref, noise = self._inputs(windows, starts, data)
        frames = noise.shape[1]
        spans = []
        for lo, hi in keep:
            first = max(0, lo * self.repeats - self.vocoder_margin)
            last = frames if hi is None else min(frames, hi * self.repeats + self.vocoder_margin)
            spans.append((first, last))
        if self.windows is not None:  # whole windows, replayed: on a GPU the extra samples are free
            wav = self.windows.run(codes, cond, ref, noise)[1].cpu()
            wavs = [
                w[first * self.hop : last * self.hop]
                for w, (first, last) in zip(wav, spans, strict=True)
            ]
        else:
            with self._dit_autocast():
                velocity = DiTVelocity.for_codes(
                    self.model.code2wav_dit_model, codes, cond, ref, GUIDANCE_SCALE
                )
                solver = RungeKutta4ODESolver(function=velocity, initial_value=noise)
                mel = solver.integrate(self.times)[-1].float()
            wavs = self._vocode(mel, spans)
        return [(wav, first * self.hop) for wav, (first, _) in zip(wavs, spans, strict=True)]

    def _inputs(
        self, windows: list[torch.Tensor], starts: list[int], data: list[Any]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """codes [B, n], speaker vector per frame, reference mel, starting noise: on the device."""
        dev = self.ctx.device
        spk = [self.speakers[d["speaker"]] for d in data]
        codes = torch.stack(windows).to(dev)
        cond = torch.stack([s["cond"].float().reshape(-1) for s in spk]).to(dev)
        ref = torch.cat([s["ref_mel"].float().reshape(1, -1, self.mel_dim) for s in spk]).to(dev)
        noise = torch.stack(
            [
                self._noise(d["seed"], s, len(w))
                for d, s, w in zip(data, starts, windows, strict=True)
            ]
        ).to(dev)
        return codes, cond[:, None].repeat(1, noise.shape[1], 1), ref, noise

    def _vocode(self, mel: torch.Tensor, spans: list[tuple[int, int]]) -> list[torch.Tensor]:
        """BigVGAN on mel[i, first:last] for each span; equal spans batched up to a frame budget."""
        vocoder = self.model.code2wav_bigvgan_model
        out: list[torch.Tensor | None] = [None] * len(spans)
        by_length: dict[int, list[int]] = {}
        for i, (first, last) in enumerate(spans):
            by_length.setdefault(last - first, []).append(i)
        for length, members in by_length.items():
            per_batch = max(1, VOCODER_BATCH_FRAMES // max(1, length))
            for k in range(0, len(members), per_batch):
                part = members[k : k + per_batch]
                batch = torch.stack([mel[i, spans[i][0] : spans[i][1]] for i in part])
                wav = vocoder(batch.permute(0, 2, 1)).reshape(len(part), -1)
                for i, w in zip(part, wav, strict=True):
                    out[i] = w
        return out  # type: ignore[return-value]
