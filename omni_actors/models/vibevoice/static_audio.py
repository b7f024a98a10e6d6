"""VibeVoice's audio step over slot buffers: denoise a latent per slot, decode it, read it back; a CUDA graph per bucket.

After the guidance branch's LM step (static_lm.py), one call over rows 0 .. B - 1 of
the slots does what the dynamic path does per request making audio:

1. the diffusion head's whole guided denoising loop (static_head.py) from `noise`
   with `scale` per slot, conditioned on StaticLM's two branch states;
2. the LM's feedback: the acoustic decoder turns each latent into 3200 samples, the
   semantic encoder reads them, and the two connectors' sum is written into StaticLM's
   `embeds` (the next input of the slot's branches).

Both codec models are causal convolutions that stream through per-layer caches of
fixed shape [batch, channels, left_pad], updated in place; here each cache layer is a
view of a per-slot buffer (zeroed when a request takes the slot, moved with it), so a
batch of slots runs one decode and one encode, as transformers' streaming code runs
them. The shapes depend only on B, so on CUDA each bucket is captured once and
replayed (DecodeGraphs). Rows not making audio this step compute too: their results
are not read, and the engine puts back what they overwrote (their caches, their next
input) — see `keep`.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.models.vibevoice.static_head import Denoiser
from omni_actors.workers.engines.hf_ar_graphs import DecodeGraphs


class SlotCaches:
    """Per-slot streaming convolution caches of one codec model, one buffer per cache key."""

    def __init__(self, model: Any, slots: int, dtype: torch.dtype, device: torch.device) -> None:
        self.buffers = {
            m.cache_key: torch.zeros(slots, m.in_channels, m.left_pad, dtype=dtype, device=device)
            for m in model.modules()
            if hasattr(m, "cache_key") and hasattr(m, "left_pad")
        }
        self.views: dict[int, Any] = {}

    def view(self, batch: int) -> Any:
        """A transformers padding cache over rows 0 .. batch - 1 (made once per batch)."""
        from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
            VibeVoiceAcousticTokenizerConv1dCacheLayer as Layer,
        )
        from transformers.models.vibevoice_acoustic_tokenizer.modeling_vibevoice_acoustic_tokenizer import (
            VibeVoiceAcousticTokenizerConv1dPaddingCache as Cache,
        )

        if batch not in self.views:
            cache = Cache()
            for key, buf in self.buffers.items():
                layer = cache.layers[key] = Layer()
                layer.cache, layer.left_pad, layer.in_channels = (
                    buf[:batch],
                    buf.shape[2],
                    buf.shape[1],
                )
                layer.is_initialized = True
            self.views[batch] = cache
        return self.views[batch]

    def clear(self, slot: int) -> None:
        for buf in self.buffers.values():
            buf[slot].zero_()

    def move(self, dst: int, src: int) -> None:
        for buf in self.buffers.values():
            buf[dst] = buf[src]

    def save(self, slot: int) -> list[torch.Tensor]:
        return [buf[slot].clone() for buf in self.buffers.values()]

    def restore(self, slot: int, saved: list[torch.Tensor]) -> None:
        for buf, old in zip(self.buffers.values(), saved, strict=True):
            buf[slot] = old


class StaticAudio:
    """Noise, guidance scales and codec caches per slot, and the fixed-shape audio step (module docstring)."""

    def __init__(
        self, parts: Any, scheduler: Any, steps: int, states: torch.Tensor, embeds: torch.Tensor,
        batch_sizes: list[int], graphs: bool, device: torch.device,
    ) -> None:  # fmt: skip
        dt, slots = states.dtype, states.shape[1]
        self.parts, self.states, self.embeds = parts, states, embeds
        self.denoise = Denoiser(parts.diffusion_head, scheduler, steps, dt, device)
        latent = parts.diffusion_head.noisy_images_proj.in_features
        self.noise = torch.zeros(slots, latent, dtype=dt, device=device)
        """Per slot: this latent's starting noise."""
        self.scale = torch.ones(slots, 1, dtype=dt, device=device)
        """Per slot: the request's guidance scale."""
        self.acoustic = SlotCaches(parts.audio_tower.decoder, slots, dt, device)
        self.semantic = SlotCaches(parts.semantic_tokenizer_encoder, slots, dt, device)
        self.graphs = DecodeGraphs(
            lambda batch, _: self._forward(batch), graphs, buckets=len(batch_sizes)
        )

    def run(self, batch: int) -> torch.Tensor:
        """Rows 0 .. batch - 1: [batch, latent] decoder-space latents (a graph's output: read it before the
        next run); each row's next input is in `embeds`."""
        return self.graphs.run(batch, 0)

    def start(self, slot: int) -> None:
        """A request takes `slot`: its codec caches start empty."""
        self.acoustic.clear(slot)
        self.semantic.clear(slot)

    def move(self, dst: int, src: int) -> None:
        self.acoustic.move(dst, src)
        self.semantic.move(dst, src)
        self.scale[dst] = self.scale[src]

    def keep(self, slot: int) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
        """What a run overwrites of a slot that makes no audio this step; `put_back` restores it."""
        return self.acoustic.save(slot), self.semantic.save(slot), self.embeds[slot].clone()

    def put_back(
        self, slot: int, kept: tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]
    ) -> None:
        self.acoustic.restore(slot, kept[0])
        self.semantic.restore(slot, kept[1])
        self.embeds[slot] = kept[2]

    def _forward(self, batch: int) -> torch.Tensor:
        parts = self.parts
        condition = torch.cat([self.states[0, :batch], self.states[1, :batch]])
        latents = self.denoise(self.noise[:batch], condition, self.scale[:batch])
        scaled = latents / parts.latent_scaling_factor - parts.latent_bias_factor
        acoustic = parts.multi_modal_projector(latents[:, None])  # [batch, 1, hidden]
        audio = parts.audio_tower.decode(
            scaled[:, None], padding_cache=self.acoustic.view(batch), use_cache=True
        )
        sem = parts.semantic_tokenizer_encoder(
            audio.audio, padding_cache=self.semantic.view(batch), use_cache=True
        )
        self.embeds[:batch].copy_((acoustic + parts.semantic_connector(sem.latents))[:, 0])
        return scaled
