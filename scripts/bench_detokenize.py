"""Incremental detokenisation cost per token: TextStream's window against decoding the whole text.

TextStream (engines/hf_ar_adapter.py) decodes a short window per token; the baseline, in this
script, is what it did before: decode every id so far on each token and send the new tail.
Both run over the same ids (words with accents and CJK through make_tiny's llama tokenizer, no
downloads) at several answer lengths, in one run; the texts must agree.

    .venv/bin/python scripts/bench_detokenize.py

Prints one JSON line: microseconds per token for each length and method.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni_actors.workers.engines.hf_ar_adapter import TextStream, _list_decoder

LENGTHS = (256, 1024, 4096)
WORDS = ["stream", "token", "window", "decode", "naïve", "café", "世界", "answer"]


class WholeDecode:
    """The baseline: the whole text decoded on every token."""

    def __init__(self, tokenizer) -> None:
        self.decode, self.ids, self.sent = _list_decoder(tokenizer), [], 0

    def push(self, token: int, final: bool = False) -> str:
        self.ids.append(token)
        text = self.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""
        delta, self.sent = text[self.sent :], len(text)
        return delta


def per_token_us(cls, tokenizer, ids: list[int]) -> tuple[float, str]:
    stream, out = cls(tokenizer), []
    t0 = time.perf_counter()
    for i, t in enumerate(ids):
        out.append(stream.push(t, final=i == len(ids) - 1))
    return (time.perf_counter() - t0) / len(ids) * 1e6, "".join(out)


def main() -> None:
    from transformers import AutoTokenizer

    from omni_actors.models.tiny import make_tiny

    with tempfile.TemporaryDirectory(prefix="bench-detok-") as tmp:
        tok = AutoTokenizer.from_pretrained(make_tiny("llama", Path(tmp) / "llama", seed=0))
    words = tok(" ".join(WORDS * (max(LENGTHS) // 2))).input_ids
    result: dict[str, object] = {"bench": "detokenize", "tokenizer": "make_tiny llama (byte-level BPE)"}
    for n in LENGTHS:
        ids = words[:n]
        base, base_text = per_token_us(WholeDecode, tok, ids)
        window, window_text = per_token_us(TextStream, tok, ids)
        assert window_text == base_text == tok.decode(ids, skip_special_tokens=True)
        result[f"n{n}"] = {"whole_us_per_token": round(base, 1), "window_us_per_token": round(window, 1),
                           "speedup": round(base / window, 1)}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
