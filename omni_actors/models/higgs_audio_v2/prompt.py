"""Higgs-Audio-V2 prompts: the chat the checkpoint's template renders, and a reference clip's delayed codes.

The conversation is the one Boson AI's examples and transformers' docs build: a system turn
"Generate audio following instruction." with the scene description inside
`<|scene_desc_start|>`..`<|scene_desc_end|>` (a request's `instructions`, else the examples'
"Audio is recorded from a quiet room."); for a clip to clone, a user turn with its transcript
and an assistant turn holding the audio; then the user turn with the text to speak. The
checkpoint's chat template renders it (an audio part is `<|audio_out_bos|><|AUDIO_OUT|>
<|audio_eos|>`, the generation prompt ends in `<|audio_out_bos|>`, added if a template does not).

A clip's codes [N, T] become the processor's delayed block: a bos column before and an eos
column after ([N, T + 2]), codebook k shifted k steps later (bos before, eos after), [N, T + N + 1];
its placeholder expands to T + 2 `<|AUDIO_OUT|>` ids and N - 1 delay ids, whose positions
take the block's frame embeddings (as `HiggsAudioV2Processor` expands `<|AUDIO_OUT|>`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from omni_actors.models.higgs_audio_v2 import VOICES

SYSTEM = "Generate audio following instruction."
DEFAULT_SCENE = "Audio is recorded from a quiet room."
DEFAULT_VOICE = VOICES[0]
"""`default`: the text as it is (the model picks a voice); `SPEAKER0` / `SPEAKER1`: the text tagged
"[SPEAKER0] " / "[SPEAKER1] ", Higgs's multi-speaker script tags."""


def spoken(text: str, voice: str) -> str:
    return text if voice == DEFAULT_VOICE else f"[{voice}] {text}"


def conversation(text: str, scene: str | None, ref_text: str | None) -> list[dict[str, Any]]:
    """The chat of one request (`ref_text` not None: a clip to clone precedes the text)."""
    system = f"{SYSTEM}\n\n<|scene_desc_start|>\n{scene or DEFAULT_SCENE}\n<|scene_desc_end|>"
    chat: list[dict[str, Any]] = [{"role": "system", "content": [{"type": "text", "text": system}]}]
    if ref_text is not None:
        chat.append({"role": "user", "content": [{"type": "text", "text": ref_text}]})
        chat.append({"role": "assistant", "content": [{"type": "audio"}]})
    chat.append({"role": "user", "content": [{"type": "text", "text": text}]})
    return chat


def delayed(codes: np.ndarray, bos: int, eos: int) -> np.ndarray:
    """[N, T] clip codes -> [T + N + 1, N] steps of the delayed block (bos/eos framed)."""
    n, t = codes.shape
    framed = np.concatenate([np.full((n, 1), bos), codes, np.full((n, 1), eos)], axis=1)  # [N, T + 2]
    out = np.empty((n, t + 2 + n - 1), dtype=np.int64)
    for k in range(n):
        out[k, :k] = bos
        out[k, k : k + t + 2] = framed[k]
        out[k, k + t + 2 :] = eos
    return out.T


def expand_ids(ids: list[int], audio_id: int, delay_id: int, blocks: list[int], groups: int) -> list[int]:
    """Each `audio_id` in `ids` -> (steps - groups + 1) audio ids and groups - 1 delay ids, for the
    blocks' step counts in order; ValueError when the counts disagree."""
    out: list[int] = []
    pending = iter(blocks)
    for tok in ids:
        if tok != audio_id:
            out.append(tok)
            continue
        steps = next(pending, None)
        if steps is None:
            raise ValueError("reference_audio: the chat template placed more audio than the request has")
        out += [audio_id] * (steps - groups + 1) + [delay_id] * (groups - 1)
    if next(pending, None) is not None:
        raise ValueError("reference_audio: the chat template has no place for the reference clip")
    return out
