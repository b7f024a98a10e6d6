"""The Dia decoder stage: an encoder-decoder with classifier-free guidance, continuously batched.

Dia does not fit HfAREngine's one-KV-row-per-request decoder: each request has a
text encoder pass, cross-attention KV, and two decoder rows (the text, and an
all-pad text for guidance) that are fed the same audio ids. This engine keeps, per
request, both rows' self-attention KV and the cross-attention KV its first forward
made, and steps every running request in ONE decoder forward. The new requests of a step
run their prompts (encoder + decoder prompt positions) together in ONE right-padded
forward through transformers' model (prefill.py; engine_extras["batch_prefill"] false:
one by one), then join that step's decode forward: a new request draws two positions in
its first step.

Warm-up (engine_extras["warmup"], default on CUDA), part of start-up: one short request,
then the static step's buckets a server will use (their CUDA graphs captured now); see
`warm_up`. Logged as "dia.warmed_up".

KV cache, engine_extras["kv_cache"] (HfAREngine's convention):
- "static" (default on CUDA): a slot per request in preallocated buffers and a
  fixed-shape decode step, replayed as a CUDA graph per bucket unless
  engine_extras["cuda_graphs"] is false (static_decode.py). Sized by
  engine_extras["max_model_len"] (default: the decoder's max_position_embeddings); a
  request's frame budget is cut to what fits (finish_reason "length").
- "dynamic" (default on CPU): per request DynamicCache tensors (request.py); a step
  left-pads the rows' self KV to the longest and right-pads their cross KV, with the
  masks that say so, through transformers' decoder, then cuts each row back out. Its
  positions are bounded the same way (max_model_len, else max_position_embeddings).
A reference clip that leaves no position to speak in is refused before it is encoded: a
400 naming `voice` with the longest clip allowed, in seconds (DiaProcessor does not trim
an audio prompt, and transformers' generate refuses one past max_length).

Inputs: {"text": str, "voice": "S1" | "S2", optional "reference_audio" float32 at
44.1 kHz and "reference_text"}. The text gets the voice's speaker tag unless it starts
with one ("[S1] ..."); a reference clip's transcript goes before it and the clip's DAC
codes fill the decoder's prompt (Dia's audio-prompt cloning). Outputs: {"codes": int64
[1, channels]} per completed audio frame, the last with "finish_reason".
Sampling: generation_config (guidance_scale, temperature, top_k, top_p, max_length)
< deploy defaults < request (seed, temperature, top_k, top_p, guidance_scale,
max_tokens: frames of audio).
"""

from __future__ import annotations

import math
import time
from typing import Any, NoReturn

import numpy as np
import torch

from omni_actors import logs
from omni_actors.config.speech import text_and_voice
from omni_actors.models.dia import VOICES
from omni_actors.models.dia.loading import load_dac
from omni_actors.models.dia.prefill import prefill
from omni_actors.models.dia.request import DiaRequest, Tokens
from omni_actors.models.dia.sampling import draw
from omni_actors.models.dia.static_decode import StaticDecoder
from omni_actors.workers.engine import EngineContext, EngineOutput, merge_params, timed
from omni_actors.workers.engines.hf_ar_adapter import check_checkpoint
from omni_actors.workers.engines.hf_ar_graphs import cuda_graphs_wanted
from omni_actors.workers.engines.own_engine import OwnEngine
from omni_actors.workers.engines.torch_setup import load_dtype, seeded

log = logs.get(__name__)

WARMUP_ID = "dia.warmup"
WARMUP_TEXT = "Warm up."
WARMUP_CLIP_FRAMES = 4
"""A silent reference clip of this many DAC frames takes the warm-up request through the clip path."""
WARMUP_POSITIONS = 256
"""Self-attention positions the warm-up covers: the first two windows (~3 s of audio at 86 frames/s)."""
WARMUP_TEXT_BYTES = 256
"""Text the warm-up covers: windows of 64, 128 and 256 bytes (a few sentences)."""
SHARED_KEYS = ("seed", "temperature", "top_k", "top_p", "guidance_scale", "max_tokens")
TAGS = ("[S1]", "[S2]")
KV_CACHES = ("static", "dynamic")


class DiaEngine(OwnEngine[DiaRequest]):
    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        from transformers import AutoTokenizer, DiaForConditionalGeneration

        path = check_checkpoint(ctx.model_path, ("config.json", "tokenizer_config.json"))
        dtype = load_dtype(ctx)
        with timed(ctx, "weights"):
            try:
                self.tokenizer = AutoTokenizer.from_pretrained(path)
                model = DiaForConditionalGeneration.from_pretrained(path, dtype=dtype)
            except Exception as err:
                raise ValueError(f"{path}: cannot load the Dia checkpoint ({err})") from err
            self.model = model.to(ctx.device).eval()
            self.dac = load_dac(path, ctx.device)  # encodes reference clips
        self.hop = int(np.prod(self.dac.config.downsampling_ratios))
        cfg = self.model.config
        dec = cfg.decoder_config
        self.tok = Tokens(
            dec.bos_token_id, dec.eos_token_id, dec.pad_token_id, tuple(cfg.delay_pattern)
        )
        self.channels, self.vocab = dec.num_channels, dec.vocab_size
        self.max_text = cfg.encoder_config.max_position_embeddings
        gen = self.model.generation_config
        self.defaults = {
            "temperature": (gen.temperature or 1.0) if gen.do_sample else 0.0,
            "top_k": gen.top_k, "top_p": gen.top_p, "guidance_scale": gen.guidance_scale,
            "max_tokens": gen.max_new_tokens or max(1, (gen.max_length or dec.max_position_embeddings) - 1),
        }  # fmt: skip
        self.static = self._static_decoder(ctx, dec.max_position_embeddings)
        self.max_positions = self.static.max_len if self.static is not None else int(
            ctx.engine_extras.get("max_model_len") or dec.max_position_embeddings)
        """Decoder positions a request may take (prompt and frames): the static cache's, else the model's."""
        self.rate = int(self.dac.config.sampling_rate)
        self.batch_prefill = ctx.engine_extras.get("batch_prefill", True)
        if not isinstance(self.batch_prefill, bool):
            raise ValueError(
                f"engine_extras.batch_prefill: expected true or false, got {self.batch_prefill!r}"
            )
        if ctx.engine_extras.get("warmup", ctx.device == "cuda"):
            with timed(ctx, "warmup"):
                self.warm_up()

    def _static_decoder(self, ctx: EngineContext, positions: int) -> StaticDecoder | None:
        extras = ctx.engine_extras
        kind = extras.get("kv_cache") or ("static" if ctx.device == "cuda" else "dynamic")
        if kind not in KV_CACHES:
            raise ValueError(f"engine_extras.kv_cache: expected one of {KV_CACHES}, got {kind!r}")
        limit = extras.get("max_model_len") or positions
        if int(limit) < 1:
            raise ValueError(f"engine_extras.max_model_len: expected a positive int, got {limit!r}")
        if kind == "dynamic":
            return None
        slots = max(1, ctx.max_num_seqs)
        return StaticDecoder(self.model, slots, int(limit), cuda_graphs_wanted(ctx), self.device)

    def warm_up(self) -> None:
        """One short greedy request through every path (clip encode, prefill, draw, decode,
        slot release), then the static step's warm-up buckets (StaticDecoder.warm_up: on CUDA
        their graphs are captured now, in start-up, not by the first requests to need them).
        Which buckets: every batch bucket (any load reaches them) x the self windows up to
        `warmup_positions` (default WARMUP_POSITIONS; a request's first audio comes within its
        first ~30 positions after its prompt) x the text windows up to `warmup_text_bytes`
        (default WARMUP_TEXT_BYTES). Longer windows are captured when first used. Leaves
        nothing behind: no request, no slot, zeroed buffers, the global RNG untouched (greedy)."""
        started = time.monotonic()
        extras = self.ctx.engine_extras
        clip = np.zeros(WARMUP_CLIP_FRAMES * self.hop, dtype=np.float32)  # the DAC encoder too
        self.add(
            WARMUP_ID,
            {"text": WARMUP_TEXT, "voice": VOICES[0], "reference_audio": clip},
            {"temperature": 0.0, "max_tokens": 1},
        )
        while self.has_work():
            for out in self.step():
                if out.error is not None:
                    raise RuntimeError(f"dia: the warm-up request failed ({out.error})")
        buckets = []
        if self.static is not None:
            buckets = self.static.warm_up(
                int(extras.get("warmup_positions", WARMUP_POSITIONS)),
                int(extras.get("warmup_text_bytes", WARMUP_TEXT_BYTES)),
            )
        graphs = self.static is not None and self.static.graphs.enabled
        log.info(
            "dia.warmed_up", buckets=len(buckets), cuda_graphs=graphs,
            ms=round((time.monotonic() - started) * 1000, 1),
        )  # fmt: skip

    # ---- requests --------------------------------------------------------

    def add(
        self,
        request_id: str,
        inputs: dict[str, Any],
        params: dict[str, Any],
        streaming: bool = False,
    ) -> None:
        merged = merge_params(self.ctx, params, SHARED_KEYS, self.defaults)
        text, voice = text_and_voice(inputs, "dia", VOICES)
        ref = inputs.get("reference_audio")
        cloned = ref is not None and np.asarray(ref).size > 0
        said = _tagged(str(inputs.get("reference_text") or ""), voice) if cloned else ""
        full = f"{said} {_tagged(text, voice)}" if said else _tagged(text, voice)
        ids = self.tokenizer(full, add_special_tokens=False).input_ids
        if len(ids) > self.max_text:  # (before the DAC encodes any clip)
            self._refuse_text(len(ids), text, voice, bool(said))
        codes = np.zeros((0, self.channels), dtype=np.int64)
        if cloned:
            clip = np.array(ref, dtype=np.float32).reshape(-1)
            self._check_clip(clip.size)  # before the DAC encodes it
            codes = self._encode(clip)
        gen = seeded(merged.get("seed"), self.device)
        max_frames = int(merged["max_tokens"])
        if max_frames < 1:
            raise ValueError(f"dia: max_tokens must be positive, got {max_frames}")
        # positions fed: the prompt's, then all but the last drawn (past the decoder's positions the
        # dynamic cache ran on unchecked before 2026-12-05, and the static one refused naming no field)
        max_frames = min(max_frames, self._room(len(codes)))
        self.requests[request_id] = DiaRequest(request_id, merged, ids, codes, max_frames, gen)

    def _refuse_text(self, total: int, text: str, voice: str, transcribed: bool) -> NoReturn:
        """The 400 for text past the encoder: naming `voice` when the custom voice's transcript is what pushes
        it over (the request's text fits alone; before 2026-12-05 that named `input` too), else `input`."""
        alone = len(self.tokenizer(_tagged(text, voice), add_special_tokens=False).input_ids)
        if transcribed and alone <= self.max_text:
            raise ValueError(
                f"voice: the custom voice's transcript makes the text {total} bytes (the input alone is "
                f"{alone}, with the speaker tags); Dia's encoder takes at most {self.max_text}: use a voice "
                f"with a shorter transcript, or a shorter input"
            )
        raise ValueError(
            f"input: the text is {total} bytes (with the speaker tags); Dia's encoder takes at most {self.max_text}"
        )

    def _room(self, clip_frames: int) -> int:
        """Frames a request can speak after a reference clip of `clip_frames` DAC frames."""
        return self.max_positions - (1 + clip_frames) - self.tok.max_delay + 1

    def _check_clip(self, samples: int) -> None:
        """A 400 naming `voice` (with the longest clip allowed) for a reference clip that leaves no
        decoder position to speak in."""
        frames = -(-samples // self.hop)
        if self._room(frames) >= 1:
            return
        longest = self.max_positions - 1 - self.tok.max_delay  # frames, leaving one to speak
        raise ValueError(
            f"voice: the custom voice's reference clip is {samples / self.rate:.1f} s ({frames} DAC frames); "
            f"Dia's decoder holds {self.max_positions} positions (the clip's frames, {self.tok.max_delay} "
            f"of delay and the speech), so a reference clip may be at most "
            f"{math.floor(longest * self.hop / self.rate * 10) / 10:g} s: use a shorter sample for this voice"
        )

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None and self.static is not None:
            self.static.release(req)

    def close(self) -> None:
        for request_id in list(self.requests):
            self.abort(request_id)

    @torch.inference_mode()
    def _encode(self, audio: np.ndarray) -> np.ndarray:
        """[P, channels] DAC codes of a clip at 44.1 kHz (padded to whole hops, as DiaProcessor does)."""
        pad = -audio.size % self.hop
        wav = torch.from_numpy(np.pad(audio, (0, pad)))[None, None].to(self.device)
        return self.dac.encode(wav).audio_codes[0].T.cpu().numpy().astype(np.int64)

    # ---- stepping --------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[EngineOutput]:
        running, new = self.admit()
        outputs: list[EngineOutput] = []
        if new:
            ready, logits, failed = self._prefill(new)
            outputs.extend(failed)
            if self.static is not None:
                for req in ready:
                    self.static.store(req)
            if logits is not None:
                outputs.extend(self._take(ready, logits[0::2], logits[1::2]))
            # and their next position in this step's decode (one step sooner to first audio; the
            # static step computed it anyway): ids and position are the ones the next step would feed
            running = running + [r for r in ready if r.request_id in self.requests]
        if running:
            if self.static is not None:
                running, cond, uncond = self.static.decode(running)
            else:
                cond, uncond = self._decode(running)
            outputs.extend(self._take(running, cond, uncond))
        return outputs

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[rows, hidden] last decoder states -> [rows, channels, vocab]."""
        return (
            self.model.logits_dense(hidden).float().view(hidden.shape[0], self.channels, self.vocab)
        )

    def _prefill(
        self, reqs: list[DiaRequest]
    ) -> tuple[list[DiaRequest], torch.Tensor | None, list[EngineOutput]]:
        """Every new prompt in one forward (prefill.py): (the ready requests, their logits
        [2 * n, channels, vocab] (rows 2i, 2i + 1: cond, uncond), failed requests' final outputs).
        When the batched forward fails (or engine_extras["batch_prefill"] is false), each prompt
        runs alone, so one bad prompt fails alone."""
        if len(reqs) == 1 or self.batch_prefill:
            try:
                return reqs, self._logits(prefill(self.model, reqs, self.tok, self.device)), []
            except Exception as err:  # one prompt fails alone (a batch: each runs alone, below)
                if len(reqs) == 1:
                    return [], None, [self.failed(reqs[0].request_id, err)]
        parts = [self._prefill([req]) for req in reqs]
        rows = [logits for _, logits, _ in parts if logits is not None]
        ready = [req for got, _, _ in parts for req in got]
        return ready, torch.cat(rows) if rows else None, [out for *_, bad in parts for out in bad]

    def _decode(self, reqs: list[DiaRequest]) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers import DynamicCache, EncoderDecoderCache

        lengths = [r.self_kv[0][0].shape[2] for r in reqs]  # positions fed so far
        longest, texts = max(lengths), [r.encoded.shape[1] for r in reqs]
        widest = max(texts)
        own, cross = DynamicCache(), DynamicCache()
        for layer in range(len(reqs[0].self_kv)):
            own.update(
                torch.cat([_pad(r.self_kv[layer][0], longest, left=True) for r in reqs]),
                torch.cat([_pad(r.self_kv[layer][1], longest, left=True) for r in reqs]),
                layer,
            )
            cross.update(
                torch.cat([_pad(r.cross_kv[layer][0], widest) for r in reqs]),
                torch.cat([_pad(r.cross_kv[layer][1], widest) for r in reqs]),
                layer,
            )
        rows = 2 * len(reqs)
        mask = torch.zeros(rows, longest + 1, dtype=torch.long, device=self.device)
        text_mask = torch.zeros(rows, widest, dtype=torch.long, device=self.device)
        for i, (n, t) in enumerate(zip(lengths, texts, strict=True)):
            mask[2 * i : 2 * i + 2, longest - n :] = 1
            text_mask[2 * i : 2 * i + 2, :t] = 1
        last = torch.from_numpy(np.stack([r.last() for r in reqs])).to(self.device)
        ids = last.repeat_interleave(2, dim=0)[:, None]  # [rows, 1, channels]
        pos = torch.tensor(lengths, device=self.device).repeat_interleave(2)[:, None]
        encoded = torch.cat([_pad(r.encoded, widest, dim=1) for r in reqs])
        out = self.model.model.decoder(
            input_ids=ids, position_ids=pos, attention_mask=mask, encoder_hidden_states=encoded,
            encoder_attention_mask=text_mask, past_key_values=EncoderDecoderCache(own, cross), use_cache=True,
        )  # fmt: skip
        for i, (req, n) in enumerate(zip(reqs, lengths, strict=True)):
            cut = longest - n
            req.self_kv = [
                (
                    x.keys[2 * i : 2 * i + 2, :, cut:].clone(),
                    x.values[2 * i : 2 * i + 2, :, cut:].clone(),
                )
                for x in own.layers
            ]
        logits = self._logits(out.last_hidden_state[:, -1]).view(
            len(reqs), 2, self.channels, self.vocab
        )
        return logits[:, 0], logits[:, 1]

    def _take(
        self, reqs: list[DiaRequest], cond: torch.Tensor, uncond: torch.Tensor
    ) -> list[EngineOutput]:
        drawn = draw(
            cond, uncond, [r.params for r in reqs], [r.generator for r in reqs], self.tok.eos
        )
        host = drawn.cpu().numpy()
        outputs = []
        for req, row in zip(reqs, host, strict=True):
            frame, done = req.take(row, self.tok)
            payload: dict[str, Any] = {} if frame is None else {"codes": frame[None]}
            if done:
                self.abort(req.request_id)
                forced = req.end is not None and req.end - req.known >= req.max_frames
                payload["finish_reason"] = "length" if forced else "stop"
                # usage: the text's tokens in; the decoder positions drawn (frames plus their delays) out
                payload.update(prompt_tokens=len(req.text_ids), completion_tokens=len(req.positions) - req.known)
            if payload:
                outputs.append(EngineOutput(req.request_id, payload, done))
        return outputs


def _tagged(text: str, voice: str) -> str:
    text = text.strip()
    return text if text.startswith(TAGS) or not text else f"[{voice}] {text}"


def _pad(x: torch.Tensor, length: int, left: bool = False, dim: int = 2) -> torch.Tensor:
    missing = length - x.shape[dim]
    if missing == 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    zeros = x.new_zeros(shape)
    return torch.cat([zeros, x] if left else [x, zeros], dim=dim)
