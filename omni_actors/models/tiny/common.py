"""What tiny-checkpoint builders share: a byte-level BPE trained offline, peaked random weights, seeded writes.

Imported by the builders only (they import torch and tokenizers lazily; so does this module).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any


def byte_bpe(corpus: Iterable[str], vocab_size: int, specials: list[str] | tuple[str, ...] = ()) -> Any:
    """A `tokenizers.Tokenizer`: byte-level BPE trained on `corpus` (deterministic), `specials` first in its vocab."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(corpus, trainer=trainer)
    return tok


def peak(model: Any, std: float, skip: str | None = None) -> None:
    """Draw every weight matrix (but those whose name holds `skip`) from N(0, std), in parameter order.

    Larger than the default init, so the random logits are peaked enough to give
    varied, seed-dependent text rather than a near-uniform distribution.
    """
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 and (skip is None or skip not in name):
                p.normal_(0.0, std)


def build_device(sized: bool) -> Any:
    """Where to initialise a checkpoint's random weights: a real-size one on the GPU when there is one
    (seconds, not the minutes billions of CPU draws take); tiny ones on the CPU (reproducible anywhere)."""
    import torch

    return torch.device("cuda" if sized and torch.cuda.is_available() else "cpu")


def seeded_pipeline(out_dir: str | Path, seed: int, make: Callable[[], Any]) -> Path:
    """Write the diffusers pipeline `make()` builds, its random weights drawn from `seed` (the caller's RNG
    state left as it was), to `out_dir`; return the folder."""
    import torch

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        pipe = make()
    pipe.save_pretrained(out, safe_serialization=True)
    return out
