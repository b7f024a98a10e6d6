"""One Moshi step for a batch of slots: temporal transformer + depth decoder, with per-slot sampling.

Built from transformers' `MoshiForConditionalGeneration` parts (its decoder
layers, norm, text head, audio embeddings and `MoshiDepthDecoder`), with the
temporal KV cache in a `RingKV` so every slot is at its own position.

Streams and delays (as Moshi, and transformers' delay pattern): each step's
input sums the embeddings of the model's previous text token, the model's
audio codes and the user's audio codes, where codebook 0 (semantic) is of this
frame and codebooks 1.. (acoustic) are one frame late. So the model's audio for
frame t is complete one step later: step t returns the codes of frame t - 1.

Sampling is temperature + top-k per stream (Moshi's defaults), drawn by the
Gumbel-max trick with noise from each slot's own `torch.Generator`: a slot's
tokens depend on its seed and inputs only, never on other slots.

A step is split for CUDA graphs (frame.py): `prepare` (host side: draws each live
slot's noise into static buffers, notes which slots are at their first step),
`forward` (device only: reads and writes static buffers in place, no host syncs,
so it can be captured once and replayed), `finish` (host side: counts the step).
`step` is the three in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni_actors.models.moshi.streaming import RingKV, StepKV

TEXT_TEMPERATURE = 0.7
TEXT_TOP_K = 25
AUDIO_TEMPERATURE = 0.8
AUDIO_TOP_K = 250


@dataclass(frozen=True)
class Sampling:
    text_temperature: float = TEXT_TEMPERATURE
    audio_temperature: float = AUDIO_TEMPERATURE
    text_top_k: int = TEXT_TOP_K
    audio_top_k: int = AUDIO_TOP_K


def _gumbel(logits: torch.Tensor, noise: torch.Tensor, temperature: torch.Tensor, top_k: int) -> torch.Tensor:
    """Sample the last dim of `logits` [S, V] with uniform `noise` [S, V]; temperature 0 is argmax."""
    logits = logits.float()
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    t = temperature[:, None]
    gumbel = -torch.log(-torch.log(noise.clamp(1e-20, 1.0 - 1e-7)))
    scores = torch.where(t > 0, logits / t.clamp_min(1e-6) + gumbel, logits)
    return scores.argmax(-1)


class DuplexLM:
    """Temporal + depth state of every slot; `step` advances all slots by one frame."""

    def __init__(self, model, slots: int, sampling: Sampling | None = None) -> None:
        cfg = model.config
        p = next(model.parameters())
        self.model = model
        self.device, self.dtype = p.device, p.dtype
        self.slots = slots
        self.k = cfg.num_codebooks
        self.text_vocab = cfg.vocab_size
        self.audio_vocab = cfg.audio_vocab_size
        self.sampling = sampling or Sampling()
        window = min(cfg.sliding_window, cfg.max_position_embeddings)
        self.ring = RingKV(cfg.num_hidden_layers, slots, cfg.num_key_value_heads, cfg.head_dim, window, 1,
                           self.dtype, self.device)
        dcfg = model.depth_decoder.config
        self.depth_kv = StepKV(dcfg.num_hidden_layers, slots, dcfg.num_key_value_heads,
                               dcfg.head_dim or dcfg.hidden_size // dcfg.num_attention_heads, self.k,
                               dcfg.sliding_window, self.dtype, self.device)
        self.generators = [torch.Generator(device=self.device) for _ in range(slots)]
        self.live = torch.zeros(slots, dtype=torch.bool)
        self.text_temp = torch.full((slots,), self.sampling.text_temperature, device=self.device)
        self.audio_temp = torch.full((slots,), self.sampling.audio_temperature, device=self.device)
        self.prev_text = torch.empty(slots, dtype=torch.long, device=self.device)
        self.prev_model = torch.empty(slots, self.k, dtype=torch.long, device=self.device)
        self.prev_user = torch.empty(slots, self.k, dtype=torch.long, device=self.device)
        self.text_noise = torch.full((slots, self.text_vocab), 0.5, device=self.device)
        self.audio_noise = torch.full((slots, self.k, self.audio_vocab), 0.5, device=self.device)
        self.stepped = torch.zeros(slots, dtype=torch.bool, device=self.device)
        """Per slot: has it stepped since it was cleared (the device copy of `steps > 0`)."""
        self.steps = torch.zeros(slots, dtype=torch.long)
        for s in range(slots):
            self._clear(s)

    def _clear(self, slot: int) -> None:
        self.ring.reset(slot)
        self.prev_text[slot] = self.text_vocab  # the "nothing yet" row of the text embedding
        self.prev_model[slot] = self.audio_vocab  # ... and of every audio embedding
        self.prev_user[slot] = self.audio_vocab
        self.text_noise[slot] = 0.5  # a free slot's rows: fixed noise, no generator drawn from
        self.audio_noise[slot] = 0.5
        self.stepped[slot] = False
        self.steps[slot] = 0

    def start(self, slot: int, seed: int, text_temperature: float | None = None,
              audio_temperature: float | None = None) -> None:
        self._clear(slot)
        self.generators[slot].manual_seed(seed)
        self.text_temp[slot] = self.sampling.text_temperature if text_temperature is None else text_temperature
        self.audio_temp[slot] = self.sampling.audio_temperature if audio_temperature is None else audio_temperature
        self.live[slot] = True

    def stop(self, slot: int) -> None:
        self.live[slot] = False
        self._clear(slot)

    def prepare(self) -> torch.Tensor:
        """Host side of a step: draw each live slot's noise (text, then every codebook, from its own
        generator); return which slots are at their first step [S] (CPU bool)."""
        for s in torch.nonzero(self.live).flatten().tolist():
            g = self.generators[s]
            self.text_noise[s].uniform_(generator=g)
            self.audio_noise[s].uniform_(generator=g)
        return self.steps == 0

    def finish(self) -> None:
        self.steps += 1

    @torch.no_grad()
    def step(self, user_codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """user_codes [S, K] of this frame -> (text tokens [S], audio codes [S, K] of the previous frame,
        ready [S]: False for a slot's first step, whose previous frame does not exist)."""
        first = self.prepare()
        text, frame, _ready = self.forward(user_codes)
        self.finish()
        return text, frame, ~first

    def forward(self, user_codes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The device half of `step` (no host syncs, state written in place): (text, frame, ready [S] on
        the device)."""
        m = self.model
        user = torch.cat([user_codes[:, :1], self.prev_user[:, 1:]], dim=1)  # acoustic codebooks one frame late
        emb = m.decoder.model.embed_tokens(self.prev_text[:, None])
        for i in range(self.k):
            emb = emb + m.embed_tokens[i](self.prev_model[:, i : i + 1])
            emb = emb + m.embed_tokens[self.k + i](user[:, i : i + 1])
        positions, mask = self.ring.begin(1)
        h = emb
        for layer in m.decoder.model.layers:
            h = layer(h, attention_mask=mask, position_ids=positions, past_key_values=self.ring)[0]
        self.ring.finish(1)
        h = m.decoder.model.norm(h)
        text_logits = m.decoder.lm_head(h)[:, -1]
        text = _gumbel(text_logits, self.text_noise, self.text_temp, self.sampling.text_top_k)
        codes = self._depth(h, text)
        frame = torch.cat([self.prev_model[:, :1], codes[:, 1:]], dim=1)  # codebook 0 was made a step ago
        ready = self.stepped.clone()
        self.stepped.fill_(True)
        self.prev_text.copy_(text)
        self.prev_model.copy_(codes)
        self.prev_user.copy_(user_codes)
        return text, frame, ready

    def _depth(self, hidden: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
        depth = self.model.depth_decoder
        cache = self.depth_kv
        noise = self.audio_noise
        ids = text[:, None]
        out = []
        for i in range(self.k):
            # the embedding depth.forward would pick with a host sync (.item()) per call
            table = depth.text_embed_tokens if i == 0 else depth.embed_tokens[i - 1]
            cache.pos = i
            logits = depth(input_ids=ids, inputs_embeds=table(ids), last_hidden_state=hidden, past_key_values=cache,
                           use_cache=True).logits
            code = _gumbel(logits[:, -1], noise[:, i], self.audio_temp, self.sampling.audio_top_k)
            out.append(code)
            ids = code[:, None]
        return torch.stack(out, dim=1)
