"""Where a speech checkpoint's audio tokenizer (codec) is: the folder its `processor_config.json` names,
found without a download.

Dia's and Higgs-Audio-V2's processors name their audio tokenizer (`audio_tokenizer`
`.audio_tokenizer_name_or_path`): a real checkpoint says a hub id ("descript/dac_44khz",
"bosonai/higgs-audio-v2-tokenizer"), a tiny one a folder beside the weights. Looked up in order:
that name as a folder inside the model folder, as an absolute folder, then the local Hugging Face
cache (`local_files_only`: nothing is fetched). The family's default folder inside the model folder
is used when the processor names none.
"""

from __future__ import annotations

import json
from pathlib import Path


def audio_tokenizer_folder(model_path: Path, default: str, what: str, real: str) -> Path:
    """The audio tokenizer folder of `model_path` (`default` when its processor names none);
    FileNotFoundError naming `what` was looked for and where the `real` checkpoint's folder goes."""
    config = model_path / "processor_config.json"
    name = default
    if config.is_file():
        try:
            name = json.loads(config.read_text())["audio_tokenizer"]["audio_tokenizer_name_or_path"]
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{config}: no audio_tokenizer.audio_tokenizer_name_or_path ({err!r})") from None
    for folder in (model_path / name, Path(name)):
        if (folder / "config.json").is_file():
            return folder
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, local_files_only=True))
    except Exception:  # not a cached hub id either
        pass
    raise FileNotFoundError(
        f"{config}: its {what} {name!r} is neither a folder in {model_path} nor in the local "
        f"Hugging Face cache; put the {real} folder at {model_path / name}"
    )
