"""HfAREngine with the generic causal-LM adapter on a tiny Llama checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import structlog

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.models.tiny import make_tiny  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.hf_ar import HfAREngine  # noqa: E402

ADAPTER = "omni_actors.workers.engines.hf_ar:CausalLMAdapter"
PROMPTS = ["Hello there", "The quick brown fox jumps", "A", "Once upon a time there was"]


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return make_tiny("llama", tmp_path_factory.mktemp("llama"), seed=0)


def _ctx(path: Path, **extras) -> EngineContext:
    return EngineContext(
        stage_id=0, replica=0, model_stage="llm", model_path=path, device="cpu", max_num_seqs=8,
        dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"adapter": ADAPTER, **extras},
    )  # fmt: skip


@pytest.fixture(scope="module")
def engine(llama_dir) -> HfAREngine:
    return HfAREngine(_ctx(llama_dir))


def _drain(engine: HfAREngine) -> dict[str, dict]:
    got: dict[str, dict] = {}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            rec = got.setdefault(out.request_id, {"ids": [], "text": "", "finished": 0, "steps": 0})
            rec["ids"] += out.payload["token_ids"]
            rec["text"] += out.payload["text"]
            rec["finished"] += out.finished
            rec["steps"] += 1
    return got


def test_greedy_matches_generate_and_streams_every_step(engine):
    params = {"max_tokens": 10, "ignore_eos": True}
    engine.add("a", {"prompt": PROMPTS[1]}, params)
    got = _drain(engine)["a"]
    tok, model = engine.adapter.tokenizer, engine.adapter.model
    ids = tok(PROMPTS[1], return_tensors="pt").input_ids
    want = model.generate(ids, max_new_tokens=10, min_new_tokens=10, do_sample=False)
    assert got["ids"] == want[0, ids.shape[1] :].tolist()
    assert got["steps"] == 10 and got["finished"] == 1
    assert got["text"] == tok.decode(got["ids"], skip_special_tokens=True)


def test_the_first_output_carries_the_prompt_tokens(engine):
    """A route that cuts the text at `stop` aborts the request before its last payload: the usage's
    prompt_tokens must come with the first (it was 0 on such answers)."""
    engine.add("p", {"prompt": PROMPTS[1]}, {"max_tokens": 3, "ignore_eos": True})
    firsts = []
    while engine.has_work():
        firsts += [o.payload for o in engine.step() if o.request_id == "p"]
    want = len(engine.adapter.tokenizer(PROMPTS[1]).input_ids)
    assert firsts[0]["prompt_tokens"] == want and firsts[-1]["prompt_tokens"] == want
    assert "prompt_tokens" not in firsts[1]


def test_four_concurrent_requests_equal_each_alone(engine):
    params = {"max_tokens": 12, "ignore_eos": True}
    alone = {}
    for i, prompt in enumerate(PROMPTS):
        engine.add(f"r{i}", {"prompt": prompt}, params)
        alone.update(_drain(engine))
    for i, prompt in enumerate(PROMPTS):
        engine.add(f"r{i}", {"prompt": prompt}, {**params, "max_tokens": 6 + 2 * i})
    together = _drain(engine)
    for i in range(4):
        assert together[f"r{i}"]["ids"] == alone[f"r{i}"]["ids"][: 6 + 2 * i]


def test_seeded_sampling_is_reproducible_and_independent(engine):
    params = {"max_tokens": 8, "ignore_eos": True, "temperature": 1.0, "top_k": 50, "seed": 7}
    engine.add("s1", {"prompt": "Hello"}, params)
    first = _drain(engine)["s1"]["ids"]
    engine.add("s1", {"prompt": "Hello"}, params)
    engine.add("s2", {"prompt": "Hello"}, {**params, "seed": 8})
    both = _drain(engine)
    assert both["s1"]["ids"] == first
    assert both["s2"]["ids"] != first


def test_abort_drops_request_mid_stream(engine):
    params = {"max_tokens": 50, "ignore_eos": True}
    engine.add("keep", {"prompt": "Hello"}, params)
    engine.add("drop", {"prompt": "Hello"}, params)
    seen = [o.request_id for o in engine.step()]
    assert sorted(seen) == ["drop", "keep"]
    engine.abort("drop")
    engine.abort("never-added")
    got = _drain(engine)
    assert "drop" not in got and len(got["keep"]["ids"]) == 49


def test_bad_prompt_fails_only_that_request(engine):
    with pytest.raises(ValueError, match="prompt"):
        engine.add("bad", {"nothing": 1}, {})
    assert not engine.has_work()


def _failures(engine: HfAREngine) -> tuple[dict[str, str], dict[str, int], list[dict]]:
    """Run to the end: (request id -> its error, request id -> tokens made, worker.request_failed lines)."""
    errors: dict[str, str] = {}
    made: dict[str, int] = {}
    with structlog.testing.capture_logs() as logs:
        while engine.has_work():
            for out in engine.step():
                if out.error:
                    errors[out.request_id] = out.error
                made[out.request_id] = made.get(out.request_id, 0) + len(out.payload.get("token_ids", []))
    return errors, made, [e for e in logs if e["event"] == "worker.request_failed"]


def test_a_request_that_fails_in_the_engine_is_logged_once(engine):
    """A failure inside a step (here: a token id past the vocabulary, an IndexError at the embedding) was
    only an error output: the caller got a 500 and the worker's log said nothing."""
    vocab = engine.adapter.model.config.vocab_size
    params = {"max_tokens": 4, "ignore_eos": True}
    engine.add("good", {"prompt": "Hello"}, params)
    engine.add("bad", {"prompt_token_ids": [1, vocab + 5]}, params)
    errors, made, logged = _failures(engine)
    assert set(errors) == {"bad"} and errors["bad"].startswith("IndexError") and made["good"] == 4
    assert len(logged) == 1, logged
    line = logged[0]
    assert line["log_level"] == "error" and line["request_id"] == "bad" and line["rejected"] is False
    assert "IndexError" in line["error"]


def test_a_prompt_past_the_context_is_logged_once_as_a_warning(llama_dir):
    engine = HfAREngine(_ctx(llama_dir, max_model_len=16))
    engine.add("long", {"prompt": " ".join(["word"] * 40)}, {"max_tokens": 4, "ignore_eos": True})
    engine.add("fills", {"prompt": "Hello"}, {"max_tokens": 40, "ignore_eos": True})  # full mid-decode
    errors, made, logged = _failures(engine)
    assert set(errors) == {"long"}  # "fills" only filled the cache: it ended with "length", no failure
    assert made["fills"] == 16 - len(engine.adapter.tokenizer("Hello").input_ids) + 1
    assert [e["request_id"] for e in logged] == ["long"]  # one line
    line = logged[0]
    assert line["log_level"] == "warning" and line["rejected"] is True and "ContextLengthExceeded" in line["error"]


@pytest.mark.parametrize("damage", ["missing_weights", "missing_config", "bad_json"])
def test_corrupt_checkpoint_names_the_file(llama_dir, tmp_path, damage):
    broken = tmp_path / "broken"
    shutil.copytree(llama_dir, broken)
    if damage == "missing_weights":
        (broken / "model.safetensors").unlink()
        name = "model.safetensors"
    elif damage == "missing_config":
        (broken / "config.json").unlink()
        name = "config.json"
    else:
        (broken / "config.json").write_text("{not json")
        name = "config.json"
    with pytest.raises((FileNotFoundError, ValueError), match=name):
        HfAREngine(_ctx(broken))


def test_max_num_seqs_bounds_running_requests(llama_dir):
    engine = HfAREngine(_ctx_limited(llama_dir, 2))
    params = {"max_tokens": 5, "ignore_eos": True}
    for i, prompt in enumerate(PROMPTS):
        engine.add(f"r{i}", {"prompt": prompt}, params)
    most = 0
    got: dict[str, list] = {}
    while engine.has_work():
        for out in engine.step():
            got.setdefault(out.request_id, []).extend(out.payload["token_ids"])
        most = max(most, sum(1 for s in engine.seqs.values() if s.prefilled))
    assert most <= 2 and all(len(got[f"r{i}"]) == 5 for i in range(4))


def _ctx_limited(path: Path, limit: int) -> EngineContext:
    import dataclasses

    return dataclasses.replace(_ctx(path), max_num_seqs=limit)
