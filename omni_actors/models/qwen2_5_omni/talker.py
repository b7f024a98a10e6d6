"""Talker adapter for HfAREngine: Qwen2.5-Omni's codec LM, fed by the thinker's states.

The talker's prompt is the thinker's prompt (per position: last-layer hidden
state + input embedding, media positions' embeddings zeroed), the speaker's
text-bos embedding and the first reply token; each decode step then adds the
next reply token's (hidden + embedding) to the embedding of the code it just
sampled, then the thinker's text-eos embedding, then text-pad for ever. This
is `Qwen2_5OmniForConditionalGeneration.generate`, split into steps.

Inputs (full payload, or streamed in deltas through `feed`): the thinker
stage's outputs, "prompt_token_ids", "prompt_embeds", "prompt_hidden",
"token_ids", "embeds", "hidden" (see thinker.py), optional "speaker" (or the API's "voice": a
speaker's name or an OpenAI voice name, config/speech.py's pick_voice).
The thinker's token-embedding table is read from the checkpoint (one tensor),
so special embeddings need no thinker in this worker.

Outputs per step: {"codes": int64 [1]}; the stop code is not emitted.
Sampling: "talker_*" request params (e.g. talker_temperature, talker_max_tokens)
over this model's defaults; the text's sampling params do not apply here.
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
from omni_actors.workers.engine import timed
from omni_actors.workers.engines.hf_ar import ARAdapter, ARSeq, ForwardOut, StepInputs
from omni_actors.workers.engines.hf_ar_sampling import small_tensor

DEFAULT_SPEAKER = "Chelsie"
SAMPLING = {
    "temperature": 0.9,
    "top_k": 40,
    "top_p": 0.8,
    "repetition_penalty": 1.05,
    "max_tokens": 4096,
}
"""The talker's sampling defaults (transformers' `generate` defaults for this model)."""
SHARED_KEYS = ("seed", "speaker", "voice")


def talker_sampling(ctx: Any, params: dict[str, Any], defaults: dict[str, Any]) -> dict[str, Any]:
    """A talker's sampling. A request's params go to every stage and its unprefixed sampling
    keys are meant for the text: the talker takes only "talker_*" keys (prefix dropped),
    plus seed and speaker. Defaults < deploy stage defaults < request < pipeline constraints."""
    own = {k.removeprefix("talker_"): v for k, v in params.items() if k.startswith("talker_")}
    shared = {k: params[k] for k in SHARED_KEYS if k in params}
    return {**defaults, **ctx.default_sampling_params, **shared, **own, **ctx.sampling_constraints}


class ThinkerFeed:
    """What a talker knows of its thinker so far; filled from full payloads or streamed deltas."""

    def __init__(self) -> None:
        self.prompt_ids: list[int] | None = None
        self.prompt_embeds: torch.Tensor | None = None
        self.prompt_hidden: torch.Tensor | None = None
        self.meta: dict[str, Any] = {}
        self.token_ids: list[int] = []
        self.embeds: list[torch.Tensor] = []
        self.hidden: list[torch.Tensor] = []
        self.done = False

    def take(self, payload: dict[str, Any]) -> None:
        if "prompt_embeds" in payload:
            self.prompt_ids = [int(i) for i in payload["prompt_token_ids"]]
            self.prompt_embeds = torch.tensor(np.asarray(payload["prompt_embeds"]))
            self.prompt_hidden = torch.tensor(np.asarray(payload["prompt_hidden"]))
            for key in ("audio_feature_lengths", "image_grid_thw"):
                if key in payload:
                    self.meta[key] = torch.tensor(np.asarray(payload[key]))
        self.token_ids.extend(int(i) for i in payload.get("token_ids", ()))
        if "embeds" in payload and len(payload["embeds"]):
            self.embeds.extend(torch.tensor(np.asarray(payload["embeds"])).unbind(0))
            self.hidden.extend(torch.tensor(np.asarray(payload["hidden"])).unbind(0))

    @property
    def fed(self) -> int:
        """Generated thinker tokens whose states are known (all but the last one sampled)."""
        return len(self.embeds)


class ThinkerFedTalker(ARAdapter):
    """Feeding and readiness shared by the Qwen-Omni talkers: both consume a ThinkerFeed."""

    batch_prefill = True
    """Talker prompts are plain embeddings (media only shape their positions), and `on_tokens`
    reads the last position only: requests that start together share one prefill forward, so
    the last of ten simultaneous requests does not wait for nine prompts before its own."""

    def feed(self, seq: ARSeq, inputs: dict[str, Any], last: bool) -> None:
        seq.data["feed"].take(inputs)
        seq.data["feed"].done = seq.data["feed"].done or last

    def known(self, feed: ThinkerFeed) -> int:
        """Reply tokens whose text the talker can read now. Qwen2.5-Omni's talker reads each
        token's thinker hidden state, which comes with the thinker's next step: `fed`."""
        return feed.fed

    def ready(self, seq: ARSeq) -> bool:
        feed: ThinkerFeed = seq.data["feed"]
        if feed.prompt_ids is None or not feed.token_ids:
            return False
        if not seq.prefilled:
            return self.known(feed) >= 1 or feed.done
        return feed.done or self.known(feed) > len(seq.tokens)  # reply[k + 1] for decode step k


class Qwen2_5OmniTalkerAdapter(ThinkerFedTalker):
    position_axes = 3

    def load(self) -> torch.nn.Module:
        with timed(self.ctx, "imports"):
            from transformers import Qwen2_5OmniTalkerForConditionalGeneration

        path = check_checkpoint(self.ctx.model_path, ("config.json", "spk_dict.pt"))
        config = load_config(path, self.ctx)
        self.tc = config.talker_config
        self.mm_ids = {self.tc.audio_token_id, self.tc.image_token_id, self.tc.video_token_id}
        self.model = load_part(
            Qwen2_5OmniTalkerForConditionalGeneration, path, self.tc, "talker", self.ctx
        )
        table = load_tensor(path, "thinker.model.embed_tokens.weight", self.ctx).to(self.model.dtype)
        self.thinker_embed = torch.nn.Embedding.from_pretrained(table).to(self.ctx.device)
        try:
            self.speakers = torch.load(path / "spk_dict.pt", weights_only=True)
        except Exception as err:
            raise ValueError(f"{path / 'spk_dict.pt'}: cannot read speakers ({err})") from err
        ids = torch.tensor([self.tc.tts_text_end_token_id, self.tc.tts_text_pad_token_id])
        self.text_eos, self.text_pad = self.thinker_embed(ids.to(self.ctx.device)).unbind(0)
        self.stop = {self.tc.tts_codec_pad_token_id, self.tc.tts_codec_end_token_id}
        return self.model

    def sampling_params(self, params: dict[str, Any]) -> dict[str, Any]:
        return talker_sampling(self.ctx, params, SAMPLING)

    def warmup_inputs(self) -> dict[str, Any]:
        """A thinker payload of zeros (four prompt positions, two reply tokens): what
        engine_extras.warm_graphs runs at start to capture (and compile) every decode bucket
        before the first request, which otherwise pays them mid-stream."""
        zeros = np.zeros((4, self.thinker_embed.weight.shape[1]), np.float32)
        return {"prompt_token_ids": [0, 1, 2, 3], "prompt_embeds": zeros, "prompt_hidden": zeros,
                "token_ids": [0, 1], "embeds": zeros[:1], "hidden": zeros[:1]}  # fmt: skip

    def start(self, seq: ARSeq, inputs: dict[str, Any]) -> None:
        default = DEFAULT_SPEAKER if DEFAULT_SPEAKER in self.speakers else sorted(self.speakers)[0]
        speaker = pick_voice(seq.params, inputs, sorted(self.speakers), default)
        feed = ThinkerFeed()
        feed.take(inputs)
        feed.done = not seq.streaming
        seq.data = {"feed": feed, "speaker": speaker}

    def _reply(self, feed: ThinkerFeed, i: int) -> torch.Tensor:
        """Thinker reply row i (hidden + embedding), then text-eos, then text-pad."""
        if i < feed.fed:
            return (feed.hidden[i] + feed.embeds[i]).to(self.ctx.device, self.model.dtype)
        return self.text_eos if i == max(feed.fed, 1) else self.text_pad

    def prefill(self, seq: ARSeq) -> StepInputs:
        feed: ThinkerFeed = seq.data["feed"]
        dev, dt = self.ctx.device, self.model.dtype
        embeds = feed.prompt_embeds.clone()
        mm = torch.tensor([t in self.mm_ids for t in feed.prompt_ids])
        embeds[mm] = 0
        bos = int(self.speakers[seq.data["speaker"]]["bos_token"])
        first = self._reply(feed, 0) if feed.fed else self.text_eos
        rows = torch.cat(
            [
                (feed.prompt_hidden + embeds).to(dev, dt),
                self.thinker_embed(torch.tensor([bos], device=dev)),
                first[None],
            ]
        )
        codec = self.model.get_input_embeddings()
        rows[-1] += codec(torch.tensor(self.tc.tts_codec_start_token_id, device=dev))
        rows[-2] += codec(torch.tensor(self.tc.tts_codec_pad_token_id, device=dev))
        text_ids = torch.tensor([[*feed.prompt_ids, bos, feed.token_ids[0]]], device=dev)
        positions, deltas = self.model.get_rope_index(
            text_ids, _on(feed.meta.get("image_grid_thw"), dev), None, torch.ones_like(text_ids), False,
            _on(feed.meta.get("audio_feature_lengths"), dev), None,
        )  # fmt: skip
        return StepInputs(rows, positions[:, 0], text_ids.shape[1] + int(deltas.reshape(-1)[0]))

    def decode_embeds(self, seqs: list[ARSeq]) -> torch.Tensor:
        dev = self.ctx.device
        codes = small_tensor([s.tokens[-1] for s in seqs], dev)  # no host wait for the GPU
        # Decode step k (k = tokens sampled so far - 1) adds reply row k + 1.
        reply = torch.stack([self._reply(s.data["feed"], len(s.tokens)) for s in seqs])
        return (self.model.get_input_embeddings()(codes) + reply)[:, None]

    def forward(self, embeds, positions, mask, cache, extra) -> ForwardOut:
        out = self.model.model(
            inputs_embeds=self.model.thinker_to_talker_proj(embeds), position_ids=positions,
            attention_mask=mask, past_key_values=cache, use_cache=True,
        )  # fmt: skip
        return ForwardOut(self.model.codec_head(out.last_hidden_state[:, -1]).float())

    def fused_model(self) -> Any:
        """The talker's decoder is Qwen2's layer stack between the thinker-to-talker projection
        and the codec head; its multimodal rotary is the plain one at decode (the three position
        axes are equal past the prompt), so engine_extras.fused_decode applies."""
        from omni_actors.workers.engines.hf_ar_fused import FusedModel

        m = self.model
        return FusedModel(self.tc, m.model, None, m.codec_head, m.thinker_to_talker_proj, "qwen2")

    def process_logits(self, seqs: list[ARSeq], logits: torch.Tensor) -> torch.Tensor:
        logits = logits.clone()
        logits[:, self.tc.tts_codec_start_token_id] = float("-inf")
        return logits

    def on_tokens(self, seqs, tokens, out, prefill):
        results = []
        for seq, tok in zip(seqs, tokens, strict=True):
            if tok in self.stop and not seq.params.get("ignore_eos"):
                results.append(({}, True))
            else:
                results.append(({"codes": np.array([tok], dtype=np.int64)}, False))
        return results


def _on(x: torch.Tensor | None, device: Any) -> torch.Tensor | None:
    return None if x is None else x.to(device)
