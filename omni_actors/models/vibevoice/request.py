"""One VibeVoice request's state, and the prompt text its processor format asks for.

Per request: the conditioned LM branch (the whole prompt) and the guidance branch
(an audio-bos token, then the same audio inputs: no text), each with its own KV; the
next input embedding of each; the acoustic decoder's and the semantic encoder's
streaming convolution caches (the LM reads every latent back as audio); its noise
generator and frame budget. With the static KV cache (static_lm.py) both branches
live in a slot of the engine's buffers instead, and `kv` / `hidden` only carry the
prefill to it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

SYSTEM = (
    " Transform the text provided by various speakers into speech output, utilizing the distinct voice of"
    " each respective speaker.\n"
)


def prompt_text(text: str, speaker: str, clip_latents: int, bos: str, eos: str, pad: str) -> str:
    """VibeVoice's processor format: system line, an optional voice section, the script, the speech cue."""
    voice = (
        f" Voice input:\n Speaker {speaker}:{bos}{pad * clip_latents}{eos}\n"
        if clip_latents
        else ""
    )
    return (
        f"{SYSTEM}{voice} Text input:\n Speaker {speaker}: {text.strip()}\n Speech output:\n{bos}"
    )


@dataclass
class VibeVoiceRequest:
    request_id: str
    params: dict[str, Any]
    prompt: dict[str, torch.Tensor]
    """input_ids (and input_values / padding_mask for a clip) of the prompt."""
    max_frames: int
    generator: torch.Generator | None = None
    kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    """Conditioned branch, per layer [1, kv_heads, length, head_dim]."""
    neg_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
    """Guidance branch (None until its first forward, and again after an audio-bos)."""
    embed: torch.Tensor | None = None
    """[hidden] next input of the conditioned branch (and of the guidance branch on an audio step)."""
    hidden: torch.Tensor | None = None
    """[hidden] the conditioned branch's last state (the diffusion head's condition)."""
    frames: int = 0
    acoustic_cache: Any = None
    semantic_cache: Any = None
    tokens: list[int] = field(default_factory=list)
    slot: int | None = None
    """With the static KV cache (static_lm.py): the slot holding both branches, and the
    positions each has been fed (conditioned: `length`, guidance: `neg_length`)."""
    length: int = 0
    neg_length: int = 0

    @property
    def prefilled(self) -> bool:
        return self.kv is not None or self.slot is not None
