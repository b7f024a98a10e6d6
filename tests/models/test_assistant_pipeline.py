"""The assistant pipeline's topology, planner, processors and preparation (no model runs)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from omni_actors.config.pipeline import ExecutionType, get_pipeline, resolve
from omni_actors.models.assistant import prepare as prep
from omni_actors.models.assistant.processors import (
    asr_to_llm,
    llm_to_tts,
    llm_to_tts_chunk,
    split_sentences,
    tts_to_vocoder,
    tts_to_vocoder_chunk,
)
from omni_actors.orchestrator.requests import RequestSpec


def test_topology():
    p = get_pipeline("assistant")
    assert [s.model_stage for s in p.stages] == ["asr", "llm", "tts", "vocoder"]
    assert [s.input_sources for s in p.stages] == [(), (0,), (1,), (2,)]
    assert [s.subdir for s in p.stages] == ["asr", "llm", "tts", "vocoder"]
    assert p.stage(1).execution_type is ExecutionType.LLM_AR
    assert p.stage(3).execution_type is ExecutionType.LLM_GENERATION
    assert p.output_types() == {"transcript", "text", "audio"}
    for spec in p.stages:  # every named function exists
        for ref in (spec.processor, spec.chunk_processor):
            if ref:
                assert callable(resolve(ref))
    assert callable(resolve(p.planner))


def test_imports_without_torch_or_onnx():
    code = (
        "import sys; from omni_actors.config.pipeline import get_pipeline; get_pipeline('assistant');"
        "heavy = {'torch', 'onnx', 'onnxruntime', 'faster_whisper', 'transformers'} & set(sys.modules);"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize(
    ("inputs", "params", "stages"),
    [
        ({"audio": np.zeros(16000, np.float32)}, {}, (0, 1, 2, 3)),
        ({"audio": np.zeros(160, np.float32)}, {"modalities": ["text"]}, (0, 1)),
        ({"audio": np.zeros(160, np.float32)}, {"modalities": ["transcript"]}, (0,)),
        ({"messages": [{"role": "user", "content": "hi"}]}, {}, (1, 2, 3)),
        ({"messages": [{"role": "user", "content": "hi"}]}, {"modalities": ["text"]}, (1,)),
        ({"prompt": "hi"}, {"modalities": ["text", "audio"]}, (1, 2, 3)),
        ({"text": "Say this."}, {}, (2, 3)),
    ],
)
def test_planner(inputs, params, stages):
    p = get_pipeline("assistant")
    assert resolve(p.planner)(p, RequestSpec(inputs=inputs, params=params)) == stages


def test_planner_rejects_empty_request():
    p = get_pipeline("assistant")
    with pytest.raises(ValueError):
        resolve(p.planner)(p, RequestSpec(inputs={}))


def test_split_sentences():
    text = "Hello Mr. Smith. Pi is 3.14 today! Really? e.g. this. Unfinished"
    done, rest = split_sentences(text)
    assert done == ["Hello Mr. Smith.", "Pi is 3.14 today!", "Really?", "e.g. this."]
    assert rest == " Unfinished"
    assert split_sentences(text, final=True) == ([*done, "Unfinished"], "")
    long_clause = "word, " * 60
    done, rest = split_sentences(long_clause)
    assert done and all(len(s) <= 160 for s in done) and len(rest) <= 160


def test_processors():
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    inputs = asr_to_llm({0: [{"text": " What time is it? "}]}, {"messages": history})
    assert inputs == {"messages": [*history, {"role": "user", "content": "What time is it?"}]}
    assert llm_to_tts({1: [{"text": "One. "}, {"text": "Two."}]}, {}) == {"text": "One. Two."}
    state: dict = {}
    assert llm_to_tts_chunk(1, {"text": "One. Tw"}, False, {}, state) == {"text": "One."}
    assert llm_to_tts_chunk(1, {"text": "o"}, False, {}, state) is None
    assert llm_to_tts_chunk(1, {"text": ""}, True, {}, state) == {"text": "Two"}
    assert llm_to_tts_chunk(1, {}, True, {}, {}) == {"text": ""}  # last always answers
    a, b = np.ones((192, 3), np.float32), np.zeros((192, 2), np.float32)
    assert tts_to_vocoder({2: [{"latent": a}, {"latent": b}]}, {})["latent"].shape == (192, 5)
    assert tts_to_vocoder({2: [{"text": ""}]}, {})["latent"].shape == (192, 0)
    assert tts_to_vocoder_chunk(2, {"latent": a}, False, {}, {})["latent"] is a
    assert tts_to_vocoder_chunk(2, {"latent": b[:, :0]}, False, {}, {}) is None
    assert tts_to_vocoder_chunk(2, {"latent": b[:, :0]}, True, {}, {})["latent"].shape == (192, 0)


def test_asr_to_llm_replaces_the_chat_audio_part():
    """A chat request's audio part (api/chat_inputs.py) becomes the transcript, in place."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "input_audio", "array": "audio_1", "sample_rate": 16000}]},
        {"role": "assistant", "content": "Yes?"},
        {"role": "user", "content": [{"type": "text", "text": "Listen:"},
                                     {"type": "input_audio", "array": "audio", "sample_rate": 22050}]},
    ]
    inputs = asr_to_llm({0: [{"text": " What is the capital of France?"}]}, {"messages": messages})
    assert inputs == {"messages": [
        messages[0],
        {"role": "user", "content": ""},
        messages[2],
        {"role": "user", "content": "Listen: What is the capital of France?"},
    ]}


def test_prepare_is_idempotent_and_atomic(tmp_path, monkeypatch):
    """With only the cheap Piper parts: build, skip when ready, rebuild a part left unfinished."""
    monkeypatch.setattr(prep, "PARTS", {"tts": prep._build_tts, "vocoder": prep._build_vocoder})
    lines: list[str] = []
    assert prep.prepare(tmp_path, progress=lines.append) == tmp_path
    assert lines[-1].startswith("[2/2] vocoder: done")
    assert prep.is_prepared(tmp_path)
    stamp = (tmp_path / "tts" / "model.onnx").stat().st_mtime_ns
    assert json.loads((tmp_path / "tts" / prep.MARKER).read_text())["version"] == prep.PREPARE_VERSION

    lines.clear()
    prep.prepare(tmp_path, progress=lines.append)
    assert lines == ["[1/2] tts: ready", "[2/2] vocoder: ready"]
    assert (tmp_path / "tts" / "model.onnx").stat().st_mtime_ns == stamp

    (tmp_path / "vocoder" / prep.MARKER).unlink()  # as if interrupted before completion
    assert not prep.is_prepared(tmp_path)
    lines.clear()
    prep.prepare(tmp_path, progress=lines.append)
    assert lines[0] == "[1/2] tts: ready" and lines[-1].startswith("[2/2] vocoder: done")
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "tts", "vocoder"]


def test_first_piece_may_be_a_clause_later_pieces_are_sentences() -> None:
    from omni_actors.models.assistant.processors import llm_to_tts_chunk

    state: dict = {}
    deltas = ["Well, ", "one day a cat named Luna", " wandered into the forest, where", " she met a fox", ". Then, she left. "]
    outs = [llm_to_tts_chunk(1, {"text": d}, False, {}, state) for d in deltas]
    outs.append(llm_to_tts_chunk(1, {"text": "Bye"}, True, {}, state))
    pieces = [o["text"] for o in outs if o]
    assert pieces[0] == "Well, one day a cat named Luna wandered into the forest,"  # a clause, >= 20 chars
    assert pieces[1:] == ["where she met a fox. Then, she left.", "Bye"]  # then whole sentences only
