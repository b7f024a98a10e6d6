"""A Dia folder's DAC codec: the folder its `processor_config.json` names (models/audio_tokenizer_folder.py;
the real checkpoint says "descript/dac_44khz", a tiny one "dac"), loaded in float32."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omni_actors.models.audio_tokenizer_folder import audio_tokenizer_folder

DEFAULT_DAC = "dac"


def dac_folder(model_path: Path) -> Path:
    """The DAC folder of a Dia checkpoint; FileNotFoundError naming what was looked for."""
    return audio_tokenizer_folder(model_path, DEFAULT_DAC, "DAC codec", "descript/dac_44khz")


def load_dac(model_path: Path, device: str) -> Any:
    """DacModel (float32, eval) of a Dia checkpoint."""
    from transformers import DacModel

    folder = dac_folder(model_path)
    try:
        model = DacModel.from_pretrained(folder, dtype="float32")
    except Exception as err:
        raise ValueError(f"{folder}: cannot load the DAC codec ({err})") from err
    return model.to(device).eval()
