"""Thinker adapter for HfAREngine: the Qwen3-Omni-MoE thinker (see qwen2_5_omni/thinker.py).

The talker reads the thinker's hidden states at `talker_config.accept_hidden_layer`.
"""

from __future__ import annotations

from typing import Any

import torch

from omni_actors.models.qwen2_5_omni.thinker import Qwen2_5OmniThinkerAdapter


class Qwen3OmniMoeThinkerAdapter(Qwen2_5OmniThinkerAdapter):
    """Qwen3-Omni-MoE thinker: same contract, its own classes and audio token count."""

    def part_class(self) -> Any:
        from transformers import Qwen3OmniMoeThinkerForConditionalGeneration

        return Qwen3OmniMoeThinkerForConditionalGeneration

    def load(self) -> torch.nn.Module:
        model = super().load()
        self.talker_layer = self.full_config.talker_config.accept_hidden_layer
        return model

    def fused_model(self) -> Any:
        return None  # mixture-of-experts layers: not the fused step's

    def audio_tokens(self, lengths: torch.Tensor) -> torch.Tensor:
        from transformers.models.qwen3_omni_moe.modeling_qwen3_omni_moe import (
            _get_feat_extract_output_lengths,
        )

        return _get_feat_extract_output_lengths(lengths, self.config.audio_config.n_window)
