"""HfAREngine's fused decode step (engine_extras fused_decode, hf_ar_fused.py) on CPU.

Real engines load tiny random-weight checkpoints in the Hugging Face format
(llama: GQA, no bias; qwen2: q/k/v bias, tied embeddings; qwen3: q_norm/k_norm;
llama with linear, qwen2 with yarn rope scaling). The fused step's logits must equal
transformers' own full forward over the same tokens, step after step, with rows
of different lengths joining and leaving one batch; greedy and seeded token
streams must be the same with the fused step on and off; a model it cannot
fuse keeps the normal step and says so once. The `gpu` tests (not in the default
suite: `pytest -m gpu tests/workers/test_hf_ar_fused.py`) run the fused step under CUDA
graphs, with and without torch.compile.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
structlog = pytest.importorskip("structlog")

from omni_actors.models.tiny import make_tiny  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.hf_ar import HfAREngine  # noqa: E402
from omni_actors.workers.engines.hf_ar_fused import FusedDecoder  # noqa: E402

ADAPTER = "omni_actors.workers.engines.hf_ar:CausalLMAdapter"
SIZES = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
# (prompt length, max_tokens, step at which it is added)
SCHEDULE = [(3, 4, 0), (11, 9, 0), (6, 9, 0), (17, 5, 2), (2, 6, 5)]


def _build(out: Path, kind: str, **config) -> Path:
    """A tiny checkpoint of `kind` in `out`: make_tiny's llama folder (tokenizer, generation
    config), its model replaced by a random `kind` model with every weight and bias drawn."""
    import transformers

    make_tiny("llama", out, seed=0)
    vocab = json.loads((out / "config.json").read_text())["vocab_size"]
    cls_config, cls_model = {
        "llama": ("LlamaConfig", "LlamaForCausalLM"),
        "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
        "mistral": ("MistralConfig", "MistralForCausalLM"),
    }[kind]
    cfg = getattr(transformers, cls_config)(vocab_size=vocab, rms_norm_eps=1e-6, **SIZES, **config)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1)
        model = getattr(transformers, cls_model)(cfg)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if p.dim() > 1:
                    p.normal_(0.0, 0.2)
                else:  # norms and biases: not ones and zeros, so a dropped one shows
                    p.copy_(
                        (1.0 if name.endswith("norm.weight") else 0.0) + 0.3 * torch.randn_like(p)
                    )
    (out / "model.safetensors").unlink()
    model.save_pretrained(out, safe_serialization=True)
    return out


MODELS = {
    "llama": ("llama", {}),
    "qwen2": ("qwen2", {"rope_theta": 1000000.0, "tie_word_embeddings": True}),
    "qwen3": ("qwen3", {}),
    "llama_linear_rope": ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                        "rope_theta": 10000.0}}),
    "qwen2_yarn": ("qwen2", {"max_position_embeddings": 128, "rope_parameters": {
        "rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6, "original_max_position_embeddings": 32}}),
}  # fmt: skip


@pytest.fixture(scope="module", params=sorted(MODELS))
def model_dir(request, tmp_path_factory) -> Path:
    kind, config = MODELS[request.param]
    return _build(tmp_path_factory.mktemp(request.param), kind, **config)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory) -> Path:
    return _build(tmp_path_factory.mktemp("llama_plain"), "llama")


def _ctx(path: Path, slots: int = 4, device: str = "cpu", **extras) -> EngineContext:
    return EngineContext(
        stage_id=0, replica=0, model_stage="llm", model_path=path, device=device,
        max_num_seqs=slots, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
        engine_extras={"adapter": ADAPTER, "max_model_len": 48, **extras},
    )  # fmt: skip


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 400, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _run(engine: HfAREngine, params: dict | None = None, peek=None) -> dict[str, list[int]]:
    """Add SCHEDULE's requests at their steps and drain; `peek(engine)` after every step."""
    ids: dict[str, list[int]] = {}
    pending = [(f"r{i}", *item) for i, item in enumerate(SCHEDULE)]
    step = 0
    while pending or engine.has_work():
        while pending and pending[0][3] <= step:
            rid, n, max_tokens, _ = pending.pop(0)
            p = {"max_tokens": max_tokens, "ignore_eos": True, **(params or {})}
            engine.add(rid, {"prompt_token_ids": _prompt(n, int(rid[1:]))}, p)
        step += 1
        if engine.has_work():
            for out in engine.step():
                assert out.error is None, out.error
                ids.setdefault(out.request_id, []).extend(out.payload["token_ids"])
            if peek is not None and any(s.prefilled for s in engine.seqs.values()):
                peek(engine)
    return ids


def test_fused_logits_equal_transformers_forward(model_dir):
    """After every engine step: one fused decode forward of every running row (the step the
    engine runs next) against transformers' full forward over that row's tokens."""
    from transformers import AutoModelForCausalLM

    engine = HfAREngine(
        _ctx(model_dir, kv_cache="static", fused_decode=True, lookahead=False)
    )  # peek steps too
    assert isinstance(engine.fused, FusedDecoder) and engine.fused.from_ids
    from_embeds = FusedDecoder(engine.model, engine.slots, 48, from_ids=False)
    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    checked = {"steps": 0, "rows": 0, "mixed": 0}

    def peek(engine: HfAREngine) -> None:
        seqs = [s for s in engine.seqs.values() if s.prefilled]
        with torch.inference_mode():
            batch, length = engine.slots.shape_for()
            embeds = engine.adapter.decode_embeds(seqs)
            rows = engine.slots.load_inputs(batch, seqs, embeds)
            got = engine.fused.forward(batch, length).rows(rows)
            alt = from_embeds.forward(batch, length).rows(rows)  # the adapter's embeddings
            want = torch.cat([
                ref(torch.tensor([s.data["ids"] + s.tokens])).logits[:, -1] for s in seqs
            ])  # fmt: skip
        torch.testing.assert_close(got.logits, want, atol=2e-4, rtol=2e-4)
        torch.testing.assert_close(alt.logits, got.logits, atol=0, rtol=0)
        assert got.tokens.tolist() == want.argmax(-1).tolist()
        checked["steps"] += 1
        checked["rows"] += len(seqs)
        checked["mixed"] += len({s.cached for s in seqs}) > 1

    ids = _run(engine, peek=peek)
    assert [len(ids[f"r{i}"]) for i in range(len(SCHEDULE))] == [n for _, n, _ in SCHEDULE]
    assert checked["steps"] >= 10 and checked["mixed"] >= 5 and checked["rows"] >= 30
    assert engine.slots.owners == []


def test_greedy_streams_same_with_fused_on_and_off(model_dir):
    off = _run(HfAREngine(_ctx(model_dir, kv_cache="static")))
    on = _run(HfAREngine(_ctx(model_dir, kv_cache="static", fused_decode=True)))
    dynamic = _run(HfAREngine(_ctx(model_dir)))
    assert on == off == dynamic
    assert len(set(map(tuple, on.values()))) > 1  # not a degenerate model


def test_seeded_sampling_same_with_fused_on_and_off(llama_dir):
    params = {"temperature": 0.9, "top_k": 30, "top_p": 0.95, "repetition_penalty": 1.2, "seed": 7}
    off = _run(HfAREngine(_ctx(llama_dir, kv_cache="static")), params)
    on = _run(HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True)), params)
    assert on == off


def test_mixed_greedy_penalised_and_seeded_rows_in_one_batch(llama_dir):
    """Rows that are not plain greedy take the full sampling path whatever the others do."""
    per_request = [{}, {"repetition_penalty": 3.0}, {"temperature": 0.8, "seed": 5}, {}]

    def run(engine: HfAREngine, per_request=per_request) -> dict[str, list[int]]:
        for i, p in enumerate(per_request):
            engine.add(f"m{i}", {"prompt_token_ids": _prompt(4 + 3 * i, i)},
                       {"max_tokens": 24, "ignore_eos": True, **p})  # fmt: skip
        ids: dict[str, list[int]] = {}
        while engine.has_work():
            for out in engine.step():
                ids.setdefault(out.request_id, []).extend(out.payload["token_ids"])
        return ids

    on = run(HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True)))
    assert on == run(HfAREngine(_ctx(llama_dir, kv_cache="static")))
    assert on == run(HfAREngine(_ctx(llama_dir)))
    plain = run(HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True)), [{}] * 4)
    assert on["m0"] == plain["m0"] and on["m3"] == plain["m3"]  # greedy rows: as if alone
    assert on["m1"] != plain["m1"] and on["m2"] != plain["m2"]  # the others did sample


def test_text_stream_deltas_join_to_the_tokenizers_decode(llama_dir):
    """TextStream's shortcut past transformers' decode wrapper gives decode's text."""
    from transformers import AutoTokenizer

    from omni_actors.workers.engines.hf_ar_adapter import TextStream

    tok = AutoTokenizer.from_pretrained(llama_dir)
    ids = tok("héllo wörld ✓ 日本語 <|im_end|> x").input_ids + _prompt(40, 3)
    stream = TextStream(tok)
    assert stream.decode != tok.decode  # the shortcut is taken for this tokenizer
    deltas = [stream.push(t, final=i == len(ids) - 1) for i, t in enumerate(ids)]
    assert "".join(deltas) == tok.decode(ids, skip_special_tokens=True)
    assert "日本語" in "".join(deltas) and "<|im_end|>" not in "".join(deltas)


@pytest.mark.parametrize("seed", range(6))
def test_text_stream_windows_join_to_the_whole_decode_on_random_ids(llama_dir, seed):
    """Random ids over the whole vocabulary (special tokens, half characters, spaces): after every
    push the deltas so far are the decode of the ids so far, minus at most the held-back tail."""
    import random

    from transformers import AutoTokenizer

    from omni_actors.workers.engines.hf_ar_adapter import TextStream

    tok = AutoTokenizer.from_pretrained(llama_dir)
    rng = random.Random(seed)
    text = "Grüße, 世界! ✓ naïve café — 🙂 " * 3
    ids = tok(text).input_ids + [rng.randrange(len(tok)) for _ in range(150)]
    rng.shuffle(ids)
    stream, out = TextStream(tok), ""
    for i, t in enumerate(ids):
        out += stream.push(t, final=i == len(ids) - 1)
        whole = tok.decode(ids[: i + 1], skip_special_tokens=True)
        assert whole.startswith(out) or out == whole
    assert out == tok.decode(ids, skip_special_tokens=True)


def test_packed_weights_are_shared_not_copied(llama_dir):
    engine = HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True))
    attn = engine.model.model.layers[0].self_attn
    mlp = engine.model.model.layers[0].mlp
    packed = engine.fused.layers[0]
    assert attn.q_proj.weight.data_ptr() == packed.qkv_w.data_ptr()
    assert (
        attn.v_proj.weight.untyped_storage().data_ptr() == packed.qkv_w.untyped_storage().data_ptr()
    )
    assert (
        mlp.up_proj.weight.untyped_storage().data_ptr()
        == packed.gate_up_w.untyped_storage().data_ptr()
    )
    torch.testing.assert_close(packed.gate_up_w[96:], mlp.up_proj.weight, rtol=0, atol=0)


def test_fused_step_is_one_graph_under_torch_compile(llama_dir):
    """fullgraph=True fails on any graph break; the eager backend keeps it fast on CPU."""
    engine = HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True))
    engine.add("a", {"prompt_token_ids": _prompt(5, 0)}, {"max_tokens": 8, "ignore_eos": True})
    engine.add("b", {"prompt_token_ids": _prompt(9, 1)}, {"max_tokens": 8, "ignore_eos": True})
    engine.step()
    seqs = list(engine.seqs.values())
    compiled = torch.compile(engine.fused.forward, fullgraph=True, backend="eager", dynamic=False)
    with torch.inference_mode():
        batch, length = engine.slots.shape_for()
        engine.slots.load_inputs(batch, seqs, engine.adapter.decode_embeds(seqs))
        eager = engine.fused.forward(batch, length)
        graph = compiled(batch, length)
    torch.testing.assert_close(graph.logits, eager.logits, rtol=0, atol=0)
    assert graph.tokens.tolist() == eager.tokens.tolist()


def test_layer_scope_compiles_one_layer_graph_that_every_layer_shares(llama_dir):
    """compile_scope "layer": the layer's code and the head's are what compile (one graph each
    per bucket, whatever the depth: the weights are inputs), and the step's logits are the
    uncompiled step's."""
    from torch._dynamo.testing import CompileCounter

    engine = HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True))
    assert len(engine.fused.layers) == 2
    engine.add("a", {"prompt_token_ids": _prompt(5, 0)}, {"max_tokens": 8, "ignore_eos": True})
    engine.add("b", {"prompt_token_ids": _prompt(9, 1)}, {"max_tokens": 8, "ignore_eos": True})
    engine.step()
    seqs = list(engine.seqs.values())
    with torch.inference_mode():
        batch, length = engine.slots.shape_for()
        engine.slots.load_inputs(batch, seqs, engine.adapter.decode_embeds(seqs))
        keys = [k.clone() for k in engine.slots.keys]
        eager = engine.fused.forward(batch, length)
        for k, saved in zip(engine.slots.keys, keys, strict=True):
            k.copy_(saved)  # the step wrote its K/V: the compiled one writes the same again
        counter = CompileCounter()
        engine.fused.compile_layers(
            lambda fn: torch.compile(fn, fullgraph=True, backend=counter, dynamic=False)
        )
        graph = engine.fused.forward(batch, length)
        assert counter.frame_count == 2  # one layer graph (both layers) and the head's
        engine.fused.forward(batch, length)
        assert counter.frame_count == 2  # the same bucket again: nothing new
    torch.testing.assert_close(graph.logits, eager.logits, rtol=0, atol=0)
    assert graph.tokens.tolist() == eager.tokens.tolist()


def test_compile_scope_is_checked(llama_dir):
    with pytest.raises(ValueError, match="compile_scope"):
        HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True, compile_scope="model"))
    with pytest.raises(ValueError, match="compile_dynamic"):
        HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode=True, compile_dynamic="yes"))


def test_symbolic_layer_compiles_happen_at_load_and_none_under_requests(llama_dir):
    """compile_dynamic (the CUDA default): warm_compiled compiles the layer and the head with
    symbolic sizes at load (a warm-up request sizes the slots, then a few buckets run); the
    schedule's buckets then compile nothing, leave no warm-up request behind, and decode the
    uncompiled step's tokens."""
    from torch._dynamo.testing import CompileCounter

    from omni_actors.workers.engines.hf_ar_warm import warm_compiled

    engine = HfAREngine(_ctx(llama_dir, slots=8, kv_cache="static", fused_decode=True))
    counter = CompileCounter()
    engine.fused.compile_layers(lambda fn: torch.compile(fn, fullgraph=True, backend=counter, dynamic=True))
    lengths = len(engine.slots.length_sizes[:2])
    assert warm_compiled(engine) == 3 * lengths  # batches 2 and 4, then 1, at up to two lengths
    at_load = counter.frame_count
    assert at_load == 4  # the layer and the head, for batch 1 and for the batches above it
    assert not engine.seqs and not engine.slots.owners and engine.ahead is None
    got = _run(engine)
    assert counter.frame_count == at_load
    assert got == _run(HfAREngine(_ctx(llama_dir, slots=8, kv_cache="static", fused_decode=True)))


def _fused_off(path: Path, **extras) -> tuple[HfAREngine, list[dict]]:
    with structlog.testing.capture_logs() as logs:
        engine = HfAREngine(_ctx(path, fused_decode=True, **extras))
    return engine, [e for e in logs if e["event"] == "hf_ar.fused_off"]


def test_a_model_it_cannot_fuse_keeps_the_normal_step(tmp_path):
    path = _build(tmp_path / "dyn", "llama",
                  rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})  # fmt: skip
    engine, warned = _fused_off(path, kv_cache="static")
    assert engine.fused is None and len(warned) == 1
    assert warned[0]["log_level"] == "warning" and "dynamic" in warned[0]["reason"]
    assert _run(engine) == _run(HfAREngine(_ctx(path, kv_cache="static")))


def test_a_windowed_mistral_is_refused_and_an_unwindowed_one_fused(tmp_path):
    windowed = _build(tmp_path / "w", "mistral", sliding_window=16)
    engine, warned = _fused_off(windowed, kv_cache="static")
    assert engine.fused is None and "sliding_window" in warned[0]["reason"]
    full = _build(tmp_path / "f", "mistral", sliding_window=None)
    engine, warned = _fused_off(full, kv_cache="static")
    assert isinstance(engine.fused, FusedDecoder) and not warned
    assert _run(engine) == _run(HfAREngine(_ctx(full)))


def test_fused_needs_the_static_cache_and_a_bool(llama_dir):
    engine, warned = _fused_off(llama_dir)  # CPU default: dynamic
    assert engine.fused is None and "static" in warned[0]["reason"]
    with pytest.raises(ValueError, match="fused_decode"):
        HfAREngine(_ctx(llama_dir, kv_cache="static", fused_decode="yes"))
    with pytest.raises(ValueError, match="compile_mode"):
        HfAREngine(_ctx(llama_dir, kv_cache="static", compile=True, compile_mode="fastest"))
    with pytest.raises(ValueError, match=r"engine_extras\.blas"):
        HfAREngine(_ctx(llama_dir, kv_cache="static", blas="mkl"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(
    "compiled", [{"compile": False}, {"compile_scope": "step"}, {}],
    ids=["graphs", "step_compiled_graphs", "layer_compiled_graphs"],
)
def test_fused_step_under_cuda_graphs(tmp_path, compiled):
    """float32 on CUDA: the captured (compiled) fused step decodes the tokens of the eager
    transformers step, and its logits match that step's on the same inputs."""
    path = _build(tmp_path / "qwen2", "qwen2", rope_theta=1000000.0)
    engine = HfAREngine(_ctx(path, device="cuda", fused_decode=True, **compiled))
    assert engine.fused is not None and engine.graphs.enabled
    first, again = _run(engine), _run(engine)  # the second run replays every bucket
    assert engine.graphs.enabled and len(engine.graphs.graphs) >= 1
    plain = _run(HfAREngine(_ctx(path, device="cuda", cuda_graphs=False)))
    assert first == plain and again == plain
    for i in range(3):
        engine.add(f"g{i}", {"prompt_token_ids": _prompt(5 + 4 * i, i)}, {"max_tokens": 9})
    engine.step()
    engine.step()  # one replayed decode
    seqs = list(engine.seqs.values())
    with torch.inference_mode():
        batch, length = engine.slots.shape_for()
        rows = engine.slots.load_inputs(batch, seqs, engine.adapter.decode_embeds(seqs))
        eager = engine._static_forward(batch, length).logits[rows].clone()
        graph = engine.graphs.run(batch, length).logits[rows].clone()
    torch.testing.assert_close(graph, eager, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_written_out_attention_equals_sdpa_on_masked_grouped_rows(dtype):
    """The compiled GPU step's attention (hf_ar_slots.written_out_attention) against SDPA on the
    same grouped query heads, each row masked at its own length."""
    from omni_actors.workers.engines.hf_ar_slots import additive_mask, written_out_attention

    g = torch.Generator().manual_seed(3)
    rows, kv_heads, group, n, dim = 3, 2, 6, 40, 16
    q = torch.randn(rows, kv_heads, group, dim, generator=g).to(dtype)
    keys, values = (torch.randn(rows, kv_heads, n, dim, generator=g).to(dtype) for _ in range(2))
    lengths = torch.tensor([0, 17, n - 1])
    mask = additive_mask(torch.arange(n)[None] > lengths[:, None], dtype)
    want = torch.nn.functional.scaled_dot_product_attention(
        q, keys, values, attn_mask=mask, scale=dim**-0.5
    )
    got = written_out_attention(q, keys, values, mask, dim**-0.5)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    torch.testing.assert_close(
        got[0], values[0, :, :1].expand(kv_heads, group, dim), rtol=0, atol=tol
    )  # only key 0
