"""Pipeline components whose transformers class needs torchvision, loaded here without it.

Some diffusers pipelines name a transformers processor that transformers 5.19
only builds with torchvision: `Qwen2VLProcessor` (Qwen-Image-Edit / Edit-Plus /
Layered, LongCat-Image) always wants a `Qwen2VLVideoProcessor`, and
`PixtralProcessor` (FLUX.2's `tokenizer`) is marked torchvision-only as a whole.
The pipelines use neither torchvision path: Qwen's processor sees images and
text, never video, and FLUX.2 only renders text through the chat template. So,
where torchvision is not installed, each such component is built from the same
files in a torchvision-free form and handed to `from_pretrained` by name:

- `Qwen2VLProcessor`: the real class with its image processor's PIL backend
  (`Qwen2VLImageProcessorPil`, same numbers) and no video processor;
- `PixtralProcessor`: its tokenizer (same vocabulary, same chat template), the
  text path of the processor.

The folders stay the real layout; with torchvision installed nothing changes.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any


def torchvision_available() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def image_only_qwen2_vl_processor(image_processor: Any, tokenizer: Any, chat_template: str | None) -> Any:
    """The real Qwen2VLProcessor over `image_processor` and `tokenizer`, without a video processor."""
    from transformers import Qwen2VLProcessor

    class ImageOnlyQwen2VLProcessor(Qwen2VLProcessor):
        """Qwen2VLProcessor whose video processor is absent (images and text only)."""

        def check_argument_for_proper_class(self, argument_name: str, argument: Any) -> Any:
            if argument_name == "video_processor" and argument is None:
                return None  # its base class is exported only with torchvision
            return super().check_argument_for_proper_class(argument_name, argument)

    return ImageOnlyQwen2VLProcessor(
        image_processor=image_processor, tokenizer=tokenizer, video_processor=None, chat_template=chat_template
    )


def _chat_template(folder: Path, tokenizer: Any) -> str | None:
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    legacy = folder / "chat_template.json"
    if legacy.is_file():
        return json.loads(legacy.read_text()).get("chat_template")
    return tokenizer.chat_template


def _qwen2_vl_processor(folder: Path) -> Any:
    from transformers import AutoTokenizer, Qwen2VLImageProcessorPil

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    image = Qwen2VLImageProcessorPil.from_pretrained(folder, local_files_only=True)
    return image_only_qwen2_vl_processor(image, tokenizer, _chat_template(folder, tokenizer))


def _pixtral_text_processor(folder: Path) -> Any:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    template = _chat_template(folder, tokenizer)
    if template is not None:
        tokenizer.chat_template = template
    return tokenizer


_LOADERS: dict[str, Callable[[Path], Any]] = {
    "Qwen2VLProcessor": _qwen2_vl_processor,
    "PixtralProcessor": _pixtral_text_processor,
}


def torchvision_free_components(root: Path, index: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Components of the pipeline in `root` (its model_index.json `index`) built without torchvision.

    Returns (passed to `from_pretrained`, set after it): diffusers checks a passed
    component against the class the index names, and where that class is
    transformers' torchvision placeholder (PixtralProcessor) the check cannot
    pass, so that one loads as None and is set on the pipeline afterwards.
    """
    if torchvision_available():
        return {}, {}
    import transformers
    from transformers import ProcessorMixin

    now: dict[str, Any] = {}
    later: dict[str, Any] = {}
    for name, spec in index.items():
        if name.startswith("_") or not isinstance(spec, list) or len(spec) != 2:
            continue
        library, class_name = spec
        if library == "transformers" and class_name in _LOADERS:
            named = getattr(transformers, class_name)
            real = isinstance(named, type) and issubclass(named, ProcessorMixin)
            (now if real else later)[name] = _LOADERS[class_name](root / name)
    return now, later
