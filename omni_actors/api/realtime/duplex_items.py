"""What a duplex session keeps of its responses' items: each frame heard into the item's audio part, bounded.

Each duplex response's assistant item is a conversation item (duplex.py adds it when the response
opens), so it can be retrieved and truncated like any other. A response can last as long as the
session, so an item keeps no audio (as on every pipeline, an assistant part holds its length in
`audio_ms`, not its samples), at most TRANSCRIPT_CHARS of transcript (the newest), and at most
TIMED_PIECES (start_ms, piece) pairs for `conversation.truncate`: the newest pieces each with its
frame's start, older ones merged into the first pair (a truncate that far back keeps all of it).
The session keeps its last ITEMS_KEPT items (duplex.py).
"""

from __future__ import annotations

from fractions import Fraction

from omni_actors.api.realtime.conversation import Part

ITEMS_KEPT = 16
"""A duplex session's own items kept in its conversation; opening one more deletes the oldest."""
TRANSCRIPT_CHARS = 8_000
"""Most transcript characters an item keeps (the newest): about ten minutes of speech."""
TIMED_PIECES = 256
"""Transcript pieces an item times to the frame they came with (at least the last ~20 s of its audio:
Moshi's frames are 80 ms); older pieces are merged, so a truncate that far back keeps them."""


class AudioClock:
    """An item's audio sent so far, exact: each frame's whole milliseconds for `hear`.

    A frame's length in ms is rarely whole (G.711's 8 kHz frames come out of the resampler as 489
    or 490 samples, 61.125 or 61.25 ms); flooring each would leave the item ~2.5 ms a second behind
    the audio the client was sent, and a truncate at the client's own count refused as past the item.
    """

    def __init__(self) -> None:
        self._sent = Fraction(0)
        self._told = 0

    def ms(self, samples: int, rate: int) -> int:
        """Whole milliseconds this frame adds: over any frames, the floor of all they hold."""
        self._sent += Fraction(samples * 1000, rate)
        whole = int(self._sent)
        ms, self._told = whole - self._told, whole
        return ms


def hear(part: Part, ms: int, text: str) -> None:
    """One frame sent: `ms` of audio added to the part, its text piece timed at the frame's start."""
    start, part.audio_ms = part.audio_ms, part.audio_ms + ms
    if not text:
        return
    part.transcript = (part.transcript or "") + text
    pieces = part.segments
    pieces.append((start, text))
    if len(pieces) > TIMED_PIECES:  # merge the oldest two: coarser timing only far from the end
        (first, a), (_, b) = pieces[0], pieces.pop(1)
        pieces[0] = (first, a + b)
    if len(part.transcript) > TRANSCRIPT_CHARS:
        part.transcript = part.transcript[-TRANSCRIPT_CHARS:]
        excess = sum(len(p) for _, p in pieces) - TRANSCRIPT_CHARS
        while excess > 0 and pieces:
            first, a = pieces[0]
            if len(a) <= excess:
                pieces.pop(0)
            else:
                pieces[0] = (first, a[excess:])
            excess -= len(a)
