"""Work-arounds for defects of the installed diffusers / transformers in one pipeline family.

Each is applied to a loaded pipeline by class name, changes nothing a working path
does, and names the defect it covers (docs/media.md has the table).

- `GlmImagePipeline` image-to-image: diffusers 0.42.1's `generate_prior_tokens`
  concatenates the per-image features transformers 5.19's `get_image_features`
  returns ([C, h, w] each) into one [n x C, h, w] tensor, which `get_image_tokens`
  then iterates row by row as if each were an image, so the VQ encoder gets one
  channel. The prior's `get_image_tokens` gets that tensor split back into its
  images (C rows each); the list transformers itself passes is untouched.
"""

from __future__ import annotations

import types
from typing import Any


def apply_fixes(pipe: Any) -> list[str]:
    """Apply the work-arounds `pipe`'s class needs; the names of those applied."""
    applied = []
    if type(pipe).__name__ == "GlmImagePipeline":
        _glm_image_tokens(pipe.vision_language_encoder)
        applied.append("glm_image_tokens")
    return applied


def _glm_image_tokens(prior: Any) -> None:
    import torch

    channels = prior.model.vqmodel.quant_conv.in_channels
    tokens = prior.get_image_tokens

    def get_image_tokens(self: Any, hidden_states: Any, image_grid_thw: Any = None) -> Any:
        if isinstance(hidden_states, torch.Tensor) and hidden_states.dim() == 3:
            hidden_states = list(hidden_states.split(channels))  # diffusers' concatenated images
        return tokens(hidden_states, image_grid_thw)

    prior.get_image_tokens = types.MethodType(get_image_tokens, prior)
