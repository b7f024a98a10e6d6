"""Dia's static slot KV cache and fixed-shape decode step (static_decode.py) against the dynamic-cache path.

Two engines over one tiny checkpoint (CPU, float32), `kv_cache: static` and `kv_cache:
dynamic`, run the same schedule: requests join mid-stream (one with a reference clip, so
a longer prompt), one ends early and one is aborted (their slots are reused, the last
slot's request moves into the hole), with guidance, seeded sampling and greedy rows.
Every position's conditioned and unconditioned logits agree within 1e-5 and the frames
are equal. What a CUDA graph needs of the step is checked on CPU (no host syncs in it; a
step recorded once per bucket and replayed op by op over its own tensors gives the same
frames); on CUDA, graph replay equals the eager step (marked `gpu`:
`pytest -m gpu tests/models/test_dia_static.py`).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.models.dia.engine import DiaEngine
from omni_actors.models.dia.prefill import prefill
from omni_actors.models.dia.static_decode import StaticDecoder
from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext
from tests.models.engine_schedule import drive
from tests.models.test_moshi_frame import _HostSyncs, _Tape, _write

SLOTS = 4
CLIP = (0.3 * np.sin(np.arange(11025) / 44100 * 2 * np.pi * 220)).astype(np.float32)
SCHEDULE: dict[int, list[tuple[str, str, dict, dict]]] = {
    0: [("a", "Hello there.", {"seed": 1}, {}), ("b", "Short one.", {"seed": 2, "max_tokens": 5}, {})],
    3: [("c", "Hi.", {"temperature": 0.0}, {}),
        ("d", "A longer, different text!", {"seed": 4}, {"reference_audio": CLIP, "reference_text": "A hum."})],
    14: [("e", "Joining late.", {"seed": 5, "guidance_scale": 1.0}, {})],
}  # fmt: skip
ABORT = {12: "a"}


class Recording(DiaEngine):
    """The real engine, keeping every position's (cond, uncond) logits per request."""

    def __init__(self, ctx: EngineContext) -> None:
        self.seen: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
        super().__init__(ctx)
        self.seen.clear()  # not the warm-up's

    def _take(self, reqs, cond, uncond):
        for i, req in enumerate(reqs):
            self.seen[(req.request_id, len(req.positions))] = (cond[i].clone(), uncond[i].clone())
        return super()._take(reqs, cond, uncond)


class _CopyTape(_Tape):
    """`_Tape`, also re-running ops whose schema may alias but whose recorded result was a copy
    (`to(dtype)` of the long positions the rotary embedding reads, a `reshape` that copies)."""

    def run(self, batch: int, length: int):
        if self.out is None:
            return super().run(batch, length)
        for func, args, kwargs, out in self.ops:
            if func.is_view and _aliases(out, args):
                continue
            new = func(*args, **kwargs)
            if not func._schema.is_mutable:
                _write(out, new)
        return self.out


def _aliases(out, args) -> bool:
    first = out[0] if isinstance(out, list | tuple) else out
    if not isinstance(first, torch.Tensor):
        return True
    ptr = first.untyped_storage().data_ptr()
    return any(isinstance(a, torch.Tensor) and a.untyped_storage().data_ptr() == ptr for a in args)


class _Tapes:
    """DecodeGraphs' interface with a `_CopyTape` per bucket: capture on first use, then replay (on CPU)."""

    enabled = False  # no CUDA graph

    def __init__(self, static) -> None:
        self.static = static
        self.tapes: dict[tuple[int, int], _CopyTape] = {}

    def run(self, batch: int, window: int):
        tape = self.tapes.get((batch, window))
        if tape is None:
            tape = self.tapes[(batch, window)] = _CopyTape(
                lambda: self.static._forward(batch, *self.static.windows[window])
            )
        return tape.run(batch, window)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_tiny("dia", tmp_path_factory.mktemp("models") / "tiny-dia", seed=0)


def _engine(folder: Path, device: str = "cpu", double: bool = False, **extras) -> Recording:
    engine = Recording(
        EngineContext(
            0, 0, "decoder", folder, device, SLOTS, "float32", 0.9, 1, engine_extras=extras
        )
    )
    if double:  # float64 takes the paths' own rounding out of the logits (the tiny model's weights amplify it)
        engine.model.double()
        if engine.static is not None:
            engine.static = StaticDecoder(
                engine.model, SLOTS, engine.static.max_len, False, engine.device
            )
    return engine


def _run(engine: DiaEngine) -> tuple[dict[str, np.ndarray], dict[str, str | None]]:
    return drive(engine, SCHEDULE, ABORT, "S1", "codes")


@pytest.mark.parametrize("double", [False, True], ids=["float32", "float64"])
def test_static_equals_dynamic_as_requests_join_end_early_and_abort(folder, double: bool) -> None:
    """float32: equal frames; float64: every position's logits within 1e-5 as well.

    In float32 the logits of either path move by ~1e-4 (of ~10) with the batch a request
    shares (the dynamic path alone vs batched: 4.6e-4), so 1e-5 is asked of float64 only.
    """
    dynamic, static = (
        _engine(folder, double=double, kv_cache="dynamic"),
        _engine(folder, double=double, kv_cache="static"),
    )
    assert dynamic.static is None and static.static is not None
    want, want_reasons = _run(dynamic)
    got, got_reasons = _run(static)
    assert (
        got_reasons == want_reasons
        and want_reasons["b"] == "length"
        and want_reasons["a"] == "aborted"
    )
    for rid in want:
        assert np.array_equal(got[rid], want[rid]), rid
    assert len(want["b"]) == 5 and len(want["c"]) > 20 and len(want["e"]) > 8
    assert static.seen.keys() == dynamic.seen.keys() and len(static.seen) > 150
    assert not static.static.owners, "every slot is given back"
    if not double:
        return
    for key, (cond, uncond) in dynamic.seen.items():
        torch.testing.assert_close(static.seen[key][0], cond, rtol=0, atol=1e-5, msg=str(key))
        torch.testing.assert_close(static.seen[key][1], uncond, rtol=0, atol=1e-5, msg=str(key))


def test_the_step_has_no_host_syncs_and_replays_per_bucket_like_a_graph(folder) -> None:
    eager, taped = _engine(folder, kv_cache="static"), _engine(folder, kv_cache="static")
    taped.static.graphs = _Tapes(taped.static)
    want, _ = _run(eager)
    got, _ = _run(taped)
    for rid in want:
        assert np.array_equal(got[rid], want[rid]), rid
    assert len(taped.static.graphs.tapes) >= 3, "several batch buckets should have been recorded"
    static = eager.static
    static.texts.fill_(5)
    static.lengths.copy_(torch.arange(2 * SLOTS))
    ptrs = [t.data_ptr() for t in (*static.keys, *static.cross_keys, static.ids, static.lengths)]
    with torch.inference_mode(), _HostSyncs() as spy:
        logits = static._forward(SLOTS, static.self_sizes[0], static.text_sizes[0])
    assert spy.seen == [], f"host syncs in the step: {sorted(set(spy.seen))}"
    assert (
        logits.shape == (2 * SLOTS, static.channels, static.vocab) and torch.isfinite(logits).all()
    )
    assert ptrs == [
        t.data_ptr() for t in (*static.keys, *static.cross_keys, static.ids, static.lengths)
    ]


def test_kv_cache_choice_and_the_frame_budget_that_fits(folder) -> None:
    with pytest.raises(ValueError, match="kv_cache"):
        _engine(folder, kv_cache="paged")
    small = _engine(folder, kv_cache="static", max_model_len=40)
    assert small.static.max_len == 40
    small.add("x", {"text": "Hello.", "voice": "S2"}, {"seed": 1, "max_tokens": 100})
    assert small.requests["x"].max_frames == 40 - 1 - small.tok.max_delay + 1
    with pytest.raises(ValueError, match="reference clip"):
        small.add("y", {"text": "Hello.", "voice": "S1", "reference_audio": np.tile(CLIP, 4)}, {})
    small.close()
    assert not small.requests and not small.static.owners


@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_a_clip_that_leaves_no_position_is_refused_naming_voice_and_its_longest(folder, kv_cache) -> None:
    """Both caches hold max_model_len positions: a clip past them is a refusal naming `voice` and the longest
    clip in seconds, before the DAC encodes it (the dynamic cache ran past the decoder's positions unchecked;
    the static one named no field), and a clip that fits still speaks, its frame budget cut to what is left."""
    engine = _engine(folder, kv_cache=kv_cache, max_model_len=40)
    longest = 40 - 1 - engine.tok.max_delay  # frames: one position left to speak
    fits = np.resize(CLIP, longest * engine.hop)
    with pytest.raises(ValueError, match=r"^voice: .* at most 0\.2 s") as err:
        engine.add("y", {"text": "Hello.", "voice": "S1", "reference_audio": np.resize(CLIP, fits.size + 1)}, {})
    assert f"({longest + 1} DAC frames)" in str(err.value) and "40 positions" in str(err.value)
    assert not engine.requests
    engine.add("z", {"text": "Hello.", "voice": "S1", "reference_audio": fits}, {"max_tokens": 100})
    assert engine.requests["z"].max_frames == 1
    engine.close()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_equals_the_eager_step_on_cuda(folder) -> None:
    eager = _engine(folder, "cuda", cuda_graphs=False)
    graphed = _engine(folder, "cuda")
    assert eager.static is not None and not eager.static.graphs.enabled
    assert graphed.static.graphs.enabled
    want, want_reasons = _run(eager)
    got, got_reasons = _run(graphed)
    assert graphed.static.graphs.enabled and len(graphed.static.graphs.graphs) >= 3, (
        "graphs should replay"
    )
    assert got_reasons == want_reasons
    for rid in want:
        assert np.array_equal(got[rid], want[rid]), rid
    for key, (cond, uncond) in eager.seen.items():
        torch.testing.assert_close(graphed.seen[key][0], cond, rtol=1e-5, atol=1e-5, msg=str(key))
        torch.testing.assert_close(graphed.seen[key][1], uncond, rtol=1e-5, atol=1e-5, msg=str(key))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graphs_speak_what_the_dynamic_cache_speaks(folder) -> None:
    """float32 on CUDA: the graphed static step and transformers' dynamic-cache decoder draw the same frames."""
    dynamic, graphed = _engine(folder, "cuda", kv_cache="dynamic"), _engine(folder, "cuda")
    want, want_reasons = _run(dynamic)
    got, got_reasons = _run(graphed)
    assert graphed.static.graphs.enabled and graphed.static.graphs.graphs
    assert got_reasons == want_reasons
    for rid in want:
        assert np.array_equal(got[rid], want[rid]), rid


def test_batched_prefill_equals_prompts_one_by_one(folder) -> None:
    """Texts of three lengths and prompts of two (one request clones a clip) in one forward: each
    request's cache cut, encoder states and last hidden state equal its own forward's, and an
    engine step prefills them all with one encoder call."""
    engine = _engine(folder, kv_cache="static")
    requests = [("p", "Hi.", {}), ("q", "A longer, different text!", {"reference_audio": CLIP, "reference_text": "A hum."}),
                ("r", "Hello there.", {})]  # fmt: skip
    for rid, text, extra in requests:
        engine.add(rid, {"text": text, "voice": "S1", **extra}, {"temperature": 0.0})
    reqs = list(engine.requests.values())
    assert len({len(r.text_ids) for r in reqs}) == 3 and len(reqs[1].prompt_codes) > 0
    with torch.inference_mode():
        together = prefill(engine.model, reqs, engine.tok, engine.device)
        cuts = [(r.self_kv, r.cross_kv, r.encoded) for r in reqs]
        alone = torch.cat([prefill(engine.model, [r], engine.tok, engine.device) for r in reqs])
    torch.testing.assert_close(together, alone, rtol=0, atol=1e-5)
    for req, (own, cross, encoded) in zip(reqs, cuts, strict=True):
        assert encoded.shape == req.encoded.shape and own[0][0].shape == req.self_kv[0][0].shape
        torch.testing.assert_close(encoded, req.encoded, rtol=0, atol=1e-5)
        for (k, v), (k1, v1) in zip([*own, *cross], [*req.self_kv, *req.cross_kv], strict=True):
            torch.testing.assert_close(k, k1, rtol=0, atol=1e-5)
            torch.testing.assert_close(v, v1, rtol=0, atol=1e-5)
    engine.close()

    frames, calls = {}, {}
    for batch in (True, False):  # the same requests, prefilled together and one by one
        engine = _engine(folder, kv_cache="static", batch_prefill=batch)
        calls[batch] = []
        engine.model.model.encoder.register_forward_hook(lambda *_, c=calls[batch]: c.append(1))
        for rid, text, extra in requests:
            engine.add(rid, {"text": text, "voice": "S1", **extra}, {"seed": 7})
        frames[batch] = _frames(engine)
    assert (len(calls[True]), len(calls[False])) == (1, 3), "one encoder forward for the three prompts"
    for rid, _, _ in requests:
        got, want = frames[True][rid], frames[False][rid]
        assert len(want) > 8 and np.array_equal(got, want), rid
    with pytest.raises(ValueError, match="batch_prefill"):
        _engine(folder, kv_cache="static", batch_prefill="yes")


def _frames(engine: DiaEngine) -> dict[str, np.ndarray]:
    frames: dict[str, list[np.ndarray]] = {rid: [] for rid in engine.requests}
    while engine.has_work():
        for out in engine.step():
            assert out.error is None
            if "codes" in out.payload:
                frames[out.request_id].append(out.payload["codes"][0])
    return {rid: np.array(f) for rid, f in frames.items()}


def test_warm_up_runs_every_bucket_it_names_and_leaves_nothing_behind(folder) -> None:
    """engine_extras.warmup (default on CUDA only): the same frames after as without, no request, no
    slot, buffers zero; the buckets stepped (captured, on CUDA) are every batch bucket x the self
    and text windows up to warmup_positions / warmup_text_bytes."""
    cold = _engine(folder, kv_cache="static")
    warm = _engine(folder, kv_cache="static", warmup=True)
    assert not warm.requests and not warm.static.owners
    buffers = (
        *warm.static.keys,
        *warm.static.values,
        *warm.static.cross_keys,
        *warm.static.cross_values,
    )
    assert all(not b.any() for b in buffers) and not warm.static.inputs.any()
    want, want_reasons = _run(cold)
    got, got_reasons = _run(warm)
    assert got_reasons == want_reasons
    for rid in want:
        assert np.array_equal(got[rid], want[rid]), rid

    taped = _engine(folder, kv_cache="static")
    taped.static.graphs = _Tapes(taped.static)
    taped.ctx.engine_extras.update(warmup_positions=200, warmup_text_bytes=65)
    taped.warm_up()
    static = taped.static
    spans, widths = static.self_sizes[:2], static.text_sizes[:2]  # 200 -> 128, 256; 65 -> 64, 128
    expected = {
        (b, static.windows.index((s, t))) for b in static.batch_sizes for s in spans for t in widths
    }
    assert set(taped.static.graphs.tapes) == expected and len(expected) == 3 * 2 * 2
    assert not taped.requests and not static.owners


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_warm_up_captures_the_graphs_a_first_request_uses(folder) -> None:
    """On CUDA the warm-up is on by default: a first request (batch 1, short text) captures nothing new."""
    engine = _engine(folder, "cuda")
    static = engine.static
    captured = set(static.graphs.graphs)
    assert static.graphs.enabled and len(captured) == len(static.batch_sizes) * 2 * 3
    engine.add("a", {"text": "Hello there.", "voice": "S1"}, {"seed": 1, "max_tokens": 20})
    assert 0 < len(_frames(engine)["a"]) <= 20
    assert set(static.graphs.graphs) == captured
