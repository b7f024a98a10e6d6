"""The sampled tokens' log-probabilities of one vLLM request, released as far as its sent text covers them.

vLLM holds text back while it may be a stop string, so a token's log-probability goes out only once its
text has; on the last output the tokens past the answer's text (a cut stop string, the end-of-text token)
are trimmed, so the tokens' texts joined are exactly the answer's text. Each entry is
[token text, logprob, [[alternative text, logprob] x top]] (vllm_ar.py's module docstring).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LOGPROB_FLOOR = -9999.0
"""The least log-probability returned (OpenAI's; JSON has no -inf)."""


@dataclass
class Logprobs:
    """The tokens' log-probabilities, sent as far as the text sent covers them (module docstring)."""

    top: int
    """Alternatives asked for per token."""
    pending: list[list[Any]] = field(default_factory=list)
    text_chars: int = 0
    """Characters of answer text sent so far."""
    covered: int = 0
    """Characters of it the tokens sent stand for."""

    def add(self, text: str, token_ids: list[int], positions: Any) -> None:
        self.text_chars += len(text)
        for token_id, entries in zip(token_ids, positions or (), strict=False):
            if not entries:
                continue
            sampled = entries.get(token_id)
            top = sorted((e for e in entries.values() if e.rank is not None and e.rank <= self.top),
                         key=lambda e: e.rank)[:self.top]
            self.pending.append([
                (sampled.decoded_token or "") if sampled is not None else "",
                max(sampled.logprob, LOGPROB_FLOOR) if sampled is not None else LOGPROB_FLOOR,
                [[e.decoded_token or "", max(e.logprob, LOGPROB_FLOOR)] for e in top]])

    def release(self, last: bool) -> list[list[Any]]:
        """The tokens whose text has gone out; on the `last` output, the rest, trimmed to the text."""
        out = []
        while self.pending and self.covered + len(self.pending[0][0]) <= self.text_chars:
            out.append(entry := self.pending.pop(0))
            self.covered += len(entry[0])
        if last:
            for entry in self.pending:
                if (room := self.text_chars - self.covered) <= 0:
                    break
                entry[0] = entry[0][:room]
                out.append(entry)
                self.covered += len(entry[0])
            self.pending = []
        return out
