"""VllmAREngine on a real vLLM engine with a tiny random-weight Llama checkpoint."""

from __future__ import annotations

import dataclasses
import os
from collections import defaultdict
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

pytest.importorskip("vllm")

from omni_actors.workers.engine import EngineContext, EngineOutput
from omni_actors.workers.engines.vllm_ar import VllmAREngine

MAX_STEPS = 500
GREEDY = {"temperature": 0.0, "ignore_eos": True}
MESSAGES = [{"role": "user", "content": "Hello, how are you today?"}]


def _ctx(model_path: Path, cache_dir: Path, **changes) -> EngineContext:
    ctx = EngineContext(
        stage_id=0,
        replica=0,
        model_stage="thinker",
        model_path=model_path,
        device="cpu",
        max_num_seqs=8,
        dtype="float32",
        gpu_memory_utilization=0.5,
        tensor_parallel_size=1,
        engine_extras={
            "max_model_len": 512,
            "kv_cache_space_gib": 1,
            "enable_prompt_embeds": True,
            "cache_dir": str(cache_dir),  # shared, so the second engine starts warm
        },
    )
    return dataclasses.replace(ctx, **changes)


@pytest.fixture(scope="module")
def model_path(tiny_model) -> Path:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def cache_dir(vllm_cache) -> Path:
    return vllm_cache  # the run's (tests/conftest.py): warm if an earlier module started a Llama


@pytest.fixture(scope="module")
def children_before() -> dict[int, str]:
    """This process's children before the module's engine: others' (say, a compile worker pool an
    earlier module started, exiting now) are not the engine's to release."""
    return child_processes()


@pytest.fixture(scope="module")
def engine(model_path, cache_dir, children_before):
    eng = VllmAREngine(_ctx(model_path, cache_dir))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def tokenizer(model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def run(engine: VllmAREngine) -> tuple[dict[str, list[EngineOutput]], list[list[str]]]:
    """Step until idle; outputs per request, and the request ids seen in each step."""
    outs: dict[str, list[EngineOutput]] = defaultdict(list)
    steps = []
    for _ in range(MAX_STEPS):
        if not engine.has_work():
            break
        batch = engine.step()
        steps.append([o.request_id for o in batch])
        for o in batch:
            outs[o.request_id].append(o)
    assert not engine.has_work(), "engine still busy after MAX_STEPS"
    return outs, steps


def token_ids(outputs: list[EngineOutput]) -> list[int]:
    return [t for o in outputs for t in o.payload["token_ids"]]


def generate(engine, rid, inputs, params) -> list[EngineOutput]:
    engine.add(rid, inputs, params)
    outs, _ = run(engine)
    return outs[rid]


def test_greedy_is_deterministic(engine):
    first = generate(engine, "g1", {"messages": MESSAGES}, {**GREEDY, "max_tokens": 12, "seed": 7})
    second = generate(engine, "g2", {"messages": MESSAGES}, {**GREEDY, "max_tokens": 12, "seed": 7})
    assert len(token_ids(first)) == 12
    assert token_ids(first) == token_ids(second)
    assert [o.payload["text"] for o in first] == [o.payload["text"] for o in second]


def test_stream_deltas_concatenate_to_full_text(engine, tokenizer):
    outs = generate(engine, "s", {"messages": MESSAGES}, {**GREEDY, "max_tokens": 10})
    assert len(outs) > 1
    assert all(len(o.payload["token_ids"]) >= 1 for o in outs)
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    ids = token_ids(outs)
    # A random model emits raw byte tokens; the streaming detokenizer holds back
    # an incomplete UTF-8 sequence, so only a trailing one may be missing.
    full = tokenizer.decode(ids, skip_special_tokens=True).rstrip("\ufffd")
    assert "".join(o.payload["text"] for o in outs) == full
    last = outs[-1].payload
    prompt = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert last["finish_reason"] == "length"
    assert last["prompt_tokens"] == len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert last["completion_tokens"] == len(ids) == 10
    assert outs[-1].error is None


def test_prompt_forms_agree(engine, tokenizer):
    """messages, the rendered prompt text and its token ids are one and the same prompt."""
    text = tokenizer.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    params = {**GREEDY, "max_tokens": 6}
    from_messages = token_ids(generate(engine, "m", {"messages": MESSAGES}, params))
    from_ids = token_ids(generate(engine, "i", {"prompt_token_ids": ids}, params))
    assert from_messages == from_ids
    plain = generate(engine, "p", {"prompt": "The quick brown fox"}, params)
    assert plain[-1].payload["prompt_tokens"] == len(tokenizer("The quick brown fox")["input_ids"])


def test_prompt_embeds_match_token_ids(engine, model_path, tokenizer):
    from safetensors.numpy import load_file

    table = load_file(model_path / "model.safetensors")["model.embed_tokens.weight"]
    ids = tokenizer("The quick brown fox", add_special_tokens=False)["input_ids"]
    params = {**GREEDY, "max_tokens": 6}
    from_ids = generate(engine, "t", {"prompt_token_ids": ids}, params)
    from_embeds = generate(engine, "e", {"prompt_embeds": table[ids]}, params)
    assert token_ids(from_embeds) == token_ids(from_ids)
    assert from_embeds[-1].payload["prompt_tokens"] == len(ids)


def test_max_tokens_honoured(engine):
    for n in (1, 5):
        outs = generate(
            engine, f"n{n}", {"prompt": "Once upon a time"}, {**GREEDY, "max_tokens": n}
        )
        assert len(token_ids(outs)) == n
        assert outs[-1].payload == {
            **outs[-1].payload,
            "completion_tokens": n,
            "finish_reason": "length",
        }


def test_sampling_constraints_override_request_params(engine):
    prompt = {"prompt": "A pipeline is"}
    greedy = token_ids(generate(engine, "c0", prompt, {**GREEDY, "max_tokens": 16}))
    sampled = [
        token_ids(
            generate(
                engine,
                f"c{s}",
                prompt,
                {"temperature": 1.5, "seed": s, "max_tokens": 16, "ignore_eos": True},
            )
        )
        for s in (1, 2, 3)
    ]
    assert any(ids != greedy for ids in sampled), "sampling never left the greedy path"
    base = engine.ctx
    engine.ctx = dataclasses.replace(
        base, default_sampling_params={"max_tokens": 40}, sampling_constraints={"temperature": 0.0}
    )
    try:
        forced = [
            token_ids(
                generate(
                    engine,
                    f"f{s}",
                    prompt,
                    {"temperature": 1.5, "seed": s, "max_tokens": 16, "ignore_eos": True},
                )
            )
            for s in (1, 2, 3)
        ]
        defaulted = token_ids(generate(engine, "d", prompt, {"ignore_eos": True}))
    finally:
        engine.ctx = base
    assert forced == [greedy] * 3
    assert len(defaulted) == 40  # the deploy default filled the missing max_tokens
    assert defaulted[:16] == greedy


def test_abort_mid_stream_leaves_other_request_running(engine):
    params = {**GREEDY, "max_tokens": 30}
    engine.add("keep", {"prompt": "Hello"}, params)
    engine.add("drop", {"prompt": "Speech, text"}, params)
    seen: dict[str, list[EngineOutput]] = defaultdict(list)
    while len(seen["drop"]) < 3:
        for o in engine.step():
            seen[o.request_id].append(o)
    engine.abort("drop")
    engine.abort("drop")  # a second abort, and an unknown id, are ignored
    engine.abort("never-added")
    after, _ = run(engine)
    assert "drop" not in after
    assert all(not o.finished for o in seen["drop"])
    keep = seen["keep"] + after["keep"]
    assert keep[-1].finished and keep[-1].payload["completion_tokens"] == 30
    assert len(token_ids(keep)) == 30


def test_invalid_request_fails_alone(engine):
    engine.add("ok", {"prompt": "Hello"}, {**GREEDY, "max_tokens": 4})
    with pytest.raises(ValueError, match="temperature"):
        engine.add("bad", {"prompt": "Hello"}, {"temperature": -1.0})
    with pytest.raises(ValueError):
        engine.add("bad", {"prompt": "Hello"}, {"max_tokens": 0})
    with pytest.raises(ValueError):
        engine.add("bad", {"text": "no prompt key"}, {})
    with pytest.raises(ValueError):
        engine.add("ok", {"prompt": "Hello"}, {})  # id already running
    outs, _ = run(engine)
    assert set(outs) == {"ok"}
    assert outs["ok"][-1].finished and len(token_ids(outs["ok"])) == 4
    # The failed id is free to use again.
    assert (
        len(token_ids(generate(engine, "bad", {"prompt": "Hello"}, {**GREEDY, "max_tokens": 2})))
        == 2
    )


def test_concurrent_requests_are_batched_and_match_solo_runs(engine):
    prompts = {"a": "The quick brown fox", "b": "Hello, how are", "c": "0123456789"}
    params = {**GREEDY, "max_tokens": 8}
    solo = {
        rid: token_ids(generate(engine, rid, {"prompt": p}, params)) for rid, p in prompts.items()
    }
    for rid, p in prompts.items():
        engine.add(rid, {"prompt": p}, params)
    outs, steps = run(engine)
    assert {rid: token_ids(o) for rid, o in outs.items()} == solo
    assert max(len(s) for s in steps) == 3  # one step advanced all three
    assert len(steps) < 3 * 8


def child_processes() -> dict[int, str]:
    """Live and zombie child processes, minus Python's own multiprocessing resource tracker
    (one per parent process, started by the first spawn, exits with its parent)."""
    import psutil

    found = {}
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = " ".join(proc.cmdline()) if proc.status() != psutil.STATUS_ZOMBIE else ""
            if "resource_tracker" not in cmdline:
                found[proc.pid] = f"{proc.name()} ({proc.status()})"
        except psutil.NoSuchProcess:
            pass
    return found


def left_behind(pids) -> list[int]:
    """Those of `pids` still running, or dead but not reaped by this process."""
    import psutil

    left = []
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE or proc.ppid() == os.getpid():
                left.append(pid)
        except psutil.NoSuchProcess:
            pass
    return left


@pytest.mark.slow  # (30 s: a second vLLM engine; the multiprocess mode is not the served default)
def test_multiprocess_engine_matches_and_closes_cleanly(model_path, cache_dir, engine):
    inproc = token_ids(generate(engine, "x", {"prompt": "Hello"}, {**GREEDY, "max_tokens": 5}))
    before = child_processes()
    extras = {"max_model_len": 512, "multiprocess": True, "cache_dir": str(cache_dir)}
    mp = VllmAREngine(_ctx(model_path, cache_dir, engine_extras=extras))
    private = mp._private_dir
    try:
        started = set(child_processes()) - set(before)
        assert started, "multiprocess mode started no process"
        assert any((private / "rpc").iterdir()), "no vLLM IPC socket in the private folder"
        outs = generate(mp, "x", {"prompt": "Hello"}, {**GREEDY, "max_tokens": 5})
    finally:
        mp.close()
    assert token_ids(outs) == inproc
    assert left_behind(started) == []
    assert not private.exists()


def test_bad_engine_extras_fail_start_and_leave_nothing(model_path, cache_dir):
    import tempfile

    temp = Path(tempfile.gettempdir())
    before = set(temp.glob("omni-vllm-*"))
    env_before = {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_HUB"))}
    with pytest.raises(ValueError, match="unknown engine_extras"):
        VllmAREngine(_ctx(model_path, cache_dir, engine_extras={"max_model_len": 512, "bogus": 1}))
    with pytest.raises(ValueError, match="kv_cache_space_gib"):
        VllmAREngine(_ctx(model_path, cache_dir, engine_extras={"kv_cache_space_gib": "lots"}))
    assert set(temp.glob("omni-vllm-*")) == before
    assert {k: v for k, v in os.environ.items() if k.startswith(("VLLM_", "HF_HUB"))} == env_before


def test_close_releases_everything(model_path, engine, children_before):
    private = engine._private_dir
    assert private.exists()
    engine.add("late", {"prompt": "Hello"}, {**GREEDY, "max_tokens": 50})
    engine.step()
    engine.close()
    engine.close()  # idempotent
    assert not private.exists()
    assert (
        "VLLM_RPC_BASE_PATH" not in os.environ
        or str(private) not in os.environ["VLLM_RPC_BASE_PATH"]
    )
    assert not engine.has_work()
    assert {pid: what for pid, what in child_processes().items() if pid not in children_before} == {}
