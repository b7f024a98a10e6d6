"""Stage input processors of the assistant pipeline, and its sentence splitter.

Full-payload processors: `(upstream: {source: [payload, ...]}, request) -> inputs`.
Chunk processors (async chunk): `(source, payload, last, request, state) -> inputs | None`,
called once per upstream delta in order; `state` is a dict private to one request
and edge. They return None while they have nothing to hand on, and always a
dict when `last` is set, so the consumer learns its input ended.

`request` is the request's plain inputs (what the client sent, arrays left out).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from omni_actors.models.assistant.piper_engine import LATENT_CHANNELS

MAX_CLAUSE_CHARS = 160
FIRST_CLAUSE_MIN_CHARS = 20
"""The first piece of an answer may end at a clause break once it is this long."""
"""A buffer this long without a sentence end is cut at its last comma-like break."""

_ABBREVIATIONS = frozenset({"mr", "mrs", "ms", "dr", "prof", "st", "sr", "jr", "vs", "e.g", "i.e"})
# A sentence ends at . ! ? (optionally followed by closing quotes or brackets), then space.
_SENTENCE_END = re.compile(r"[.!?…]+[\"')\]]*(?=\s)|\n+")
_CLAUSE_BREAK = re.compile("[,;:\u2013\u2014]\\s")  # comma-like marks and dashes


def split_sentences(text: str, final: bool = False) -> tuple[list[str], str]:
    """Split `text` into complete sentences and the unfinished rest.

    With `final`, the rest counts as a sentence too (returned in the list, rest "").
    Abbreviations and decimal numbers do not end sentences; a very long run
    without an end is cut at a clause break so speech cannot stall behind it.
    """
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        end = match.end()
        candidate = text[start:end].strip()
        if match.group().startswith(".") and _ends_with_abbreviation(candidate):
            continue
        if candidate:
            sentences.append(candidate)
        start = end
    rest = text[start:]
    while len(rest) > MAX_CLAUSE_CHARS:
        breaks = list(_CLAUSE_BREAK.finditer(rest, 0, MAX_CLAUSE_CHARS + 1))
        cut = breaks[-1].end() if breaks else rest.rfind(" ", 0, MAX_CLAUSE_CHARS) + 1
        if cut <= 0:
            break
        sentences.append(rest[:cut].strip())
        rest = rest[cut:]
    if final:
        if rest.strip():
            sentences.append(rest.strip())
        rest = ""
    return sentences, rest


def _ends_with_abbreviation(sentence: str) -> bool:
    words = sentence.split()
    return bool(words) and words[-1].lower().rstrip(".") in _ABBREVIATIONS


def _joined_text(payloads: list[dict[str, Any]]) -> str:
    return "".join(p.get("text", "") for p in payloads)


# -- asr -> llm ---------------------------------------------------------------


def asr_to_llm(upstream: dict[int, list[dict[str, Any]]], request: dict[str, Any]) -> dict[str, Any]:
    """The transcript stands in for the request's audio; the llm gets text-only messages.

    A chat request's audio sits in its last user message as a part naming the
    array "audio" (api/chat_inputs.py): the transcript takes that part's place.
    Otherwise (a realtime turn, plain audio) it becomes a new last user turn
    after any history the client sent. Other media parts are dropped: the llm reads text.
    """
    transcript = " ".join(_joined_text(payloads).strip() for payloads in upstream.values()).strip()
    messages: list[dict[str, Any]] = []
    placed = False
    for msg in request.get("messages") or []:
        content = msg.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") == "text":
                    texts.append(str(part.get("text", "")))
                elif part.get("type") == "input_audio" and part.get("array") == "audio":
                    texts.append(transcript)
                    placed = True
            msg = {**msg, "content": " ".join(t for t in texts if t)}
        messages.append(msg)
    if not placed:
        messages.append({"role": "user", "content": transcript})
    return {"messages": messages}


# -- llm -> tts ---------------------------------------------------------------


def llm_to_tts(upstream: dict[int, list[dict[str, Any]]], request: dict[str, Any]) -> dict[str, Any]:
    return {"text": "".join(_joined_text(payloads) for payloads in upstream.values())}


def llm_to_tts_chunk(
    source: int, payload: dict[str, Any], last: bool, request: dict[str, Any], state: dict[str, Any]
) -> dict[str, Any] | None:
    """Buffer text deltas; hand on whole sentences as they complete, the rest at the end.

    The very first piece may be a clause: once FIRST_CLAUSE_MIN_CHARS have come and a
    comma-like break appears, speech starts there instead of waiting for the sentence end
    (first audio ~0.8 s instead of ~1.3 s for a typical answer on 2 CPU cores).
    """
    buffered = state.get("text", "") + payload.get("text", "")
    sentences, rest = split_sentences(buffered, final=last)
    if not state.get("started") and not sentences and not last:
        breaks = [b for b in _CLAUSE_BREAK.finditer(rest) if b.end() >= FIRST_CLAUSE_MIN_CHARS]
        if breaks:
            cut = breaks[0].end()
            sentences, rest = [rest[:cut].strip()], rest[cut:]
    state["text"] = rest
    if sentences:
        state["started"] = True
    if sentences or last:
        return {"text": " ".join(sentences)}
    return None


# -- tts -> vocoder -----------------------------------------------------------


def tts_to_vocoder(upstream: dict[int, list[dict[str, Any]]], request: dict[str, Any]) -> dict[str, Any]:
    latents = [
        np.asarray(p["latent"], dtype=np.float32).reshape(LATENT_CHANNELS, -1)
        for payloads in upstream.values()
        for p in payloads
        if "latent" in p
    ]
    if not latents:
        return {"latent": np.zeros((LATENT_CHANNELS, 0), dtype=np.float32)}
    return {"latent": np.concatenate(latents, axis=1)}


def tts_to_vocoder_chunk(
    source: int, payload: dict[str, Any], last: bool, request: dict[str, Any], state: dict[str, Any]
) -> dict[str, Any] | None:
    """Latent chunks pass through unchanged; the vocoder keeps the context it needs."""
    latent = payload.get("latent")
    if latent is not None and np.shape(latent)[-1] > 0:
        return {"latent": latent}
    if last:
        return {"latent": np.zeros((LATENT_CHANNELS, 0), dtype=np.float32)}
    return None
