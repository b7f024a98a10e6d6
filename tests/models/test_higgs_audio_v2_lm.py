"""Higgs-Audio-V2's LM adapter on HfAREngine against transformers' own `generate`: the same frames, batched or alone."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from omni_actors.models.tiny import make_tiny
from omni_actors.workers.engine import EngineContext

TEXT = "Hello there."
ADAPTER = "omni_actors.models.higgs_audio_v2.lm:HiggsLMAdapter"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from omni_actors.workers.engines.hf_ar import HfAREngine

    folder = make_tiny("higgs_audio_v2", tmp_path_factory.mktemp("models") / "tiny-higgs", seed=0)
    ctx = EngineContext(0, 0, "lm", Path(folder), "cpu", 4, "auto", 0.9, 1, engine_extras={"adapter": ADAPTER})
    eng = HfAREngine(ctx)
    yield eng
    eng.close()


def _run(engine, requests: list[tuple[str, dict, dict]]) -> dict[str, np.ndarray]:
    frames: dict[str, list[np.ndarray]] = {rid: [] for rid, _, _ in requests}
    for rid, inputs, params in requests:
        engine.add(rid, {"text": TEXT, **inputs}, params)
    done = set()
    while engine.has_work():
        for out in engine.step():
            assert out.error is None, out.error
            if "codes" in out.payload:
                frames[out.request_id].append(out.payload["codes"][0])
            if out.finished:
                done.add(out.request_id)
    assert done == set(frames)
    return {rid: np.array(f) for rid, f in frames.items()}


def _reverted(steps: torch.Tensor, groups: int, bos: int) -> np.ndarray:
    """transformers' [steps, groups] output (all-bos step first) -> frames, as the processor's decode cuts them."""
    rows = steps[1:].numpy()
    return np.stack([rows[k : len(rows) - groups + 1 + k, k] for k in range(groups)], axis=1).clip(0, bos - 1)


def test_greedy_frames_equal_transformers_generate(engine) -> None:
    adapter = engine.adapter
    ours = _run(engine, [("a", {}, {"temperature": 0.0, "max_tokens": 20})])["a"]
    chat = [{"role": "system", "content": [{"type": "text", "text": "Generate audio following instruction.\n\n"
             "<|scene_desc_start|>\nAudio is recorded from a quiet room.\n<|scene_desc_end|>"}]},
            {"role": "user", "content": [{"type": "text", "text": TEXT}]}]  # fmt: skip
    ids = adapter.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                                return_dict=True)["input_ids"]  # fmt: skip
    assert int(ids[0, -1]) == adapter.start_id
    theirs = adapter.model.generate(input_ids=ids, do_sample=False, max_new_tokens=20)[0]
    assert ours.shape == (20 - 8, 8)
    assert np.array_equal(ours, _reverted(theirs, 8, adapter.bos))


def test_batched_equals_alone_seeds_and_voices_matter(engine) -> None:
    together = _run(engine, [("x", {}, {"seed": 3}), ("y", {"voice": "SPEAKER0"}, {"seed": 3}),
                             ("z", {"instructions": "A noisy street."}, {"temperature": 0.0})])  # fmt: skip
    assert np.array_equal(together["x"], _run(engine, [("x", {}, {"seed": 3})])["x"])
    assert np.array_equal(together["z"], _run(engine, [("z", {"instructions": "A noisy street."},
                                                        {"temperature": 0.0})])["z"])  # fmt: skip
    assert not np.array_equal(together["x"], together["y"])
    assert not np.array_equal(together["x"], _run(engine, [("w", {}, {"seed": 4})])["w"])


def test_reference_clip_is_encoded_into_the_prompt_once(engine) -> None:
    t = np.arange(24000) / 24000
    clip = (0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32)
    ref = {"reference_audio": clip, "reference_text": "A low hum.", "reference_id": "voice_a"}
    cloned = _run(engine, [("c", ref, {"seed": 1})])["c"]
    plain = _run(engine, [("p", {}, {"seed": 1})])["p"]
    assert not np.array_equal(cloned, plain)
    assert len(engine.adapter.clips) == 1
    steps = next(iter(engine.adapter.clips.values()))
    assert steps.shape == (25 + 2 + 7, 8)  # 1 s at 25 Hz, bos and eos columns, the delay's 7 steps
    assert np.array_equal(_run(engine, [("c", ref, {"seed": 1})])["c"], cloned)
    assert len(engine.adapter.clips) == 1


def test_a_plain_and_a_cloned_prompt_prefilled_together_give_their_frames_alone(engine) -> None:
    """A prompt with no audio position takes every layer's text path alone (`text_only`); batched with
    a clip's prompt, it is a row of all-text positions in the mixed prefill: the same frames either way."""
    clip = (0.3 * np.sin(2 * np.pi * 330 * np.arange(24000) / 24000)).astype(np.float32)
    ref = {"reference_audio": clip, "reference_text": "A higher hum."}
    greedy = {"temperature": 0.0, "max_tokens": 16}
    plain = SimpleNamespace(params={})
    engine.adapter.start(plain, {"text": TEXT})
    extra = engine.adapter.prefill(plain).extra
    assert extra["text_only"] and extra["length"] > 10 and "audio_mask" not in extra
    together = _run(engine, [("p", {}, greedy), ("c", ref, greedy)])
    assert np.array_equal(together["p"], _run(engine, [("p", {}, greedy)])["p"])
    assert np.array_equal(together["c"], _run(engine, [("c", ref, greedy)])["c"])
    assert not np.array_equal(together["p"], together["c"])


def test_cloned_greedy_frames_equal_generate_on_the_processors_inputs(engine) -> None:
    """The clip's block and placeholder ids as `HiggsAudioV2Processor` builds them (its own
    build_delay_pattern / get_audio_tokens; its constructor refuses the tokenizer class loaded
    beside the torchaudio stand-in, so they run on a namespace), then `generate`."""
    from transformers import HiggsAudioV2Processor

    from omni_actors.models.higgs_audio_v2.prompt import conversation

    adapter = engine.adapter
    clip = (0.3 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)).astype(np.float32)
    ours = _run(engine, [("c", {"reference_audio": clip, "reference_text": "A low hum."},
                          {"temperature": 0.0, "max_tokens": 20})])["c"]  # fmt: skip
    codec = adapter.codec
    fake = SimpleNamespace(audio_stream_bos_id=adapter.bos, audio_stream_eos_id=adapter.eos,
                           audio_token="<|AUDIO_OUT|>", audio_delay_token="<|reserved_special_token_6|>",
                           audio_tokenizer=codec)  # fmt: skip
    with torch.no_grad():
        codes = codec.encode(torch.from_numpy(clip)[None, None], return_dict=False)
    framed = torch.cat([codes.new_full((1, 8, 1), adapter.bos), codes, codes.new_full((1, 8, 1), adapter.eos)], 2)
    block = HiggsAudioV2Processor.build_delay_pattern(fake, framed)[0].T
    rendered = adapter.tokenizer.apply_chat_template(
        conversation(TEXT, None, "A low hum."), chat_template=adapter.template, tokenize=False,
        add_generation_prompt=True,
    )  # fmt: skip
    text = rendered.replace("<|AUDIO_OUT|>", HiggsAudioV2Processor.get_audio_tokens(fake, len(block)))
    ids = adapter.tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    theirs = adapter.model.generate(
        input_ids=ids, audio_input_ids=block[None], audio_input_ids_mask=torch.ones(1, len(block), dtype=torch.bool),
        do_sample=False, max_new_tokens=20,
    )[0]  # fmt: skip
    assert np.array_equal(ours, _reverted(theirs[-20:], 8, adapter.bos))


@pytest.mark.parametrize("fused", [False, True], ids=["adapter_forward", "fused_step"])
def test_static_kv_gives_the_dynamic_caches_frames(engine, fused) -> None:
    """The engine's static slot cache (the CUDA default; here eager on CPU) runs the same adapter
    forward; with fused_decode, decode steps run the fused Llama step over the audio FFN weights."""
    from omni_actors.workers.engines.hf_ar import HfAREngine

    extras = {"adapter": ADAPTER, "kv_cache": "static", "max_model_len": 512, "fused_decode": fused}
    static = HfAREngine(EngineContext(0, 0, "lm", engine.ctx.model_path, "cpu", 4, "auto", 0.9, 1, engine_extras=extras))
    try:
        assert (static.fused is not None) == fused
        reqs = [("s", {}, {"seed": 2}), ("g", {"voice": "SPEAKER1"}, {"temperature": 0.0})]
        ours = _run(static, reqs)
    finally:
        static.close()
    theirs = _run(engine, reqs)
    for rid in ours:
        assert np.array_equal(ours[rid], theirs[rid])


def test_repetition_aware_sampling_when_the_config_sets_it(engine) -> None:
    """Greedy frames of the tiny model repeat codes; with RAS (7, 2) those are redrawn, reproducibly for a seed."""
    params = {"temperature": 0.0, "seed": 9, "max_tokens": 24}
    plain = _run(engine, [("p", {}, params)])["p"]
    adapter, sampler = engine.adapter, engine.adapter.sampler
    adapter.ras = (7, 2)
    adapter.sampler = adapter._sampler()  # (made at load, for the config's RAS)
    try:
        first = _run(engine, [("r", {}, params)])["r"]
        again = _run(engine, [("r", {}, params)])["r"]
    finally:
        adapter.ras, adapter.sampler = None, sampler
    assert np.array_equal(first, again) and not np.array_equal(first, plain)


def test_a_tokenizer_with_other_codebooks_than_the_lm_is_named_at_load(engine, tmp_path) -> None:
    """The codec stage refuses a folder whose LM and audio tokenizer disagree on codebooks a frame,
    at load, instead of failing every request."""
    import json
    import shutil

    from omni_actors.workers.engines.generation import GenerationEngine

    folder = tmp_path / "higgs"
    shutil.copytree(engine.ctx.model_path, folder)
    config = json.loads((folder / "config.json").read_text())
    config["num_codebooks"] = 5
    (folder / "config.json").write_text(json.dumps(config))
    extras = {"adapter": "omni_actors.models.higgs_audio_v2.codec:HiggsCodecAdapter"}
    ctx = EngineContext(1, 0, "codec", folder, "cpu", 4, "auto", 0.9, 1, engine_extras=extras)
    with pytest.raises(ValueError, match="makes 5 codebooks a frame but its audio tokenizer decodes 8"):
        GenerationEngine(ctx)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_cuda_graphs_and_steps_queued_ahead_give_the_eager_step_by_step_frames(engine) -> None:
    """The CUDA defaults (static KV, fused and compiled step, graphs, the sampler's own graphs, steps
    queued ahead) against the same engine eager and step by step: the same frames for seeded and
    greedy requests batched together (the same batches: a GPU's GEMMs round by batch size, so
    alone and batched are not compared here; the CPU tests do)."""
    from omni_actors.workers.engines.hf_ar import HfAREngine

    def cuda(**extras):
        return HfAREngine(EngineContext(0, 0, "lm", engine.ctx.model_path, "cuda", 4, "auto", 0.9, 1,
                                        engine_extras={"adapter": ADAPTER, **extras}))  # fmt: skip

    reqs = [("s", {}, {"seed": 5}), ("g", {"voice": "SPEAKER1"}, {"temperature": 0.0}),
            ("t", {}, {"seed": 6, "max_tokens": 25})]  # fmt: skip
    fast = cuda()
    try:
        assert fast.adapter.sampler.graphs.enabled and fast.lookahead
        ours = _run(fast, reqs)
    finally:
        fast.close()
    slow = cuda(lookahead=False, cuda_graphs=False)
    try:
        assert not slow.adapter.sampler.graphs.enabled
        theirs = _run(slow, reqs)
    finally:
        slow.close()
    for rid in ours:
        assert np.array_equal(ours[rid], theirs[rid]), rid


def test_steps_queued_ahead_of_the_host_give_the_same_frames(engine) -> None:
    """With lookahead (the CUDA default; forced on here with the static cache on CPU) a decode step
    and its draw are queued before the host takes the step before, from the draw's state on the
    device, until a request ends. Frames as step by step."""
    from omni_actors.workers.engines.hf_ar import HfAREngine

    extras = {"adapter": ADAPTER, "kv_cache": "static", "max_model_len": 512, "lookahead": True}
    ahead = HfAREngine(EngineContext(0, 0, "lm", engine.ctx.model_path, "cpu", 4, "auto", 0.9, 1, engine_extras=extras))
    reqs = [("s", {}, {"seed": 2, "max_tokens": 30}), ("g", {"voice": "SPEAKER1"}, {"temperature": 0.0}),
            ("t", {}, {"seed": 4, "top_k": 0, "max_tokens": 21})]  # fmt: skip
    queued = []
    step = ahead.step

    def counted_step():  # how many steps leave one queued behind them
        out = step()
        queued.append(ahead.ahead is not None)
        return out

    ahead.step = counted_step
    try:
        assert ahead.lookahead
        ours = _run(ahead, reqs)
    finally:
        ahead.close()
    assert sum(queued) > 10
    theirs = _run(engine, reqs)
    for rid in ours:
        assert np.array_equal(ours[rid], theirs[rid]), rid


def test_plain_prompts_prefilled_in_buckets_give_the_same_frames(engine) -> None:
    """engine_extras.prefill_graphs (the CUDA default; eager here): plain prompts are left-padded to a
    (batch, length) bucket with the mask and positions made from each row's first real position;
    a cloned prompt's batch keeps the eager path. Frames as the dynamic caches give."""
    from omni_actors.workers.engines.hf_ar import HfAREngine

    extras = {"adapter": ADAPTER, "kv_cache": "static", "max_model_len": 512, "prefill_graphs": True}
    bucketed = HfAREngine(EngineContext(0, 0, "lm", engine.ctx.model_path, "cpu", 4, "auto", 0.9, 1, engine_extras=extras))
    clip = (0.3 * np.sin(2 * np.pi * 220 * np.arange(12000) / 24000)).astype(np.float32)
    reqs = [("s", {}, {"seed": 2, "max_tokens": 20}), ("g", {"text": "A longer line to say, with more words in it."},
            {"temperature": 0.0, "max_tokens": 20}), ("t", {"voice": "SPEAKER0"}, {"seed": 4, "max_tokens": 20})]  # fmt: skip
    cloned = [("c", {"reference_audio": clip, "reference_text": "Hum."}, {"temperature": 0.0, "max_tokens": 16})]
    try:
        assert bucketed.prefill is not None and bucketed.prefill.bucket(3, 40) == (4, 64)
        ours = _run(bucketed, reqs) | _run(bucketed, cloned)
        assert [b for b, _ in bucketed.prefill._buffers] == [4]  # the plain ones, once; the clone's batch ran eagerly
    finally:
        bucketed.close()
    theirs = _run(engine, reqs) | _run(engine, cloned)
    for rid in ours:
        assert np.array_equal(ours[rid], theirs[rid]), rid
