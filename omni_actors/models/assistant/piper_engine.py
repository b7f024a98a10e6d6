"""What the two Piper stage engines share: the voice config, ONNX sessions, and latent names.

The prepared `tts/` and `vocoder/` folders each hold `model.onnx` (one half of
the Piper VITS graph, cut at the latent) and `voice.json` (Piper's voice config).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

LATENT_INPUT = "/Mul_7_output_0"
"""The tensor where the graph is cut: [batch, LATENT_CHANNELS, frames]."""
LATENT_CHANNELS = 192
HOP_SAMPLES = 256
"""Audio samples per latent frame (the HiFi-GAN's total upsampling)."""
MODEL_FILE = "model.onnx"
VOICE_FILE = "voice.json"


def load_voice(folder: Path) -> dict[str, Any]:
    return json.loads((folder / VOICE_FILE).read_text())


def onnx_session(folder: Path, device: str, threads: int) -> Any:
    """An onnxruntime session on `device` with `threads` intra-op threads (1 by default)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    providers = ["CPUExecutionProvider"]
    if device == "cuda" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, "CUDAExecutionProvider")
    return ort.InferenceSession(str(folder / MODEL_FILE), opts, providers=providers)


def as_latent(value: Any) -> np.ndarray:
    """A latent payload value as an owned float32 [channels, frames] array."""
    arr = np.array(value, dtype=np.float32)  # copies: inputs may be views of shared memory
    if arr.ndim == 3:
        if arr.shape[0] != 1:
            raise ValueError(f"latent batch must be 1, got shape {arr.shape}")
        arr = arr[0]
    if arr.ndim != 2 or arr.shape[0] != LATENT_CHANNELS:
        raise ValueError(f"latent must be [{LATENT_CHANNELS}, frames], got shape {arr.shape}")
    return arr


def empty_latent() -> np.ndarray:
    return np.zeros((LATENT_CHANNELS, 0), dtype=np.float32)
