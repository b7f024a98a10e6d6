"""LM adapter for HfAREngine: Higgs-Audio-V2's dual-FFN Llama drawing 8 delayed codebooks a step.

Prompt (prompt.py): the chat rendered by the checkpoint's template; text positions take
the text embeddings, the positions of a reference clip's delayed block (and each later
step) the sum of their codebooks' audio embeddings. The decoder layers route text
positions through the text FFN and audio positions through the audio FFN; this adapter
runs transformers' own layers with that mask given explicitly (`audio_token_mask`: the
prompt's audio and delay ids; None on decode steps, which are all audio, as in
transformers' generation).

Each step the audio head gives [8, codebook_size] logits; the adapter draws every codebook
itself (`draw`: sampler.py, all rows and codebooks on the device at once, with the delay
pattern's masks, delay.py, and counter-based noise, so a seeded request stays reproducible
alone or batched). Each complete frame goes downstream; the first step that is all
stream-eos ends the request.

Inputs: {"text": str, "voice": "default" | "SPEAKER0" | "SPEAKER1", optional "instructions"
(the scene description), "reference_audio" float32 [samples] at 24 kHz, "reference_text",
"reference_id"}. Outputs per frame: {"codes": int64 [1, 8]}. Sampling: the checkpoint's
generation_config (temperature, top_k, top_p, max_new_tokens: steps) < deploy defaults <
request params; repetition-aware sampling (ras.py) when the generation config sets it.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from typing import Any

import numpy as np
import torch

from omni_actors.config.speech import text_and_voice
from omni_actors.models.higgs_audio_v2.codec_loading import load_tokenizer, resample
from omni_actors.models.higgs_audio_v2.delay import DelayState
from omni_actors.models.higgs_audio_v2.prompt import (
    VOICES,
    conversation,
    delayed,
    expand_ids,
    spoken,
)
from omni_actors.models.higgs_audio_v2.ras import EMPTY, ras_settings
from omni_actors.models.higgs_audio_v2.sampler import FrameSampler, row_values
from omni_actors.workers.engine import merge_params
from omni_actors.workers.engines.counter_noise import noise_key
from omni_actors.workers.engines.hf_ar_adapter import (
    ARAdapter,
    ARSeq,
    ForwardOut,
    StepInputs,
    check_checkpoint,
)
from omni_actors.workers.engines.hf_ar_graphs import cuda_graphs_wanted

DEFAULT_MAX_STEPS = 2048
"""Steps (25 a second, the first 8 the delay's ramp) when generation_config sets no max_new_tokens."""
CLIP_CACHE_SIZE = 32
"""Custom voices whose clip codes a worker keeps (keyed by voice id and a digest of clip and transcript)."""
CLIP_RATE = 24000
"""The rate of "reference_audio" (the pipeline's SpeechSpec.sample_rate)."""
MIN_CLIP_SAMPLES = 960
"""Shortest reference clip (at CLIP_RATE): one code frame, 40 ms. The audio tokenizer's semantic
model (HuBERT's convolutions: 400 samples at 16 kHz, the clip padded by 160 each side) fails on
less than ~120 samples with a RuntimeError, which was a 500 at the speech API."""
SHARED_KEYS = ("seed", "temperature", "top_k", "top_p", "max_tokens")


class Drawn:
    """A step's draw queued on the device (`HiggsLMAdapter.queue_draw`): its codes, frames and
    ranked width, and its codes' copy to the host (marked by an event on CUDA)."""

    def __init__(self, codes: torch.Tensor, frames: torch.Tensor, width: int) -> None:
        self.codes, self.frames, self.width = codes, frames, width
        self.host = codes.to("cpu", non_blocking=True)
        self.done = None
        if codes.is_cuda:
            self.done = torch.cuda.Event()
            self.done.record()

    def wait(self) -> np.ndarray:
        """[rows, groups] codes on the host."""
        if self.done is not None:
            self.done.synchronize()
        return self.host.numpy()


class HiggsLMAdapter(ARAdapter):
    batch_prefill = True
    """New prompts share one left-padded prefill; their per-position audio masks (`extra`) are
    padded and stacked by `batch_extra`."""
    graph_prefill = {"text_only": True}
    warm_graphs = True
    """Plain prompts (the text path alone) run bucketed, replayed as CUDA graphs (hf_ar_prefill.py)."""

    def load(self) -> torch.nn.Module:
        from transformers import AutoTokenizer, HiggsAudioV2ForConditionalGeneration

        path = check_checkpoint(self.ctx.model_path, ("config.json", "tokenizer_config.json"))
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            model = HiggsAudioV2ForConditionalGeneration.from_pretrained(path, dtype=self.load_dtype())
        except Exception as err:
            raise ValueError(f"{path}: cannot load the Higgs-Audio-V2 checkpoint ({err})") from err
        self.path = path
        self.model = model.to(self.ctx.device).eval()
        cfg = self.model.config
        self.groups, self.vocab = cfg.num_codebooks, cfg.codebook_size
        self.bos, self.eos = cfg.audio_stream_bos_id, cfg.audio_stream_eos_id
        self.audio_id, self.delay_id, self.start_id = cfg.audio_token_id, cfg.audio_delay_token_id, cfg.audio_bos_token_id
        template = self.tokenizer.chat_template
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text()
        if template is None:
            raise FileNotFoundError(f"{path / 'chat_template.jinja'}: the checkpoint has no chat template")
        self.template = template
        gen = self.model.generation_config
        self.defaults = {
            "temperature": gen.temperature if gen.do_sample else 0.0, "top_k": gen.top_k,
            "top_p": gen.top_p, "max_tokens": gen.max_new_tokens or DEFAULT_MAX_STEPS,
        }  # fmt: skip
        self.ras = ras_settings(gen)
        self.codec: Any = None  # the audio tokenizer's encoder: loaded for the first clip to clone
        self.clips: OrderedDict[tuple[str, bytes], np.ndarray] = OrderedDict()
        self.sampler = self._sampler()
        return self.model

    @torch.inference_mode()  # as in a step (the engine's buffers are inference tensors)
    def _sampler(self) -> FrameSampler:
        """The step sampler, its graphs captured now for the defaults' width (on CUDA)."""
        inner, dtype = self.model.model, self.model.dtype
        graphs = cuda_graphs_wanted(self.ctx)
        sampler = FrameSampler(
            groups=self.groups, vocab=self.vocab, bos=self.bos, eos=self.eos, ras=self.ras,
            embed=lambda codes: inner.embed_audio_tokens(codes[:, None])[:, 0].to(dtype),
            device=torch.device(self.ctx.device), graphs=graphs, max_rows=self.ctx.max_num_seqs,
        )  # fmt: skip
        if graphs:
            d = self.defaults
            sampler.warm(sampler.width([(d["temperature"], int(d["top_k"] or 0), 1.0)] if d["temperature"] else []))
        return sampler

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return merge_params(self.ctx, params, SHARED_KEYS, self.defaults)

    # ---- prompt ----------------------------------------------------------------

    def warmup_inputs(self) -> dict[str, Any]:
        return {"text": "Hello.", "voice": VOICES[0]}

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        text, voice = text_and_voice(inputs, "higgs_audio_v2", VOICES)
        ref = inputs.get("reference_audio")
        clip = None if ref is None else np.array(ref, dtype=np.float32).reshape(-1)
        if clip is not None and 0 < clip.size < MIN_CLIP_SAMPLES:
            voice_id = str(inputs.get("reference_id") or "")
            which = f"custom voice {voice_id!r}" if voice_id else "the custom voice"
            raise ValueError(f"voice: the clip of {which} is too short ({clip.size} samples at 24 kHz, "
                             f"{MIN_CLIP_SAMPLES} needed); make the voice again from a longer sample")
        seq.data = {
            "text": spoken(text.strip(), voice), "scene": inputs.get("instructions") or None,
            "ref_audio": clip,
            "ref_text": str(inputs.get("reference_text") or ""), "ref_id": str(inputs.get("reference_id") or ""),
            "state": DelayState(self.groups, self.bos, self.eos), "frame": None, "key": noise_key(seq.params.get("seed")),
            "window": deque(maxlen=self.ras[0] if self.ras else 1),
        }  # fmt: skip

    def _clip_steps(self, d: dict[str, Any]) -> np.ndarray:
        """The reference clip's delayed block [steps, groups], encoded once per voice (LRU)."""
        audio = d["ref_audio"]
        digest = hashlib.blake2b(audio.tobytes(), digest_size=16)
        digest.update(b"\0" + d["ref_text"].encode())
        key = (d["ref_id"], digest.digest())
        if key in self.clips:
            self.clips.move_to_end(key)
            return self.clips[key]
        if self.codec is None:
            self.codec = load_tokenizer(self.path, self.ctx.device)
        with torch.inference_mode():
            wave = torch.from_numpy(audio).to(self.ctx.device)[None, None]
            rate = int(self.codec.config.sample_rate)
            if rate != CLIP_RATE:  # the API sends clips at the pipeline's rate
                wave = resample(wave, CLIP_RATE, rate)
            codes = self.codec.encode(wave, return_dict=False)[0].cpu().numpy()  # [groups, T]
        steps = delayed(codes[: self.groups], self.bos, self.eos)
        self.clips[key] = steps
        while len(self.clips) > CLIP_CACHE_SIZE:
            self.clips.popitem(last=False)
        return steps

    def prefill(self, seq: ARSeq) -> StepInputs:
        d = seq.data
        cloning = d["ref_audio"] is not None and d["ref_audio"].size > 0
        chat = conversation(d["text"], d["scene"], d["ref_text"] if cloning else None)
        rendered = self.tokenizer.apply_chat_template(
            chat, chat_template=self.template, tokenize=False, add_generation_prompt=True
        )
        ids = self.tokenizer(rendered, add_special_tokens=False).input_ids
        if not ids or ids[-1] != self.start_id:
            ids.append(self.start_id)
        blocks = [self._clip_steps(d)] if cloning else []
        if blocks:  # RAS looks back into the clip's steps too
            d["window"].extend(blocks[-1][-d["window"].maxlen :])
        ids = expand_ids(ids, self.audio_id, self.delay_id, [len(b) for b in blocks], self.groups)
        dev = self.ctx.device
        inner = self.model.model
        id_tensor = torch.tensor(ids, device=dev)
        embeds = inner.embed_tokens(id_tensor)
        if self.audio_id not in ids and self.delay_id not in ids:
            # no audio position (no clip to clone: a clip's block expands into them): the text path alone
            return StepInputs(embeds, extra={"text_only": True, "length": len(ids)})
        audio = (id_tensor == self.audio_id) | (id_tensor == self.delay_id)
        if blocks:
            codes = torch.from_numpy(np.concatenate(blocks)).to(dev)
            embeds = embeds.masked_scatter(audio[:, None], inner.embed_audio_tokens(codes).to(embeds.dtype))
        return StepInputs(embeds, extra={"audio_mask": audio[None]})

    def batch_extra(self, extras: list[dict[str, Any]], pads: list[int]) -> dict[str, Any]:
        """[batch, longest] audio masks, each row's left padding False (text FFN, masked out anyway);
        text alone when no row has an audio position."""
        if all(e.get("text_only") for e in extras):
            return {"text_only": True}
        dev = next(e["audio_mask"].device for e in extras if "audio_mask" in e)
        masks = [e["audio_mask"] if "audio_mask" in e else torch.zeros(1, e["length"], dtype=torch.bool, device=dev)
                 for e in extras]  # fmt: skip
        rows = [torch.nn.functional.pad(m, (pad, 0), value=False) for m, pad in zip(masks, pads, strict=True)]
        return {"audio_mask": torch.cat(rows)}

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        return torch.stack([s.data["frame"] for s in seqs])[:, None]

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        from transformers.masking_utils import create_causal_mask

        inner = self.model.model
        pos = positions[0]
        causal = create_causal_mask(
            config=inner.config, inputs_embeds=embeds, attention_mask=mask, past_key_values=cache, position_ids=pos,
        )  # fmt: skip
        rope = inner.rotary_emb(embeds, pos)
        hidden = embeds
        audio = extra.get("audio_mask")
        for layer in inner.layers:
            if extra.get("text_only"):
                hidden = _text_layer(layer, hidden, rope, causal, pos, cache)
            elif audio is None:  # a decode step: every position is audio (the layer's own path)
                hidden = layer(
                    hidden, position_embeddings=rope, attention_mask=causal, position_ids=pos,
                    past_key_values=cache, use_cache=True,
                )  # fmt: skip
            else:
                hidden = _mixed_layer(layer, hidden, audio[..., None], rope, causal, pos, cache)
        last = inner.norm(hidden[:, -1])
        return ForwardOut(self.model.audio_lm_head(last), None)

    def fused_model(self) -> Any:
        """A decode step feeds audio frames only, and with no audio mask every layer takes its
        audio norms and audio FFN: a Llama layer with those weights (engine_extras.fused_decode)."""
        from omni_actors.workers.engines.hf_ar_fused import FusedModel

        inner = self.model.model
        return FusedModel(
            inner.config, inner, None, self.model.audio_lm_head, kind="llama",
            layer_parts=("audio_input_layernorm", "audio_post_attention_layernorm", "audio_mlp"),
        )  # fmt: skip

    # ---- codebooks ---------------------------------------------------------------

    draws_ahead = True

    def draw(self, seqs, out, prefill):
        """Every codebook of the step drawn on the device (sampler.py); one sync brings the frame back."""
        return self.take_draw(seqs, self.queue_draw(seqs, out, None))

    def queue_draw(self, seqs: list[ARSeq], out: ForwardOut, before: Drawn | None) -> Drawn:
        if before is not None:  # the rows' state is on the device (write_next)
            codes, frames, width = self.sampler.draw(out.logits, None, None, None, before.width)
            return Drawn(codes, frames, width)
        n, window = len(seqs), self.ras[0] if self.ras else 0
        rows = [row_values(s.data["state"], s.params, s.data["key"]) for s in seqs]
        windows = None
        if window:  # RAS looks at each row's last `window` steps
            windows = np.full((n, window, self.groups), EMPTY, dtype=np.int64)
            for i, seq in enumerate(seqs):
                if past := seq.data["window"]:
                    windows[i, window - len(past) :] = np.stack(past)
        ints = np.array([r[0] for r in rows], dtype=np.int64)
        codes, frames, width = self.sampler.draw(out.logits, ints, np.array([r[1] for r in rows], dtype=np.float32), windows)
        return Drawn(codes, frames, width)

    def write_next(self, slots, rows, drawn: Drawn) -> None:
        slots.embeds[rows] = drawn.frames[:, None].to(slots.embeds.dtype)
        self.sampler.advance(drawn.codes)

    def take_draw(self, seqs, drawn: Drawn):
        host = drawn.wait()
        results = []
        for i, seq in enumerate(seqs):
            frame, done = seq.data["state"].push(host[i])
            seq.data["window"].append(host[i])
            seq.data["frame"] = drawn.frames[i]
            results.append(({} if frame is None else {"codes": frame[None]}, done))
        return host[:, 0].tolist(), results

    def on_tokens(self, seqs, tokens, out, prefill):
        raise RuntimeError("Higgs-Audio-V2 draws its steps itself (draw); on_tokens is never called")


def _text_layer(layer, hidden, rope, causal, pos, cache) -> torch.Tensor:
    """One decoder layer over a prompt of text positions only: `_mixed_layer` with no audio position,
    without its audio norms and FFN (half a prefill's FFN work and launches)."""
    attended, _ = layer.self_attn(
        hidden_states=layer.input_layernorm(hidden), attention_mask=causal, position_ids=pos, past_key_values=cache,
        use_cache=True, position_embeddings=rope,
    )  # fmt: skip
    hidden = hidden + attended
    return hidden + layer.mlp(layer.post_attention_layernorm(hidden))


def _mixed_layer(layer, hidden, audio, rope, causal, pos, cache) -> torch.Tensor:
    """One decoder layer over a prompt of text and audio positions (`audio` [batch, n, 1] True at
    audio ones): the maths of transformers' layer given an `audio_token_mask`, each norm and FFN
    run on every position and the right one kept per position, where the layer gathers and
    scatters by the mask (a boolean index is a host sync: six a layer made a prefill wait on the
    device ~170 times)."""
    normed = torch.where(audio, layer.audio_input_layernorm(hidden), layer.input_layernorm(hidden))
    attended, _ = layer.self_attn(
        hidden_states=normed, attention_mask=causal, position_ids=pos, past_key_values=cache, use_cache=True,
        position_embeddings=rope,
    )  # fmt: skip
    hidden = hidden + attended
    text = layer.mlp(layer.post_attention_layernorm(hidden))
    speech = layer.audio_mlp(layer.audio_post_attention_layernorm(hidden))
    return hidden + torch.where(audio, speech, text)
