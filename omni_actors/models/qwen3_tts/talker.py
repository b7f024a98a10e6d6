"""Talker adapter for HfAREngine: Qwen3-TTS's talker and code predictor (modules.py), one codec frame per step.

Each engine step the talker's `codec_head` gives code group 0 of the next frame;
the code predictor draws the other groups, batched over the step's requests
(qwen3_omni_moe/predictor.py's fixed-shape passes, a CUDA graph on CUDA). The
next talker input is the sum of the frame's code embeddings plus the next text
row (below), then tts-eos, then tts-pad.

Prompt, as the checkpoint was trained (text embedded by the talker's own table
and projected, `T(.)`; codec ids embedded by its codec table, `C(.)`):
  [T(<|im_start|>user\\n{instructions}<|im_end|>\\n)]          (a style prompt, optional)
  T(<|im_start|>assistant\\n)
  tts-pad rows + tts-bos, each added to C(control codes): (nothink | think, language),
      think-bos, think-eos, the speaker's id (CustomVoice), pad
  T(first text token) + C(bos)
and the remaining text tokens are fed one per step while the frames come.
A named speaker with a dialect (`spk_is_dialect`) selects that dialect's
language code, as the original does when the language is automatic.

Base checkpoints (a `speaker_encoder`) clone a custom voice's clip (clone.py), as
the original's voice-clone prompt in its streaming text mode:
  - the clip's speaker embedding is the speaker row (where a named speaker's code goes);
  - with the clip's transcript (in-context mode), the rows after the tts-bos row add
    T(transcript tokens, text tokens, tts-eos) to C(bos), then one row per clip frame
    (the sum of its code groups' embeddings: the talker's codec table for group 0, the
    code predictor's `codec_embedding` for the others), position by position; text
    rows left over are fed one per step, a shorter text is padded with tts-pad. The
    clip's codes go with the first frame to the codec stage ("context_codes"), which
    decodes them as left context and sends none of their audio;
  - without a transcript only the speaker row clones (the original's x-vector-only mode)
    and the text follows as for a named speaker.
A Base checkpoint speaks only in a custom voice and takes no instructions (the
original's voice-clone call has neither a speaker nor an instruct text).

Inputs: {"text": str, "voice": a speaker name (CustomVoice), optional
"instructions": str; Base: "reference_audio" float32 [samples] at 24 kHz,
"reference_text": str or None, and "reference_id" (the custom voice's id, part of the
key under which clone.py's ClonePrompts keeps the voice's encoded clip)}. Outputs per step: {"codes": int64 [1, num_code_groups]},
the first also {"context_codes": int64 [clip frames, groups]} in in-context mode;
the stop code ends the request and is not emitted. Usage: prompt_tokens are the
prefill's rows plus the text rows fed after it (the whole text counts, whatever
its length), completion_tokens the steps (a code frame each, and the stop code). Sampling: generation_config.json
(temperature, top_k, top_p, repetition_penalty, max_new_tokens) < deploy
defaults < request params; the code predictor takes the file's subtalker_dosample /
top_k / top_p / temperature (a request's temperature is the talker's only, as in
the original), drawing from the request's seeded generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_actors.models.qwen3_omni_moe.predictor import CodePredictorRunner
from omni_actors.models.qwen3_tts import VOICES
from omni_actors.models.qwen3_tts.clone import (
    CLONE_CACHE_SIZE,
    CloneEncoder,
    ClonePrompts,
)
from omni_actors.models.qwen3_tts.modules import load_talker
from omni_actors.workers.engines.hf_ar_adapter import (
    ARAdapter,
    ARSeq,
    ForwardOut,
    StepInputs,
    check_checkpoint,
)
from omni_actors.workers.engines.hf_ar_sampling import small_tensor

SHARED_KEYS = ("seed", "temperature", "top_k", "top_p", "max_tokens", "repetition_penalty")
DEFAULT_MAX_FRAMES = 4096


class _Runner(CodePredictorRunner):
    """The Omni predictor passes; the talker state row is the talker's width (the predictor projects it)."""

    fused_default = False
    """Its compiled passes drew other codes than the transformers passes in the one CUDA check
    (2026-12-02, float32, not diagnosed; equal on CPU): opt-in (depth_passes) until found."""

    def __init__(self, talker: Any, ctx: Any, groups: int, width: int, gen: dict[str, Any]) -> None:
        super().__init__(
            talker, ctx, groups, top_k=int(gen.get("subtalker_top_k", 50)),
            top_p=float(gen.get("subtalker_top_p", 1.0)), temperature=float(gen.get("subtalker_temperature", 0.9)),
            width=width,
        )  # fmt: skip


class Qwen3TTSTalkerAdapter(ARAdapter):
    def load(self) -> torch.nn.Module:
        import json

        from transformers import AutoTokenizer

        path = check_checkpoint(self.ctx.model_path, ("config.json", "tokenizer_config.json"))
        self.model, spk_encoder, config = load_talker(path, self.ctx.device, self.load_dtype())
        self.clone = None if spk_encoder is None else CloneEncoder(path, spk_encoder, self.ctx.device)
        size = int(self.ctx.engine_extras.get("clone_cache_size", CLONE_CACHE_SIZE))
        self.clone_prompts = None if self.clone is None else ClonePrompts(self.clone, size)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
        except Exception as err:
            raise ValueError(f"{path}: cannot load the tokenizer ({err})") from err
        self.tc = tc = config["talker_config"]
        self.speakers = {k.lower(): _one(v) for k, v in (tc.get("spk_id") or {}).items()}
        self.dialects = {k.lower(): v for k, v in (tc.get("spk_is_dialect") or {}).items()}
        self.languages = {
            k.lower(): _one(v) for k, v in (tc.get("codec_language_id") or {}).items()
        }
        self.groups = tc["num_code_groups"]
        self.codes = tc["code_predictor_config"]["vocab_size"]
        self.eos = tc["codec_eos_token_id"]
        dev = self.ctx.device
        special = torch.tensor(
            [config["tts_bos_token_id"], config["tts_eos_token_id"], config["tts_pad_token_id"]]
        )
        with torch.inference_mode():
            self.tts_bos, self.tts_eos, self.tts_pad = self.model.text(special.to(dev)).unbind(0)
        vocab = tc["vocab_size"]
        # The original suppresses the top 1024 ids (control codes) but the stop code: the ids past the codebook.
        self.suppress = torch.tensor(
            [i for i in range(self.codes, vocab) if i != self.eos], device=dev
        )
        gen_file = path / "generation_config.json"
        gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
        self.defaults = {
            "temperature": gen.get("temperature", 0.9) if gen.get("do_sample", True) else 0.0,
            "top_k": gen.get("top_k", 50), "top_p": gen.get("top_p", 1.0),
            "repetition_penalty": gen.get("repetition_penalty", 1.05),
            "max_tokens": gen.get("max_new_tokens") or DEFAULT_MAX_FRAMES,
        }  # fmt: skip
        self.predictor = _Runner(self.model, self.ctx, self.groups, tc["hidden_size"], gen)
        self.sub_sample = bool(gen.get("subtalker_dosample", True))
        return self.model

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        own = {k: params[k] for k in SHARED_KEYS if params.get(k) is not None}
        ctx = self.ctx
        return {**self.defaults, **ctx.default_sampling_params, **own, **ctx.sampling_constraints}

    # ---- prompt ----------------------------------------------------------------

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        text = inputs.get("text")
        if not isinstance(text, str) or not text.strip():
            raise ValueError("qwen3_tts: inputs need a non-empty 'text'")
        ref = inputs.get("reference_audio")
        if self.clone is not None:
            if ref is None:
                raise ValueError("qwen3_tts: a Base checkpoint speaks only in a custom voice (reference_audio)")
            if inputs.get("instructions"):
                raise ValueError("qwen3_tts: a Base checkpoint takes no instructions")
            audio = np.array(ref, dtype=np.float32).reshape(-1)
            self.clone.check(audio.size, str(inputs.get("reference_id") or ""))
            said = str(inputs.get("reference_text") or "").strip()
            seq.data = {
                "text": text, "voice": "", "instructions": None, "frame": None, "trailing": None,
                "ref_audio": audio, "ref_text": said, "context": None,
                "ref_key": ClonePrompts.key(str(inputs.get("reference_id") or ""), audio, said),
            }  # fmt: skip
            return
        if ref is not None:
            raise ValueError("qwen3_tts: only Base checkpoints speak in a custom voice")
        voice = str(
            inputs.get("voice") or (next(iter(self.speakers), "") if self.speakers else "")
        ).lower()
        if self.speakers and voice not in self.speakers:
            raise ValueError(f"qwen3_tts: unknown voice {voice!r}; known: {sorted(self.speakers)}")
        instructions = inputs.get("instructions")
        seq.data = {
            "text": text, "voice": voice if self.speakers else "", "frame": None,
            "instructions": str(instructions) if instructions else None, "trailing": None,
            "ref_audio": None, "context": None,
        }  # fmt: skip

    def _ids(self, text: str) -> torch.Tensor:
        return torch.tensor(
            self.tokenizer(text, add_special_tokens=False).input_ids, device=self.ctx.device
        )

    def prefill(self, seq: ARSeq) -> StepInputs:
        d, tc, m = seq.data, self.tc, self.model
        parts = []
        if d["instructions"]:
            parts.append(m.text(self._ids(f"<|im_start|>user\n{d['instructions']}<|im_end|>\n")))
        parts.append(m.text(self._ids("<|im_start|>assistant\n")))
        text = self._ids(d["text"])
        if text.numel() == 0:
            raise ValueError("qwen3_tts: the text has no tokens")
        language = self.languages.get(self.dialects.get(d["voice"]) or "") if d["voice"] else None
        head = [tc["codec_nothink_id"], tc["codec_think_bos_id"], tc["codec_think_eos_id"]]
        if language is not None:
            head = [
                tc["codec_think_id"],
                tc["codec_think_bos_id"],
                language,
                tc["codec_think_eos_id"],
            ]
        if d["voice"]:
            head.append(self.speakers[d["voice"]])
        embed = m.get_input_embeddings()
        dev = self.ctx.device
        codec = embed(torch.tensor([*head, tc["codec_pad_id"], tc["codec_bos_id"]], device=dev))
        ref = None
        if d["ref_audio"] is not None:  # the clip's speaker embedding in the speaker's place
            cached = self.clone_prompts
            row, ref = cached.parts(d["ref_key"], d["ref_audio"], m.dtype, bool(d["ref_text"]))
            codec = torch.cat([codec[: len(head)], row.to(codec.dtype)[None], codec[len(head) :]])
        pads = self.tts_pad.expand(codec.shape[0] - 2, -1)
        parts.append(torch.cat([pads, self.tts_bos[None]]) + codec[:-1])
        if d["ref_audio"] is not None and d["ref_text"]:
            rows, d["trailing"] = self._in_context(d, text, codec[-1:], ref)
            parts.append(rows)
        else:
            rows = m.text(text)
            parts.append(rows[:1] + codec[-1:])
            d["trailing"] = torch.cat([rows[1:], self.tts_eos[None]])
        return StepInputs(torch.cat(parts).to(m.dtype))

    def _in_context(
        self, d: dict[str, Any], text: torch.Tensor, bos: torch.Tensor, ref: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """In-context cloning: the clip's transcript then the text, over codec-bos and the clip's frames.

        Text rows (transcript + text + tts-eos) and codec rows (bos + one summed row per clip frame)
        are added position by position; the longer text's rest is fed one row per step, a shorter
        one is padded with tts-pad. The clip's codes (ref [frames, groups]) go to the codec stage as
        left context."""
        m = self.model
        d["context"] = ref.cpu().numpy().astype(np.int64)
        ref = ref.to(self.ctx.device)
        tables = [m.get_input_embeddings(), *m.code_predictor.get_input_embeddings()]
        frames = sum(tables[g](ref[:, g]) for g in range(self.groups))
        codec = torch.cat([bos, frames])
        texts = torch.cat([m.text(torch.cat([self._ids(d["ref_text"]), text])), self.tts_eos[None]])
        n = codec.shape[0]
        if texts.shape[0] > n:
            return texts[:n] + codec, texts[n:]
        pad = self.tts_pad.expand(n - texts.shape[0], -1)
        return torch.cat([texts, pad]) + codec, texts[:0]

    def _trailing(self, seq: ARSeq) -> torch.Tensor:
        rows, k = seq.data["trailing"], len(seq.tokens) - 1
        return rows[k] if k < rows.shape[0] else self.tts_pad

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        return torch.stack([s.data["frame"] + self._trailing(s) for s in seqs])[:, None]

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        out = self.model.model(
            inputs_embeds=embeds, position_ids=positions[0], attention_mask=mask,
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        last = out.last_hidden_state[:, -1]
        return ForwardOut(self.model.codec_head(last).float(), last)

    def process_logits(self, seqs: list[ARSeq], logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[:, self.suppress] = float("-inf")
        return logits

    # ---- code predictor ----------------------------------------------------------

    def on_tokens(self, seqs, tokens, out, prefill):
        if prefill:  # the usage's prompt: the prefill's rows and the text rows fed one per step after it
            for seq in seqs:  # (before 2026-12-05 only the prefill's rows: a constant for a named speaker)
                seq.prompt_len += seq.data["trailing"].shape[0]
        live = [i for i, t in enumerate(tokens) if t != self.eos]
        results: list[tuple[dict[str, Any], bool]] = [({}, True) for _ in seqs]
        if live:
            # As the original: the predictor samples by subtalker_dosample, whatever the talker's temperature.
            sampled = [self.sub_sample] * len(live)
            first = small_tensor([tokens[i] for i in live], self.ctx.device)
            frames, codes = self.predictor.run(
                out.hidden[live], first, sampled, [seqs[i].generator for i in live]
            )
            host = codes.cpu().numpy().astype(np.int64)
            for j, i in enumerate(live):
                d = seqs[i].data
                d["frame"] = frames[j]
                results[i] = ({"codes": host[j : j + 1]}, False)
                if d["context"] is not None:  # with the first frame: the clip the talker continues
                    results[i][0]["context_codes"], d["context"] = d["context"], None
        return results


def _one(value: Any) -> int:
    """Config ids are ints, or one-element lists in some checkpoints."""
    return int(value[0] if isinstance(value, list) else value)


__all__ = ["VOICES", "Qwen3TTSTalkerAdapter"]
