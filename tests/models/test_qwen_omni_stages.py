"""Qwen-Omni pipelines stage by stage on tiny checkpoints: engines driven directly, no workers.

The stage engines are checked against transformers' own end-to-end `generate`
(greedy): same thinker tokens, same talker codes. Hand-offs use the
pipelines' own processors, in full-payload and async-chunk modes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from omni_actors.config.pipeline import get_pipeline, resolve  # noqa: E402
from omni_actors.workers.engine import EngineContext  # noqa: E402
from omni_actors.workers.engines.hf_ar import prompt_ids  # noqa: E402

NAMES = ("qwen2_5_omni", "qwen3_omni_moe")
MSGS = [{"role": "user", "content": "Hello! How are you?"}]
THINKER = {"max_tokens": 8, "ignore_eos": True}
TALKER = {"talker_max_tokens": 24, "talker_temperature": 0.0, "talker_repetition_penalty": 1.0}


def _ctx(spec, path: Path, **extras) -> EngineContext:
    return EngineContext(
        stage_id=spec.stage_id, replica=0, model_stage=spec.model_stage, model_path=path,
        device="cpu", max_num_seqs=8, dtype="float32", gpu_memory_utilization=0.5,
        tensor_parallel_size=1, engine_extras={**spec.engine_defaults, **extras},
    )  # fmt: skip


class Stages:
    """One pipeline's three engines plus its processors."""

    def __init__(self, name: str, path: Path) -> None:
        self.name, self.path = name, path
        self.pipe = get_pipeline(name)
        self.engines = [resolve(s.engine)(_ctx(s, path)) for s in self.pipe.stages]
        self.full = [resolve(s.processor) if s.processor else None for s in self.pipe.stages]
        self.chunk = [
            resolve(s.chunk_processor) if s.chunk_processor else None for s in self.pipe.stages
        ]
        self.overrides: dict = {}

    def params(self, stage: int) -> dict:
        # One request's params go to every stage (as the orchestrator sends them).
        return {**THINKER, **TALKER, **self.overrides}

    def run_full(self, requests: dict[str, dict]) -> dict[str, dict]:
        """Each stage runs all requests to the end before the next starts."""
        upstream = {rid: req for rid, req in requests.items()}
        outs: dict[str, dict] = {}
        for stage, eng in enumerate(self.engines):
            for rid, req in requests.items():
                inputs = req if stage == 0 else self.full[stage]({stage - 1: upstream[rid]}, req)
                eng.add(rid, inputs, self.params(stage))
            got: dict[str, list] = {rid: [] for rid in requests}
            while eng.has_work():
                for out in eng.step():
                    assert out.error is None, out.error
                    got[out.request_id].append(out.payload)
            upstream = got
            outs[stage] = got
        return {rid: _summary(outs[0][rid], outs[1][rid], outs[2][rid]) for rid in requests}

    def run_chunked(self, requests: dict[str, dict], abort_at: dict[str, int] | None = None):
        """Async chunk: every output is handed downstream as soon as it exists."""
        got = [{rid: [] for rid in requests} for _ in self.engines]
        states = [{rid: {} for rid in requests} for _ in self.engines]
        order: list[tuple[int, str]] = []
        for rid, req in requests.items():
            for stage, eng in enumerate(self.engines):
                eng.add(rid, req, self.params(stage), streaming=stage > 0)
        steps = 0
        while any(e.has_work() for e in self.engines):
            steps += 1
            for rid, at in (abort_at or {}).items():
                if steps == at:
                    for eng in self.engines:
                        eng.abort(rid)
            for stage, eng in enumerate(self.engines):
                if not eng.has_work():
                    continue
                for out in eng.step():
                    assert out.error is None, out.error
                    got[stage][out.request_id].append(out.payload)
                    order.append((stage, out.request_id))
                    if stage + 1 < len(self.engines):
                        rid = out.request_id
                        nxt = self.chunk[stage + 1](
                            stage, out.payload, out.finished, requests[rid], states[stage + 1][rid]
                        )
                        if nxt is not None or out.finished:
                            self.engines[stage + 1].feed(rid, nxt or {}, out.finished)
        res = {
            rid: _summary(got[0][rid], got[1][rid], got[2][rid]) for rid in requests if got[2][rid]
        }
        return res, order


def _summary(thinker: list, talker: list, audio: list) -> dict:
    codes = [np.asarray(p["codes"]) for p in talker if "codes" in p]
    return {
        "text": "".join(p["text"] for p in thinker),
        "tokens": [t for p in thinker for t in p["token_ids"]],
        "codes": np.concatenate(codes) if codes else np.zeros(0, np.int64),
        "audio": np.concatenate([p["audio"] for p in audio]) if audio else np.zeros(0, np.float32),
        "audio_chunks": sum(1 for p in audio if len(p["audio"])),
        "rate": audio[0]["sample_rate"] if audio else None,
    }


@pytest.fixture(scope="module", params=NAMES)
def stages(request, tiny_model) -> Stages:
    return Stages(request.param, tiny_model(request.param))


def _reference(stages: Stages, prompt_ids: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy thinker tokens and talker codes for one prompt."""
    from transformers import (
        Qwen2_5OmniForConditionalGeneration,
        Qwen3OmniMoeForConditionalGeneration,
    )

    ids = torch.tensor([prompt_ids])
    n = THINKER["max_tokens"]
    if stages.name == "qwen2_5_omni":
        model = Qwen2_5OmniForConditionalGeneration.from_pretrained(stages.path).eval()
        return _reference_2_5(model, ids)
    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(stages.path).eval()
    thinker = model.thinker.generate(
        input_ids=ids, max_new_tokens=n, min_new_tokens=n, do_sample=False
    )
    return thinker[0, len(prompt_ids) :].tolist(), _qwen3_generate_codes(model, ids)


def _qwen3_generate_codes(model, ids: torch.Tensor, **media) -> torch.Tensor:
    """The talker codes Qwen3-Omni's greedy `generate` hands its vocoder ([groups, frames])."""
    captured = {}

    class Captured(Exception):
        pass

    def spy(codes, *args, **kwargs):
        captured["codes"] = codes.clone()
        raise Captured  # the codes are what we compare; skip the vocoder

    model.code2wav.chunked_decode = spy
    n = THINKER["max_tokens"]
    with pytest.raises(Captured):
        model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), speaker="ethan",
            thinker_max_new_tokens=n, thinker_min_new_tokens=n, thinker_do_sample=False,
            talker_max_new_tokens=TALKER["talker_max_tokens"], talker_do_sample=False,
            talker_repetition_penalty=1.0, **media,
        )  # fmt: skip
    return captured["codes"][0]


@torch.inference_mode()
def _reference_2_5(model, ids: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """Qwen2.5-Omni: the talker inputs as `generate` builds them, decoded greedily with the
    talker's own forward given an attention mask (transformers 5.19's `generate` drops the
    mask before the talker's forward, which skips the codec bos/pad prompt embeddings)."""
    n = THINKER["max_tokens"]
    res = model.thinker.generate(
        input_ids=ids, max_new_tokens=n, min_new_tokens=n, do_sample=False,
        output_hidden_states=True, return_dict_in_generate=True,
    )  # fmt: skip
    gen = res.sequences[:, ids.shape[1] :]
    talker, embed = model.talker, model.thinker.get_input_embeddings()
    states = [(h[0], h[-1]) for h in res.hidden_states]
    reply = torch.cat([e + h for e, h in states[1:]], dim=1)
    bos = model.speaker_map["Chelsie"]["bos_token"]
    embeds = torch.cat([states[0][0] + states[0][1], embed(torch.tensor([[bos]])), reply[:, :1]], 1)
    text_ids = torch.cat([ids, torch.tensor([[bos]]), gen[:, :1]], dim=1)
    tail = embed(torch.tensor([[talker.text_eos_token, talker.text_pad_token]]))
    reply = torch.cat([reply[:, 1:], tail], dim=1)
    codec_ids = torch.cat(
        [torch.full_like(ids, talker.codec_mask_token),
         torch.tensor([[talker.codec_pad_token, talker.codec_bos_token]])], dim=1,
    )  # fmt: skip
    mask = torch.ones_like(codec_ids)
    talker.rope_deltas = None
    out = talker(
        input_ids=codec_ids, input_text_ids=text_ids, inputs_embeds=embeds, attention_mask=mask,
        thinker_reply_part=reply, use_cache=True,
    )  # fmt: skip
    codes = []
    for _ in range(TALKER["talker_max_tokens"]):
        logits = out.logits[0, -1].clone()
        logits[talker.codec_bos_token] = float("-inf")
        code = int(logits.argmax())
        if code in (talker.codec_pad_token, talker.codec_eos_token):
            break
        codes.append(code)
        mask = torch.cat([mask, mask.new_ones(1, 1)], dim=1)
        out = talker(
            input_ids=torch.tensor([[code]]), attention_mask=mask,
            past_key_values=out.past_key_values, thinker_reply_part=out.thinker_reply_part,
            use_cache=True,
        )  # fmt: skip
    return gen[0].tolist(), torch.tensor(codes)


def test_full_payload_matches_transformers_generate(stages):
    res = stages.run_full({"a": {"messages": MSGS}})["a"]
    assert res["text"] and len(res["tokens"]) == THINKER["max_tokens"]
    assert res["rate"] == 24000 and res["audio"].size > 0 and np.isfinite(res["audio"]).all()
    prompt = prompt_ids(stages.engines[0].adapter.tokenizer, {"messages": MSGS})
    tokens, codes = _reference(stages, prompt)
    assert res["tokens"] == tokens
    ours = torch.as_tensor(res["codes"])
    if stages.name == "qwen2_5_omni":
        assert torch.equal(ours, codes)
        ours = ours[ours < stages.engines[2].adapter.num_codes]
    else:  # transformers drops the last frame's residual codes when it stops on max tokens
        n = codes.shape[1]
        assert torch.equal(ours[:n], codes.T)
    spc = stages.engines[2].adapter.samples_per_code
    assert res["audio"].size >= (len(ours) - 1) * spc


def test_async_chunk_streams_audio_before_text_ends(stages):
    req = {"messages": MSGS}
    # A reply long enough for the talker to fill the vocoder's first window mid-text.
    stages.overrides = {"max_tokens": 40, "talker_max_tokens": 48}
    try:
        full = stages.run_full({"a": req})["a"]
        chunked, order = stages.run_chunked({"a": req})
    finally:
        stages.overrides = {}
    res = chunked["a"]
    assert res["tokens"] == full["tokens"]
    assert np.array_equal(res["codes"], full["codes"])
    first_audio = order.index((2, "a"))
    last_text = max(i for i, (stage, _) in enumerate(order) if stage == 0)
    assert first_audio < last_text, "first audio should leave before the thinker finishes"
    assert res["audio_chunks"] >= 2
    assert res["audio"].shape == full["audio"].shape
    if stages.name == "qwen3_omni_moe":  # causal decoder: chunking is seamless
        np.testing.assert_allclose(res["audio"], full["audio"], atol=1e-4)


def test_the_talker_starts_on_the_thinker_first_token(stages):
    """Qwen3-Omni's talker reads reply text by token id from its own embedding table, so it
    prefills as soon as the thinker's first token is out; Qwen2.5-Omni's reads each token's
    hidden state, which comes with the thinker's next step."""
    _, order = stages.run_chunked({"a": {"messages": MSGS}})
    first_talker = order.index((1, "a"))
    thinker_before = sum(1 for stage, _ in order[:first_talker] if stage == 0)
    assert thinker_before == (1 if stages.name == "qwen3_omni_moe" else 2), order[:8]


def test_four_concurrent_requests_equal_each_alone(stages):
    prompts = ["Hello!", "What is in this picture?", "Numbers 0 1 2 3", "The quick brown fox"]
    reqs = {f"r{i}": {"messages": [{"role": "user", "content": p}]} for i, p in enumerate(prompts)}
    alone = {rid: stages.run_full({rid: req})[rid] for rid, req in reqs.items()}
    together, _ = stages.run_chunked(reqs)
    for rid in reqs:
        assert together[rid]["tokens"] == alone[rid]["tokens"]
        assert np.array_equal(together[rid]["codes"], alone[rid]["codes"])
        assert together[rid]["audio"].shape == alone[rid]["audio"].shape
        if stages.name == "qwen3_omni_moe":
            np.testing.assert_allclose(together[rid]["audio"], alone[rid]["audio"], atol=1e-4)


def test_audio_and_image_inputs_match_transformers(stages):
    rng = np.random.default_rng(0)
    audio = (rng.standard_normal(8000) * 0.1).astype(np.float32)
    image = (rng.random((56, 56, 3)) * 255).astype(np.uint8)
    engines = stages.engines
    engines[0].add("m", {"messages": MSGS, "audio": audio, "image": image}, stages.params(0))
    thinker = []
    while engines[0].has_work():
        thinker += [o.payload for o in engines[0].step()]
    prompt = torch.tensor([thinker[0]["prompt_token_ids"]])
    adapter = engines[0].adapter
    assert (prompt == adapter.config.audio_token_id).sum() > 0
    assert (prompt == adapter.config.image_token_id).sum() > 0
    feats = adapter.features(
        [audio], sampling_rate=16000, return_attention_mask=True, padding="longest",
        return_tensors="pt",
    )  # fmt: skip
    pix = adapter.image_processor()(images=[image], return_tensors="pt")
    media = {
        "input_features": feats["input_features"], "feature_attention_mask": feats["attention_mask"],
        "pixel_values": pix["pixel_values"], "image_grid_thw": pix["image_grid_thw"],
    }  # fmt: skip
    n = THINKER["max_tokens"]
    want = adapter.model.generate(
        input_ids=prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n,
        min_new_tokens=n, do_sample=False, **media,
    )[0, prompt.shape[1] :].tolist()  # fmt: skip
    assert [t for p in thinker for t in p["token_ids"]] == want
    engines[1].add("m", stages.full[1]({0: thinker}, {}), stages.params(1))
    talker = []
    while engines[1].has_work():
        for out in engines[1].step():
            assert out.error is None, out.error
            talker.append(out.payload)
    assert talker and "finish_reason" in talker[-1]
    codes = [p["codes"] for p in talker if "codes" in p]
    codes = np.concatenate(codes) if codes else np.zeros((0, 16), np.int64)
    if stages.name != "qwen3_omni_moe":
        return
    from transformers import Qwen3OmniMoeForConditionalGeneration

    model = Qwen3OmniMoeForConditionalGeneration.from_pretrained(stages.path).eval()
    model.talker.config.audio_config = model.config.thinker_config.audio_config  # typed, not a dict
    ref = _qwen3_generate_codes(model, prompt, **media).T.numpy()
    assert len(codes) >= len(ref)
    np.testing.assert_array_equal(codes[: len(ref)], ref)


def test_audio_at_another_rate_is_resampled_for_the_audio_encoder(stages):
    """0.5 s of audio is 0.5 s whatever its rate: the same number of audio tokens at 16 and 24 kHz."""
    engine, counts = stages.engines[0], []
    for rate in (16_000, 24_000):
        audio = (0.1 * np.sin(2 * np.pi * 220 * np.arange(rate // 2) / rate)).astype(np.float32)
        engine.add(f"r{rate}", {"messages": MSGS, "audio": audio, "sample_rate": rate}, stages.params(0))
        outs = []
        while engine.has_work():
            outs += [o.payload for o in engine.step() if o.request_id == f"r{rate}"]
        counts.append(outs[0]["prompt_token_ids"].count(engine.adapter.config.audio_token_id))
    assert counts[0] > 0 and counts[0] == counts[1], counts


def test_abort_mid_stream_leaves_others_running(stages):
    reqs = {"keep": {"messages": MSGS}, "drop": {"messages": MSGS}}
    res, _ = stages.run_chunked(reqs, abort_at={"drop": 4})
    assert "drop" not in res and res["keep"]["audio"].size > 0
    for eng in stages.engines:
        assert not eng.has_work()


def test_unknown_speaker_fails_that_request(stages):
    with pytest.raises(ValueError, match=r"^voice: unknown voice 'nobody'"):
        stages.engines[1].add("x", {"speaker": "nobody"}, {}, streaming=True)
    with pytest.raises(ValueError, match=r"^voice: unknown voice 'Nobody'"):  # chat's audio.voice
        stages.engines[1].add("y", {}, {"voice": "Nobody"}, streaming=True)


def test_the_last_text_output_counts_the_prompt(stages):
    """usage.prompt_tokens: the thinker's last output says how long the prompt was (it said nothing,
    so every transformers-engine answer reported 0 prompt tokens)."""
    thinker = stages.engines[0]
    thinker.add("u", {"messages": MSGS}, {**THINKER, "max_tokens": 2})
    outs = []
    while thinker.has_work():
        outs.extend(o.payload for o in thinker.step())
    prompt = prompt_ids(thinker.adapter.tokenizer, {"messages": MSGS})
    assert outs[-1]["prompt_tokens"] == len(prompt)
    assert outs[0]["prompt_tokens"] == len(prompt)  # (also the first: a route's stop cut may end it before the last)


COLOR = {"type": "object", "additionalProperties": False, "required": ["color"],
         "properties": {"color": {"type": "string", "enum": ["red", "green", "blue"]}}}


def _thinker_text(thinker, requests: dict[str, dict]) -> dict[str, tuple[str, str]]:
    for rid, params in requests.items():
        thinker.add(rid, {"messages": MSGS}, params)
    text: dict[str, list[str]] = {rid: [] for rid in requests}
    reason: dict[str, str] = {}
    while thinker.has_work():
        for out in thinker.step():
            text[out.request_id].append(out.payload["text"])
            if out.finished:
                reason[out.request_id] = out.payload["finish_reason"]
    return {rid: ("".join(t), reason[rid]) for rid, t in text.items()}


def test_a_json_schema_guides_the_thinker_and_leaves_its_neighbours_alone(stages):
    """response_format on the transformers engine (llguidance): the tiny random thinker's answer is
    JSON in the schema, ended by the grammar; an unguided request in the same batch is what it is alone."""
    import json

    thinker = stages.engines[0]
    plain = {"max_tokens": 8, "temperature": 0.0}
    alone = _thinker_text(thinker, {"alone": plain})["alone"]
    got = _thinker_text(thinker, {
        "schema": {"max_tokens": 40, "temperature": 0.0, "structured_outputs": {"json": COLOR}},
        "object": {"max_tokens": 60, "temperature": 0.0, "structured_outputs": {"json_object": True}},
        "plain": plain})
    text, reason = got["schema"]
    assert json.loads(text)["color"] in ("red", "green", "blue") and reason == "stop", got
    loose, why = got["object"]  # a random model may fill a key until max_tokens; what it wrote is still JSON so far
    assert loose.startswith("{") and (why == "length" or isinstance(json.loads(loose), dict)), got
    assert got["plain"] == alone
    with pytest.raises(ValueError, match=r"^response_format: "):
        thinker.add("bad", {"messages": MSGS}, {"structured_outputs": {"json": {"type": "nonsense"}}})


def test_voice_names_pick_the_speaker_in_talker_and_vocoder(stages):
    """A speaker's name in any case, or an OpenAI voice name, picks one of the model's speakers;
    the talker and (Qwen2.5-Omni) the vocoder pick the same one."""
    talker = stages.engines[1].adapter
    names = sorted(talker.speakers) if stages.name == "qwen2_5_omni" else sorted(talker.tc.speaker_id)
    for i, voice in enumerate((names[-1].upper(), "alloy", "ash")):
        rid = f"v{i}"
        stages.engines[1].add(rid, {}, {"voice": voice}, streaming=True)
        got = stages.engines[1].seqs[rid].data["speaker"]
        want = names[-1] if i == 0 else names[i - 1]  # alloy, ash: the first and second, in order
        if stages.name == "qwen2_5_omni":
            assert got == want
            assert stages.engines[2].adapter.start({}, {"voice": voice})["speaker"] == want
        else:
            assert got == talker.tc.speaker_id[want]
        stages.engines[1].abort(rid)


@pytest.mark.parametrize("damage", ["weights", "config", "speakers"])
def test_corrupt_checkpoint_names_the_file(stages, tmp_path, damage):
    broken = tmp_path / "broken"
    shutil.copytree(stages.path, broken)
    if damage == "weights":
        (broken / "model.safetensors").unlink()
        name, stage = "model.safetensors", 1
    elif damage == "config":
        (broken / "config.json").write_text('{"model_type": "qwen2_5_omni", ')
        name, stage = "config.json", 0
    else:
        if stages.name != "qwen2_5_omni":
            pytest.skip("only Qwen2.5-Omni has a speaker file")
        (broken / "spk_dict.pt").write_bytes(b"not a torch file")
        name, stage = "spk_dict.pt", 2
    spec = stages.pipe.stage(stage)
    with pytest.raises((FileNotFoundError, ValueError), match=name):
        resolve(spec.engine)(_ctx(spec, broken))


def test_pipeline_modules_import_without_torch():
    code = (
        "import sys; from omni_actors.config.pipeline import get_pipeline; "
        "[get_pipeline(n) for n in ('qwen2_5_omni', 'qwen3_omni_moe')]; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


async def test_end_to_end_through_real_workers(stages):
    """One streamed chat through the orchestrator and three worker processes (async chunk)."""
    if stages.name != "qwen3_omni_moe":
        pytest.skip("one pipeline end to end is enough for the default suite")
    from omni_actors.config.deploy import build_deploy
    from omni_actors.orchestrator.core import Orchestrator
    from omni_actors.orchestrator.requests import RequestSpec

    raw = {"pipeline": stages.name, "model": str(stages.path), "async_chunk": True}
    orch = Orchestrator(build_deploy(raw, source="test"))
    await orch.start()
    try:
        spec = RequestSpec(
            inputs={"messages": MSGS},
            params={"max_tokens": 120, "ignore_eos": True, "talker_max_tokens": 40,
                    "talker_temperature": 0.0},
        )  # fmt: skip
        chunks = await orch.submit(spec).collect()
        assert orch.statistics().leases_held == 0
        guided = await orch.submit(RequestSpec(inputs={"messages": MSGS}, params={
            "max_tokens": 40, "temperature": 0.0, "structured_outputs": {"json": COLOR}, "talker_max_tokens": 8,
        })).collect()  # a JSON answer through the worker processes (spoken too)
        said = "".join(c.data.get("text", "") for c in guided if c.stage_id == 0)
        assert json.loads(said)["color"] in ("red", "green", "blue"), said
    finally:
        await orch.stop()
    text = "".join(c.data.get("text", "") for c in chunks if c.stage_id == 0)
    audio = [c for c in chunks if c.output_type == "audio"]
    assert text and audio and audio[-1].finished
    assert all(c.data["sample_rate"] == 24000 for c in audio)
    assert sum(c.data["audio"].size for c in audio) > 0
    first_audio = chunks.index(audio[0])
    text_done = next(i for i, c in enumerate(chunks) if c.stage_id == 0 and c.finished)
    assert first_audio < text_done and len(audio) >= 2
