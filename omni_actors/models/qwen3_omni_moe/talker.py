"""Talker adapter for HfAREngine: Qwen3-Omni-MoE's talker and its code predictor.

Each engine step samples the first code group of a frame from the talker (the
MoE decoder), then the code predictor (a small dense decoder) draws the other
groups of that frame, batched over all requests of the step, in fixed-shape
passes over a static per-frame cache (predictor.py; a CUDA graph on CUDA). The next talker input is the sum of the frame's code
embeddings plus the next reply token's projected thinker embedding (then
tts-eos, then tts-pad). The talker prompt is built as in
`Qwen3OmniMoeForConditionalGeneration.generate`: the user turns' thinker
states projected (text: embeddings; media: the accepted hidden layer), then
the assistant opening with the codec control codes and the speaker.

Inputs: as qwen2_5_omni/talker.py (ThinkerFeed), optional "speaker".
Outputs per step: {"codes": int64 [1, num_code_groups]}; the stop code is not emitted.
Sampling: "talker_*" request params, as in qwen2_5_omni/talker.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from omni_actors.config.speech import pick_voice
from omni_actors.models.qwen2_5_omni.loading import (
    check_checkpoint,
    load_config,
    load_part,
    load_tensor,
)
from omni_actors.models.qwen2_5_omni.talker import ThinkerFedTalker, ThinkerFeed, talker_sampling
from omni_actors.models.qwen3_omni_moe.predictor import CodePredictorRunner
from omni_actors.workers.engine import timed
from omni_actors.workers.engines.hf_ar_adapter import ARSeq, ForwardOut, StepInputs
from omni_actors.workers.engines.hf_ar_sampling import small_tensor

DEFAULT_SPEAKER = "ethan"
SAMPLING = {
    "temperature": 0.9,
    "top_k": 50,
    "top_p": 1.0,
    "repetition_penalty": 1.05,
    "max_tokens": 4096,
}
"""The talker's sampling defaults (transformers' `generate` defaults for this model)."""


class Qwen3OmniMoeTalkerAdapter(ThinkerFedTalker):
    position_axes = 3

    def load(self) -> torch.nn.Module:
        with timed(self.ctx, "imports"):
            from transformers import Qwen3OmniMoeTalkerForConditionalGeneration
            from transformers.conversion_mapping import (
                get_checkpoint_conversion_mapping,
                register_checkpoint_conversion_mapping,
            )

        # transformers maps per-expert MoE weights onto fused tensors by model type, and
        # the talker has none of its own: give its class the Qwen2-MoE mapping.
        register_checkpoint_conversion_mapping(
            "Qwen3OmniMoeTalkerForConditionalGeneration",
            get_checkpoint_conversion_mapping("qwen2_moe"),
            overwrite=True,
        )
        path = check_checkpoint(self.ctx.model_path, ("config.json",))
        self.config = config = load_config(path, self.ctx)
        self.tc = tc = config.talker_config
        self.model = load_part(
            Qwen3OmniMoeTalkerForConditionalGeneration, path, tc, "talker", self.ctx
        )
        # Multimodal positions read `config.audio_config.n_window`; the talker config need not
        # carry a (typed) audio config, the thinker's always does.
        self.model.config.audio_config = config.thinker_config.audio_config
        table = load_tensor(path, "thinker.model.embed_tokens.weight", self.ctx).to(self.model.dtype)
        self.thinker_embed = torch.nn.Embedding.from_pretrained(table).to(self.ctx.device)
        self.mm_ids = {tc.audio_token_id, tc.image_token_id, tc.video_token_id}
        special = torch.tensor(
            [config.tts_bos_token_id, config.tts_eos_token_id, config.tts_pad_token_id],
            device=self.ctx.device,
        )
        self.tts_bos, self.tts_eos, self.tts_pad = self.model.text_projection(
            self.thinker_embed(special)
        ).unbind(0)
        vocab = tc.text_config.vocab_size
        self.suppress = torch.tensor(
            [i for i in range(vocab - 1024, vocab) if i != tc.codec_eos_token_id],
            device=self.ctx.device,
        )
        self.groups = tc.num_code_groups
        self.predictor = CodePredictorRunner(self.model, self.ctx, self.groups)
        return self.model

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return talker_sampling(self.ctx, params, SAMPLING)

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        names = list(self.tc.speaker_id)
        default = DEFAULT_SPEAKER.lower() if DEFAULT_SPEAKER.lower() in names else sorted(names)[0]
        speaker = pick_voice(seq.params, inputs, sorted(names), default)
        feed = ThinkerFeed()
        feed.take(inputs)
        feed.done = not seq.streaming
        seq.data = {"feed": feed, "speaker": self.tc.speaker_id[speaker], "frame": None}

    def known(self, feed: ThinkerFeed) -> int:
        """Reply tokens whose text the talker can read now. This talker reads a reply token's
        thinker input embedding only, from its own copy of the table, so a token is known as soon as
        it is sampled, a thinker step before its states come (`fed`): every sampled id, but the last
        once the thinker is done (its stop token, or the one max_tokens cut off, which the thinker
        never fed and `fed` never counted). The same rows, one thinker step sooner."""
        return len(feed.token_ids) - (1 if feed.done else 0)

    def _reply(self, feed: ThinkerFeed, i: int) -> torch.Tensor:
        """Reply token i's thinker input embedding ([1, hidden], the talker's dtype)."""
        return self.thinker_embed(small_tensor([feed.token_ids[i]], self.ctx.device))

    def _trailing(self, feed: ThinkerFeed, k: int) -> torch.Tensor:
        """Text for decode step k: reply token k + 1, then tts-eos, then tts-pad."""
        known = self.known(feed)
        if k + 1 < known:
            return self.model.text_projection(self._reply(feed, k + 1))[0]
        return self.tts_eos if k + 1 == max(known, 1) else self.tts_pad

    def prefill(self, seq: ARSeq) -> StepInputs:
        feed: ThinkerFeed = seq.data["feed"]
        dev, dt = self.ctx.device, self.model.dtype
        ids = feed.prompt_ids
        embeds = feed.prompt_embeds.to(dev, dt)
        hidden = feed.prompt_hidden.to(dev, dt)
        starts = [i for i, t in enumerate(ids) if t == self.config.im_start_token_id]
        user: list[torch.Tensor] = []
        user_ids: list[int] = []
        for n, s in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(ids)
            if s + 1 < len(ids) and ids[s + 1] == self.config.user_token_id:
                user_ids.extend(ids[s:end])
                for i in range(s, end):
                    if ids[i] in self.mm_ids:
                        user.append(self.model.hidden_projection(hidden[i : i + 1])[0])
                    else:
                        user.append(self.model.text_projection(embeds[i : i + 1])[0])
        opening = [
            i for i in starts if i + 1 < len(ids) and ids[i + 1] == self.config.assistant_token_id
        ]
        if not opening:
            raise ValueError("the thinker prompt has no '<|im_start|>assistant' turn")
        a = opening[-1]
        head = self.model.text_projection(embeds[a : a + 3])
        first_text = self.model.text_projection(self._reply(feed, 0))[0] if self.known(feed) else self.tts_eos
        text = torch.cat([head, self.tts_pad.expand(4, -1), self.tts_bos[None], first_text[None]])
        tc = self.tc
        control = torch.tensor(
            [tc.codec_nothink_id, tc.codec_think_bos_id, tc.codec_think_eos_id,
             seq.data["speaker"], tc.codec_pad_id, tc.codec_bos_id],
            device=dev,
        )  # fmt: skip
        codec = torch.cat(
            [text.new_zeros(3, text.shape[-1]), self.model.get_input_embeddings()(control)]
        )
        rows = torch.cat([torch.stack(user) if user else text[:0], text + codec])
        if not feed.meta:
            return StepInputs(rows)  # text only: positions 0, 1, ...
        # Media in the user turns: multimodal rotary positions, as the thinker had them.
        talker_ids = torch.tensor(
            [[*user_ids, *[self.config.tts_pad_token_id] * len(text)]], device=dev
        )
        positions, deltas = self.model.get_rope_index(
            talker_ids, _on(feed.meta.get("image_grid_thw"), dev), None, torch.ones_like(talker_ids), False,
            _on(feed.meta.get("audio_feature_lengths"), dev), None,
        )  # fmt: skip
        return StepInputs(rows, positions[:, 0], talker_ids.shape[1] + int(deltas.reshape(-1)[0]))

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        rows = [s.data["frame"] + self._trailing(s.data["feed"], len(s.tokens) - 1) for s in seqs]
        return torch.stack(rows)[:, None]

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        out = self.model.model(
            inputs_embeds=embeds, position_ids=positions, attention_mask=mask,
            past_key_values=cache, use_cache=True,
        )  # fmt: skip
        last = out.last_hidden_state[:, -1]
        return ForwardOut(self.model.codec_head(last).float(), last)

    def process_logits(self, seqs: list[ARSeq], logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[:, self.suppress] = float("-inf")
        return logits

    def on_tokens(self, seqs, tokens, out, prefill):
        return self.on_device_tokens(seqs, small_tensor(tokens, self.ctx.device), out, prefill)[1]

    def on_device_tokens(self, seqs, ids, out, prefill):
        """Code group 0 stays on the device: the predictor's frame is queued behind the talker's step
        and its sampling, for every row (a row that drew the end code finishes and its frame is
        dropped), and the host waits once, for all the frames' codes."""
        sampled = [float(s.params.get("temperature", 0.0) or 0.0) > 0 for s in seqs]
        frames, codes = self.predictor.run(out.hidden, ids, sampled, [s.generator for s in seqs])
        host = codes.cpu().numpy().astype(np.int64)
        stop = self.tc.codec_eos_token_id
        results: list[tuple[dict[str, Any], bool]] = []
        for i, seq in enumerate(seqs):
            if host[i, 0] == stop and not seq.params.get("ignore_eos"):
                results.append(({}, True))
                continue
            seq.data["frame"] = frames[i]
            results.append(({"codes": host[i : i + 1]}, False))
        return host[:, 0].tolist(), results


def _on(x: torch.Tensor | None, device: Any) -> torch.Tensor | None:
    return None if x is None else x.to(device)
