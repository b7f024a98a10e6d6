"""The VibeVoice LM stage: a Qwen2 LM that picks "audio next", a diffusion head that makes each latent.

Per step, as transformers' VibeVoice generation does, for every running request:

1. the conditioned branch (the prompt and everything since) runs one position; the
   next token is the argmax over the four ids the LM may say (audio bos, audio eos,
   the audio placeholder, end of text);
2. on the placeholder, the guidance branch (audio bos, then the same audio inputs,
   no text) runs one position too, and the diffusion head denoises a latent from the
   request's own noise with the scheduler named by generation_config
   (DPM-Solver, `num_diffusion_steps`), guided by both branches' states
   (`guidance_scale`);
3. the latent goes downstream, and comes back as the next input: the acoustic
   decoder turns it into 3200 samples, the semantic encoder reads those, and the
   two connectors' sum is the next embedding (so this stage decodes audio too,
   with per-request streaming caches; the codec stage decodes the same latents for
   the audio it sends);
4. an end token (generation_config `eos_token_id`) or the frame budget ends the request.

Every running request's conditioned branch steps in one LM forward, and the
guidance branches of the requests making audio in another; the diffusion head runs
on all of them at once. New requests prefill one by one through transformers' model.

KV cache, engine_extras["kv_cache"] (HfAREngine's convention):
- "static" (the default on CUDA): a slot per request (both branches) in preallocated
  buffers, a fixed-shape LM step per branch (static_lm.py), and one fixed-shape audio
  step (static_audio.py): all the head's denoising steps (static_head.py) and the
  codec feedback of every slot, with per-slot codec caches; each replayed as a CUDA
  graph per bucket unless engine_extras["cuda_graphs"] is false. Sized by
  engine_extras["max_model_len"] (default: the LM's positions, at most
  DEFAULT_MAX_LEN); a request's frame budget is cut to what fits.
- "dynamic" (the default on CPU): per request DynamicCache tensors, left-padded and
  stacked per step as HfAREngine's CPU cache (dynamic_lm.py), the scheduler stepped
  in Python, the two codec passes per request (their caches per request).

Inputs: {"text", "voice": "0".."3" (the script's speaker), optional "reference_audio"
float32 at 24 kHz (the voice section of the prompt: Dia-style cloning)}.
Outputs: {"latents": float32 [1, latent]} per audio step, the last with "finish_reason".
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_actors.config.speech import text_and_voice
from omni_actors.models.vibevoice import VOICES
from omni_actors.models.vibevoice.dynamic_lm import step_rows
from omni_actors.models.vibevoice.request import VibeVoiceRequest, prompt_text
from omni_actors.models.vibevoice.static_audio import StaticAudio
from omni_actors.models.vibevoice.static_lm import COND, GUIDE, StaticLM
from omni_actors.workers.engine import EngineContext, EngineOutput, merge_params
from omni_actors.workers.engines.hf_ar_adapter import check_checkpoint
from omni_actors.workers.engines.hf_ar_graphs import cuda_graphs_wanted
from omni_actors.workers.engines.own_engine import OwnEngine
from omni_actors.workers.engines.torch_setup import load_dtype, seeded

SHARED_KEYS = ("seed", "guidance_scale", "max_tokens", "ignore_eos")
DEFAULT_DIFFUSION_STEPS = 10
KV_CACHES = ("static", "dynamic")
DEFAULT_KV_CACHE = {"cuda": "static", "cpu": "dynamic"}
"""Per device: static on CUDA (an H200, VibeVoice-1.5B-sized: a step 13.4 ms at batch 1 and 21 ms at
16 against 111 and 524 ms dynamic, docs/benchmarks.md), dynamic on CPU (cheapest for tiny models)."""
DEFAULT_MAX_LEN = 4096
"""Static KV positions per branch unless engine_extras.max_model_len says (prompt + frames: 9 min of audio)."""


class VibeVoiceEngine(OwnEngine[VibeVoiceRequest]):
    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        from transformers import (
            AutoFeatureExtractor,
            AutoTokenizer,
            VibeVoiceForConditionalGeneration,
        )

        path = check_checkpoint(ctx.model_path, ("config.json",))
        dtype = load_dtype(ctx)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.features = AutoFeatureExtractor.from_pretrained(path)
            model = VibeVoiceForConditionalGeneration.from_pretrained(path, dtype=dtype)
        except Exception as err:
            raise ValueError(f"{path}: cannot load the VibeVoice checkpoint ({err})") from err
        self.model = model.to(ctx.device).eval()
        self.parts = self.model.model
        cfg = self.model.config
        self.ids = (
            cfg.audio_bos_token_id,
            cfg.audio_eos_token_id,
            cfg.audio_token_id,
            cfg.eos_token_id,
        )
        self.allowed = torch.full((cfg.text_config.vocab_size,), float("-inf"), device=ctx.device)
        self.allowed[list(self.ids)] = 0.0
        gen = self.model.generation_config
        ends = gen.eos_token_id if gen.eos_token_id is not None else [cfg.eos_token_id]
        self.stops = {int(t) for t in (ends if isinstance(ends, list) else [ends])} | {
            cfg.audio_eos_token_id
        }
        self.scheduler = VibeVoiceForConditionalGeneration._build_default_noise_scheduler(gen)
        self.steps = int(getattr(gen, "num_diffusion_steps", None) or DEFAULT_DIFFUSION_STEPS)
        self.latent = cfg.audio_config.hidden_size
        self.hop = cfg.audio_config.hop_length
        self.defaults = {
            "guidance_scale": gen.guidance_scale or 1.0,
            "max_tokens": gen.max_new_tokens or max(1, (gen.max_length or 4096) - 1),
        }  # fmt: skip
        self.tokens = [self.tokenizer.convert_ids_to_tokens(i) for i in self.ids[:3]]
        self.static: StaticLM | None = None
        self.audio: StaticAudio | None = None
        extras = ctx.engine_extras
        kind = extras.get("kv_cache") or DEFAULT_KV_CACHE.get(ctx.device, "dynamic")
        if kind not in KV_CACHES:
            raise ValueError(f"engine_extras.kv_cache: expected one of {KV_CACHES}, got {kind!r}")
        limit = extras.get("max_model_len") or min(
            cfg.text_config.max_position_embeddings, DEFAULT_MAX_LEN
        )
        if int(limit) < 1:
            raise ValueError(f"engine_extras.max_model_len: expected a positive int, got {limit!r}")
        if kind == "static":
            self.build_static(int(limit), cuda_graphs_wanted(ctx))

    def build_static(self, max_len: int, graphs: bool) -> None:
        """Static slot buffers for the LM and the audio step, in the model's current dtype."""
        slots = max(1, self.ctx.max_num_seqs)
        self.static = StaticLM(self.parts.language_model, slots, max_len, graphs, self.device)
        self.audio = StaticAudio(
            self.parts, self.scheduler, self.steps, self.static.states, self.static.embeds,
            self.static.batch_sizes, graphs, self.device,
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
        text, voice = text_and_voice(inputs, "vibevoice", VOICES)
        ref = inputs.get("reference_audio")
        prompt: dict[str, torch.Tensor] = {}
        latents = 0
        if ref is not None and len(ref):
            feats = self.features(
                [torch.as_tensor(ref, dtype=torch.float32).reshape(-1).numpy()],
                sampling_rate=self.features.sampling_rate,
                return_tensors="pt",
            )
            prompt = {"input_values": feats["input_values"], "padding_mask": feats["padding_mask"]}
            latents = -(-int(feats["padding_mask"].sum()) // self.hop)
        bos, eos, pad = self.tokens
        ids = self.tokenizer(
            prompt_text(text, voice, latents, bos, eos, pad), add_special_tokens=False
        )
        prompt["input_ids"] = torch.tensor([ids.input_ids])
        max_frames = int(merged["max_tokens"])
        if max_frames < 1:
            raise ValueError(f"vibevoice: max_tokens must be positive, got {max_frames}")
        if self.static is not None:  # positions fed: the prompt's, then one per token but the last
            room = self.static.max_len - len(ids.input_ids) + 1
            if room < 1:
                raise ValueError(
                    f"vibevoice: the prompt takes {len(ids.input_ids)} positions; the stage holds "
                    f"{self.static.max_len} (engine_extras.max_model_len)"
                )
            max_frames = min(max_frames, room)
        gen = seeded(merged.get("seed"), self.device)
        self.requests[request_id] = VibeVoiceRequest(request_id, merged, prompt, max_frames, gen)

    def abort(self, request_id: str) -> None:
        req = self.requests.pop(request_id, None)
        if req is not None and self.static is not None:
            moved = self.static.release(req)
            if moved is not None:
                self.audio.move(*moved)

    def close(self) -> None:
        for request_id in list(self.requests):
            self.abort(request_id)

    # ---- stepping --------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[EngineOutput]:
        running, new = self.admit()
        outputs: list[EngineOutput] = []
        consumed: list[torch.Tensor | None] = [None] * len(running)
        if running and self.static is not None:
            self.static.step(COND, running)
        elif running:
            consumed = [r.embed for r in running]
            hidden, kvs = step_rows(
                self.parts.language_model, [r.kv for r in running], torch.stack(consumed)
            )
            for req, h, kv in zip(running, hidden, kvs, strict=True):
                req.kv, req.hidden = kv, h
        moved: list[tuple[VibeVoiceRequest, torch.Tensor | None]] = []
        for req in new:
            try:
                self._prefill(req)
            except Exception as err:  # one prompt fails alone
                outputs.append(self.failed(req.request_id, err))
                continue
            if self.static is not None:
                self.static.store(req, self._embed(self.ids[0]))
                self.audio.start(req.slot)
                self.audio.scale[req.slot] = self._scale(req)
            moved.append((req, None))
        moved.extend(zip(running, consumed, strict=True))
        if moved:
            outputs.extend(self._advance(moved))
        return outputs

    def _prefill(self, req: VibeVoiceRequest) -> None:
        dt = self.model.dtype  # the clip's samples in the model's dtype (bfloat16 on CUDA)
        inputs = {
            k: v.to(self.device, dt if v.is_floating_point() else v.dtype)
            for k, v in req.prompt.items()
        }
        with torch.random.fork_rng(devices=[] if self.device.type == "cpu" else [self.device]):
            if req.generator is not None:  # the clip's VAE sample draws from the global generator
                torch.manual_seed(int(req.params["seed"]))
            out = self.parts(**inputs, use_cache=True)
        req.kv = [(x.keys, x.values) for x in out.past_key_values.layers]
        req.hidden = out.last_hidden_state[0, -1]

    def _embed(self, token: int) -> torch.Tensor:
        return self.parts.get_input_embeddings()(torch.tensor(token, device=self.device))

    def _tokens(self, reqs: list[VibeVoiceRequest]) -> list[int]:
        """Each request's next token: the argmax over the ids the LM may say (a request with
        `ignore_eos` may not say an end token: it runs to max_tokens, as benchmarks need)."""
        if self.static is not None:  # every slot at once, in slot order
            states = self.static.states[COND, : len(self.static.owners)]
            rows = [r.slot for r in reqs]
        else:
            states = torch.stack([r.hidden for r in reqs])
            rows = list(range(len(reqs)))
        logits = self.model.lm_head(states).float() + self.allowed
        endless = [row for row, r in zip(rows, reqs, strict=True) if r.params.get("ignore_eos")]
        if endless:
            logits[torch.tensor(endless)[:, None], torch.tensor(sorted(self.stops))[None]] = float("-inf")
        picked = logits.argmax(dim=-1).tolist()
        return [picked[row] for row in rows]

    def _advance(
        self, moved: list[tuple[VibeVoiceRequest, torch.Tensor | None]]
    ) -> list[EngineOutput]:
        reqs = [r for r, _ in moved]
        bos, _, audio, _ = self.ids
        audio_rows = []
        results: dict[str, tuple[dict[str, Any], bool]] = {}
        for (req, consumed), token in zip(moved, self._tokens(reqs), strict=True):
            req.tokens.append(token)
            results[req.request_id] = ({}, False)
            if token in self.stops:
                results[req.request_id] = ({"finish_reason": "stop"}, True)
            elif token == audio:
                audio_rows.append((req, consumed if consumed is not None else self._embed(bos)))
            else:
                if token == bos:  # a new audio segment: the guidance branch starts again
                    req.neg_kv, req.neg_length = None, 0
                self._set_embed(req, self._embed(token))
        if audio_rows:
            for req, latent in zip(
                [r for r, _ in audio_rows], self._latents(audio_rows), strict=True
            ):
                results[req.request_id] = ({"latents": latent[None]}, False)
        outputs = []
        for req in reqs:
            payload, done = results[req.request_id]
            if not done and len(req.tokens) >= req.max_frames:
                payload, done = {**payload, "finish_reason": "length"}, True
            if done:
                self.abort(req.request_id)
                payload = {**payload, "prompt_tokens": int(req.prompt["input_ids"].shape[-1]),
                           "completion_tokens": len(req.tokens)}  # (usage: the LM's tokens, audio steps included)
            if payload or done:
                outputs.append(EngineOutput(req.request_id, payload, done))
        return outputs

    def _set_embed(self, req: VibeVoiceRequest, embed: torch.Tensor) -> None:
        if self.static is not None:
            self.static.embeds[req.slot] = embed
        else:
            req.embed = embed

    def _latents(self, rows: list[tuple[VibeVoiceRequest, torch.Tensor]]) -> list[np.ndarray]:
        """Guidance branch, diffusion, codec feedback for the requests making audio; their decoder-space
        latents (float32, on the host)."""
        reqs = [r for r, _ in rows]
        noise = [self._noise(r) for r in reqs]
        for req in reqs:
            req.frames += 1
        if self.static is not None:
            return self._static_latents(reqs, noise)
        kvs = [r.neg_kv or [] for r in reqs]
        neg_hidden, neg_kvs = step_rows(
            self.parts.language_model, kvs, torch.stack([e for _, e in rows])
        )
        for req, kv in zip(reqs, neg_kvs, strict=True):
            req.neg_kv = kv
        pos = torch.stack([r.hidden for r in reqs])
        scale = torch.tensor([self._scale(r) for r in reqs], device=self.device)
        latents = self._denoise(
            torch.stack(noise).to(pos.dtype), pos, neg_hidden, scale[:, None].to(pos.dtype)
        )
        parts = self.parts
        scaled = latents / parts.latent_scaling_factor - parts.latent_bias_factor
        acoustic = parts.multi_modal_projector(latents[:, None])  # [n, 1, hidden]
        for i, req in enumerate(reqs):
            audio = parts.audio_tower.decode(
                scaled[i : i + 1, None], padding_cache=req.acoustic_cache, use_cache=True
            )
            req.acoustic_cache = audio.padding_cache
            sem = parts.semantic_tokenizer_encoder(
                audio.audio, padding_cache=req.semantic_cache, use_cache=True
            )
            req.semantic_cache = sem.padding_cache
            req.embed = (acoustic[i] + parts.semantic_connector(sem.latents[0]))[0]
        return list(scaled.float().cpu().numpy())

    def _static_latents(
        self, reqs: list[VibeVoiceRequest], noise: list[torch.Tensor]
    ) -> list[np.ndarray]:
        """The guidance step and the audio step over every slot; slots not making audio get back what it
        overwrote (their codec caches, their next input)."""
        lm, audio = self.static, self.audio
        lm.step(GUIDE, reqs)
        for req, x in zip(reqs, noise, strict=True):
            audio.noise[req.slot] = x
        making = {r.slot for r in reqs}
        kept = [(r.slot, audio.keep(r.slot)) for r in lm.owners if r.slot not in making]
        scaled = audio.run(lm.batch())
        for slot, saved in kept:
            audio.put_back(slot, saved)
        return list(torch.stack([scaled[r.slot] for r in reqs]).float().cpu().numpy())

    def _scale(self, req: VibeVoiceRequest) -> float:
        return float(req.params.get("guidance_scale") or 1.0)

    def _noise(self, req: VibeVoiceRequest) -> torch.Tensor:
        """A latent's starting noise: from the request's generator, else as `generate` draws it for a
        batch of one (two rows from the global generator, the first used)."""
        if req.generator is not None:
            return torch.randn(self.latent, generator=req.generator, device=self.device)
        return torch.randn(2, self.latent)[0].to(self.device)

    def _denoise(
        self, x: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor, scale: torch.Tensor
    ) -> torch.Tensor:
        head, sched = self.parts.diffusion_head, self.scheduler
        condition = torch.cat([pos, neg])
        sched.set_timesteps(num_inference_steps=self.steps)
        for t in sched.timesteps:
            eps = head(torch.cat([x, x]), t.repeat(2 * x.shape[0]).to(x), condition=condition)
            cond, uncond = eps.chunk(2)
            x = sched.step(uncond + scale * (cond - uncond), t, x).prev_sample
        return x
