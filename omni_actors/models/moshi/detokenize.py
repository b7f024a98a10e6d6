"""One slot's text tokens as text deltas: the AR engines' incremental detokeniser, bounded for endless streams.

    text = SlotText(tokenizer); text.push(token) -> str     # "" while a character is still incomplete

Each frame's token used to be decoded with the 8 before it and the text it added sent at once: a
character split over byte tokens (byte-level BPE, SentencePiece's byte fallback) went out as U+FFFD,
and the token that completed it re-sent up to 8 tokens of text ("caf\ufffdthe café ..."). hf_ar_adapter's
TextStream holds such a token back until its character is whole; it keeps every id of its request, which a
duplex session (one token per 80 ms frame, for hours) must not: this drops the ids it will not decode again,
and holds at most MAX_PENDING tokens (the longest UTF-8 character) for bytes that never make a character.
"""

from __future__ import annotations

from omni_actors.workers.engines.hf_ar_adapter import TextStream

MAX_PENDING = 4
"""Most tokens held back waiting for the rest of a character; then they are sent as they decode."""


class SlotText(TextStream):
    def push(self, token: int, final: bool = False) -> str:
        piece = super().push(token, final or len(self.ids) + 1 - self.read >= MAX_PENDING)
        if self.prefix:  # ids before the window are never decoded again
            del self.ids[: self.prefix]
            self.read -= self.prefix
            self.prefix = 0
        return piece

    def reset(self) -> None:
        """A new session on the slot: nothing before it."""
        self.ids, self.prefix, self.read = [], 0, 0
