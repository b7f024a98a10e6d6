"""transformers' Mimi codec, as the families that decode or encode with it load it (csm, qwen3_tts).

moshi streams Mimi one frame at a time with its own convolution calls (moshi/streaming.py),
which read the same shapes as plain ints.
"""

from __future__ import annotations

import torch

CONV_SHAPE_BUFFERS = ("stride", "kernel_size", "padding_total")


def conv_shapes_on_host(model: torch.nn.Module) -> None:
    """transformers' MimiConv1d keeps its stride, kernel size and padding as 0-d tensor buffers,
    which go to the GPU with the weights: every convolution then reads its padding back from the
    GPU (a host sync each, ~40 a decode) and the decode cannot be captured as a CUDA graph. They
    are moved back to the host here: the same values, no sync."""
    for module in model.modules():
        for name in CONV_SHAPE_BUFFERS:
            buf = module._buffers.get(name)
            if isinstance(buf, torch.Tensor) and buf.dim() == 0:
                module._buffers[name] = buf.cpu()
