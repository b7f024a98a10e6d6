"""VibeVoice's static slot KV, fixed-shape LM step and denoising loop (static_lm.py, static_head.py) against the dynamic path.

Two engines over one tiny checkpoint (CPU), `kv_cache: static` and `kv_cache: dynamic`,
run the same schedule: requests join mid-stream (one with a reference clip, so a longer
prompt; one unseeded, drawing from the global generator; one without guidance), one ends
early, one says the end token, two start a new audio segment, and one is aborted (their
slots are reused, the last slot's request moves into the hole). Every position's conditioned LM state and every latent agree, and so does the
audio the codec stage makes of them. The denoising table is the scheduler itself: fed the
same inputs, the fixed-shape loop gives the scheduler's latents bit for bit. What a CUDA
graph needs of the three steps is checked on CPU (no host syncs; each step recorded once
per bucket and replayed op by op over its own tensors gives the same latents); on CUDA,
graph replay equals the eager steps (`pytest -m gpu tests/models/test_vibevoice_static.py`).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.models.tiny import make_tiny
from omni_actors.models.vibevoice.engine import VibeVoiceEngine
from omni_actors.models.vibevoice.static_lm import COND, GUIDE
from omni_actors.workers.engine import EngineContext
from tests.models.engine_schedule import drive
from tests.models.test_dia_static import _CopyTape
from tests.models.test_moshi_frame import _HostSyncs

SLOTS = 4
CLIP = (0.3 * np.sin(np.arange(12000) / 24000 * 2 * np.pi * 220)).astype(np.float32)
SCHEDULE: dict[int, list[tuple[str, str, dict, dict]]] = {
    0: [("a", "Hello there.", {"seed": 1, "max_tokens": 20}, {}), ("b", "Short one.", {"seed": 2, "max_tokens": 3}, {})],
    2: [("c", "Hi.", {"max_tokens": 14}, {}),
        ("d", "A longer, different text!", {"seed": 4, "max_tokens": 12}, {"reference_audio": CLIP})],
    7: [("e", "Joining late.", {"seed": 5, "guidance_scale": 1.0, "max_tokens": 13}, {})],
}  # fmt: skip
ABORT = {9: "a"}


FORCED = {("d", 5): "bos", ("e", 4): "bos", ("c", 8): "end"}
"""Tokens the tiny LM never picks (it is steered to audio), forced at these (request, position): a new
audio segment (the guidance branch starts over; no latent that step) and an early end."""


class Recording(VibeVoiceEngine):
    """The real engine, keeping each request's conditioned LM state at every position (and saying FORCED's tokens)."""

    def __init__(self, ctx: EngineContext) -> None:
        super().__init__(ctx)
        self.seen: dict[tuple[str, int], torch.Tensor] = {}

    def _tokens(self, reqs):
        for req in reqs:
            state = req.hidden if self.static is None else self.static.states[COND, req.slot]
            self.seen[(req.request_id, len(req.tokens))] = state.clone()
        named = {"bos": self.ids[0], "end": self.ids[1]}
        tokens = super()._tokens(reqs)
        return [
            named.get(FORCED.get((r.request_id, len(r.tokens))), t)
            for r, t in zip(reqs, tokens, strict=True)
        ]


class _Tapes:
    """DecodeGraphs' interface with a `_CopyTape` per bucket: capture on first use, then replay (on CPU)."""

    def __init__(self, forward) -> None:
        self.forward = forward
        self.tapes: dict[tuple[int, int], _CopyTape] = {}

    def run(self, batch: int, window: int):
        tape = self.tapes.get((batch, window))
        if tape is None:
            tape = self.tapes[(batch, window)] = _CopyTape(lambda: self.forward(batch, window))
        return tape.run(batch, window)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return make_tiny("vibevoice", tmp_path_factory.mktemp("models") / "tiny-vibevoice", seed=0)


def _engine(folder: Path, device: str = "cpu", double: bool = False, **extras) -> Recording:
    ctx = EngineContext(0, 0, "lm", folder, device, SLOTS, "float32", 0.9, 1, engine_extras=extras)
    engine = Recording(ctx)
    if double:  # float64 takes the paths' own rounding out (the scheduler's update stays float32)
        engine.model.double()
        if engine.static is not None:
            engine.build_static(engine.static.max_len, False)
    return engine


def _run(engine: VibeVoiceEngine) -> tuple[dict[str, np.ndarray], dict[str, str | None]]:
    torch.manual_seed(123)  # the unseeded request's noise
    return drive(engine, SCHEDULE, ABORT, "1", "latents")


@pytest.mark.parametrize("double", [False, True], ids=["float32", "float64"])
def test_static_equals_dynamic_as_requests_join_end_early_and_abort(folder, double: bool) -> None:
    """Latents and LM states agree to float32 rounding: the scheduler's update runs in float32 on both
    paths, so a last-bit difference of the LM (its batch differs) can move a latent by an ulp or two."""
    dynamic = _engine(folder, double=double, kv_cache="dynamic")
    static = _engine(folder, double=double, kv_cache="static")
    assert dynamic.static is None and static.static is not None
    want, want_reasons = _run(dynamic)
    got, got_reasons = _run(static)
    assert got_reasons == want_reasons == {
        "a": "aborted", "b": "length", "c": "stop", "d": "length", "e": "length"
    }  # fmt: skip
    assert [len(got[r]) for r in "bcde"] == [3, 8, 11, 12] and 0 < len(got["a"]) < 20
    tol = 1e-6 if double else 1e-5
    for rid in want:
        np.testing.assert_allclose(got[rid], want[rid], rtol=tol, atol=tol, err_msg=rid)
    assert not np.allclose(got["b"], got["c"][:3], atol=1e-3), "requests should differ"
    assert static.seen.keys() == dynamic.seen.keys() and len(static.seen) > 40
    for key, state in dynamic.seen.items():
        torch.testing.assert_close(static.seen[key], state, rtol=tol, atol=tol, msg=str(key))
    assert not static.static.owners, "every slot is given back"


def test_static_audio_equals_dynamic_audio(folder) -> None:
    """The codec stage's audio of both paths' latents (the LM also decodes them for its feedback)."""
    from omni_actors.models.vibevoice.codec import AcousticCodecAdapter

    codec = AcousticCodecAdapter(EngineContext(1, 0, "codec", folder, "cpu", 4, "auto", 0.9, 1))
    codec.load()
    want, _ = _run(_engine(folder, kv_cache="dynamic"))
    got, _ = _run(_engine(folder, kv_cache="static"))
    for rid in want:
        a, b = (
            codec.decode([torch.tensor(x[rid])], [0], [codec.start({}, {})])[0] for x in (want, got)
        )
        assert a.shape == b.shape == (len(want[rid]) * 3200,)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=rid)


def test_the_denoising_table_is_the_scheduler(folder) -> None:
    """Same noise, states and scales: the fixed-shape loop's latents are the scheduler's, bit for bit."""
    engine = _engine(folder, kv_cache="static")
    denoise, gen = engine.audio.denoise, torch.Generator().manual_seed(7)
    assert denoise.orders == [1, *[2] * (engine.steps - 2), 1]
    pos, neg = torch.randn(2, SLOTS, engine.static.states.shape[2], generator=gen)
    noise = torch.randn(SLOTS, engine.latent, generator=gen)
    scale = torch.tensor([[1.3], [1.0], [2.0], [1.3]])
    with torch.inference_mode():
        got = denoise(noise, torch.cat([pos, neg]), scale)
        want = engine._denoise(noise, pos, neg, scale)
    assert torch.equal(got, want)


def test_the_steps_have_no_host_syncs_and_replay_per_bucket_like_a_graph(folder) -> None:
    eager, taped = _engine(folder, kv_cache="static"), _engine(folder, kv_cache="static")
    lm, head = taped.static, taped.audio
    lm.graphs = [
        _Tapes(lambda b, w, br=br: lm._forward(br, b, lm.windows[w])) for br in (COND, GUIDE)
    ]
    head.graphs = _Tapes(lambda b, _: head._forward(b))
    want, _ = _run(eager)
    got, _ = _run(taped)
    for rid in want:
        assert np.array_equal(got[rid], want[rid]), rid
    recorded = [sorted(t.tapes) for t in (*lm.graphs, head.graphs)]
    assert all(len(r) >= 3 for r in recorded), f"several buckets: {recorded}"
    lm, head = eager.static, eager.audio
    lm.lengths.copy_(torch.arange(2 * SLOTS).view(2, SLOTS))
    held = (*lm.keys, *lm.values, lm.states, lm.embeds, head.noise, *head.acoustic.buffers.values(),
            *head.semantic.buffers.values())  # fmt: skip
    ptrs = [t.data_ptr() for t in held]
    before = [t.clone() for t in head.acoustic.buffers.values()]
    with torch.inference_mode(), _HostSyncs() as spy:
        lm._forward(COND, SLOTS, lm.windows[0])
        lm._forward(GUIDE, SLOTS, lm.windows[0])
        latents = head._forward(SLOTS)
    assert spy.seen == [], f"host syncs in the steps: {sorted(set(spy.seen))}"
    assert latents.shape == (SLOTS, eager.latent) and torch.isfinite(latents).all()
    assert ptrs == [t.data_ptr() for t in held]
    assert not all(
        torch.equal(a, b) for a, b in zip(before, head.acoustic.buffers.values(), strict=True)
    ), "caches"


def test_kv_cache_choice_and_the_frame_budget_that_fits(folder) -> None:
    from diffusers import DPMSolverMultistepScheduler

    with pytest.raises(ValueError, match="kv_cache"):
        _engine(folder, kv_cache="paged")
    assert _engine(folder).static is None, "dynamic by default"
    small = _engine(folder, kv_cache="static", max_model_len=60)
    assert small.static.max_len == 60 and small.static.windows == [60]
    small.add("x", {"text": "Hello.", "voice": "2"}, {"seed": 1, "max_tokens": 100})
    prompt = small.requests["x"].prompt["input_ids"].shape[1]
    assert small.requests["x"].max_frames == 60 - prompt + 1
    with pytest.raises(ValueError, match="max_model_len"):
        small.add("y", {"text": "Hello. " * 20, "voice": "1"}, {})
    small.close()
    assert not small.requests and not small.static.owners
    small.scheduler = DPMSolverMultistepScheduler(prediction_type="epsilon")
    with pytest.raises(ValueError, match="kv_cache: dynamic"):
        small.build_static(60, False)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_replay_equals_the_eager_steps_on_cuda(folder) -> None:
    eager = _engine(folder, "cuda", kv_cache="static", cuda_graphs=False)
    graphed = _engine(folder, "cuda", kv_cache="static")
    assert eager.static is not None and not eager.static.graphs[COND].enabled
    want, want_reasons = _run(eager)
    got, got_reasons = _run(graphed)
    assert all(
        g.enabled and len(g.graphs) >= 3 for g in (*graphed.static.graphs, graphed.audio.graphs)
    )
    assert got_reasons == want_reasons
    for rid in want:
        np.testing.assert_allclose(got[rid], want[rid], rtol=1e-5, atol=1e-5, err_msg=rid)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graphs_speak_what_the_dynamic_cache_speaks(folder) -> None:
    """float32 on CUDA: the graphed static steps and transformers' dynamic-cache LM + scheduler agree
    (TF32 convolutions off: the codec feedback's batch differs between the paths)."""
    dynamic, graphed = _engine(folder, "cuda", kv_cache="dynamic"), _engine(folder, "cuda", kv_cache="static")
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    try:
        want, want_reasons = _run(dynamic)
        got, got_reasons = _run(graphed)
    finally:
        torch.backends.cudnn.allow_tf32 = tf32
    assert graphed.audio.graphs.enabled and graphed.audio.graphs.graphs
    assert got_reasons == want_reasons
    for rid in want:
        np.testing.assert_allclose(got[rid], want[rid], rtol=1e-4, atol=1e-4, err_msg=rid)
