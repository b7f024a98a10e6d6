"""Helpers for the assistant model tests: prepared weights, engine contexts, WER.

The weights are prepared once into the shared data folder (OMNI_DATA_DIR, else
~/.cache/omni-actors) and reused by every later run.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from omni_actors.models.assistant.prepare import prepare
from omni_actors.workers.engine import EngineContext, EngineOutput, StageEngine

LIBRIVOX = Path("/usr/share/pocketsphinx/test/data/librivox")
STAGE_IDS = {"asr": 0, "llm": 1, "tts": 2, "vocoder": 3}


@pytest.fixture(scope="session")
def assistant_dir() -> Path:
    return prepare(progress=None)


def engine_ctx(data_dir: Path, stage: str, max_num_seqs: int = 8, **extras: Any) -> EngineContext:
    return EngineContext(
        stage_id=STAGE_IDS[stage],
        replica=0,
        model_stage=stage,
        model_path=data_dir / stage,
        device="cpu",
        max_num_seqs=max_num_seqs,
        dtype="float32",
        gpu_memory_utilization=0.0,
        tensor_parallel_size=1,
        engine_extras=extras,
    )


def drain(engine: StageEngine) -> dict[str, list[EngineOutput]]:
    """Step until idle; every output by request. Fails on any error output."""
    outputs: dict[str, list[EngineOutput]] = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            outputs.setdefault(out.request_id, []).append(out)
    return outputs


# -- word error rate ------------------------------------------------------------

_SPELLINGS = {"mister": "mr", "missus": "mrs", "doctor": "dr", "ok": "okay"}


def normalize(text: str) -> list[str]:
    """Lower case, no punctuation, hyphens split words, a few spellings unified."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"[^a-z0-9' ]+", " ", text)
    words = [w.strip("'") for w in text.split()]
    return [_SPELLINGS.get(w, w) for w in words if w]


def edit_distance(ref: list[str], hyp: list[str]) -> int:
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev_diag, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev_diag, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev_diag + (r != h))
    return row[-1]


def wer(refs: list[str], hyps: list[str]) -> float:
    """Corpus word error rate: total edits over total reference words, after normalising."""
    pairs = [(normalize(r), normalize(h)) for r, h in zip(refs, hyps, strict=True)]
    words = sum(len(r) for r, _ in pairs)
    return sum(edit_distance(r, h) for r, h in pairs) / max(1, words)
