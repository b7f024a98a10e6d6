"""Stage input processors of the Qwen-Omni pipelines (both generations share the payloads).

    thinker -> talker:   the thinker's prompt/token states (see thinker.py)
    talker  -> code2wav: codec codes, [n] (Qwen2.5) or [n, groups] (Qwen3)

Full payload: (upstream: {source: [chunk, ...]}, request) -> inputs
Async chunk:  (source, chunk, last, request, state) -> inputs or None
"""

from __future__ import annotations

from typing import Any

import numpy as np

TALKER_KEYS = (
    "prompt_token_ids", "prompt_embeds", "prompt_hidden", "audio_feature_lengths",
    "image_grid_thw", "token_ids", "embeds", "hidden",
)  # fmt: skip


def _speaker(request: dict[str, Any]) -> dict[str, Any]:
    speaker = request.get("speaker")
    return {"speaker": speaker} if speaker else {}


def thinker_to_talker(
    upstream: dict[int, list[dict[str, Any]]], request: dict[str, Any]
) -> dict[str, Any]:
    """All thinker outputs of a request, merged: prompt states once, token rows stacked."""
    out: dict[str, Any] = {"token_ids": [], **_speaker(request)}
    embeds: list[np.ndarray] = []
    hidden: list[np.ndarray] = []
    for chunk in upstream.get(0, []):
        for key in (
            "prompt_token_ids",
            "prompt_embeds",
            "prompt_hidden",
            "audio_feature_lengths",
            "image_grid_thw",
        ):
            if key in chunk:
                out[key] = chunk[key]
        out["token_ids"].extend(int(t) for t in chunk.get("token_ids", ()))
        if "embeds" in chunk:
            embeds.append(np.asarray(chunk["embeds"], dtype=np.float32))
            hidden.append(np.asarray(chunk["hidden"], dtype=np.float32))
    if "prompt_embeds" not in out:
        raise ValueError("thinker output has no prompt states (prompt_embeds)")
    width = np.asarray(out["prompt_embeds"]).shape[-1]
    out["embeds"] = np.concatenate(embeds) if embeds else np.zeros((0, width), np.float32)
    out["hidden"] = np.concatenate(hidden) if hidden else np.zeros((0, width), np.float32)
    return out


def thinker_to_talker_chunk(
    source: int, chunk: dict[str, Any], last: bool, request: dict[str, Any], state: dict[str, Any]
) -> dict[str, Any] | None:
    """Each thinker delta, minus its text."""
    out = {k: chunk[k] for k in TALKER_KEYS if k in chunk}
    return out or None


def talker_to_code2wav(
    upstream: dict[int, list[dict[str, Any]]], request: dict[str, Any]
) -> dict[str, Any]:
    """All codes of the talker, in order."""
    codes = [np.asarray(c["codes"]) for c in upstream.get(1, []) if "codes" in c]
    merged = np.concatenate(codes) if codes else np.zeros((0,), np.int64)
    return {"codes": merged, **_speaker(request)}


def talker_to_code2wav_chunk(
    source: int, chunk: dict[str, Any], last: bool, request: dict[str, Any], state: dict[str, Any]
) -> dict[str, Any] | None:
    """Each talker frame's codes as they come: the code2wav engine's windows decide when to decode.
    (Gathering five frames here held Qwen3-Omni's one-frame first window back by four talker frames:
    code2wav's share of first audio was 144 ms at full depth on an H200, 2026-12-02.)"""
    return {"codes": chunk["codes"]} if "codes" in chunk else None
