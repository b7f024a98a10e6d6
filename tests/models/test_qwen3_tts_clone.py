"""qwen3_tts, Base variant: voice cloning from a custom voice's clip (and transcript), openai SDK, real server.

A Base folder has no built-in voices: `/v1/models/{id}` lists none and says it takes custom
voices; a custom voice's clip conditions the audio (speaker embedding, and with a transcript
the clip's codes in context); built-in names, no voice and `instructions` are 400s.
"""

from __future__ import annotations

import base64
import io
import json

import aiohttp
import numpy as np
import openai
import pytest
import soundfile as sf
import torch

from omni_actors.api.voice_store import VoiceStore
from omni_actors.models.qwen3_tts.clone import ClonePrompts
from omni_actors.models.qwen3_tts.talker import Qwen3TTSTalkerAdapter
from omni_actors.store import Store
from omni_actors.workers.engine import EngineContext
from omni_actors.workers.engines.hf_ar_adapter import ARSeq
from tests.api.conftest import Server, eventually, idle
from tests.models.speech_family import TEXT, Family, _wav, family_fixtures, speech_until_done

FAMILY = Family("qwen3_tts-base", rate=24000, frame=1920, voices=())
MAX_FRAMES = 20
"""The tiny folder's generation_config max_new_tokens: a request makes at most this many frames."""
CLIP_S = 2.0
"""Reference clips are longer than any answer (25 frames > MAX_FRAMES): audio that held the clip would show."""

fam, model_dir, data_dir, srv = family_fixtures(FAMILY)


def _tone(hz: float, seconds: float = CLIP_S, rate: int = 16000) -> bytes:
    t = np.arange(int(seconds * rate)) / rate
    buf = io.BytesIO()
    sf.write(buf, (0.3 * np.sin(2 * np.pi * hz * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype(np.float32),
             rate, format="WAV")
    return buf.getvalue()


@pytest.fixture(scope="module")
async def voices(srv: Server, data_dir) -> dict[str, str]:
    """Custom voices under one consent: a low tone with and without its transcript, a high tone, and a 20 ms
    blip stored as a server before the 1 s floor on samples (api/voices.py MIN_SAMPLE_S) would have kept it."""
    client = srv.client()
    consent = await client.audio.voice_consents.create(recording=("consent.wav", _tone(200, 1.0), "audio/wav"),
                                                       language="en-US", name="me")
    made = {}
    for name, hz, transcript, seconds in (("low", 180, "A low hum.", CLIP_S), ("low_untold", 180, None, CLIP_S),
                                          ("high", 700, "A whistle.", CLIP_S)):
        extra = {"transcript": transcript} if transcript else {}
        voice = await client.audio.voices.create(audio_sample=(f"{name}.wav", _tone(hz, seconds), "audio/wav"),
                                                 consent=consent.id, name=name, extra_body=extra)
        made[name] = voice.id
    store = Store(data_dir)
    try:
        blip, rate = sf.read(io.BytesIO(_tone(500, 0.02)), dtype="float32")
        made["blip"] = VoiceStore(store).add_voice("blip", consent.id, blip, rate, "").id
    finally:
        store.close()
    return made


async def test_base_folder_lists_no_voices_and_takes_custom_ones(srv: Server) -> None:
    assert srv.orch.pipeline.name == "qwen3_tts" and srv.orch.pipeline.speech.cloning
    model = await srv.client().models.retrieve(FAMILY.model)
    assert model.model_extra["voices"] == [] and model.model_extra["custom_voices"] is True


async def test_a_cloned_voice_is_deterministic_and_the_clip_conditions_it(srv: Server, voices) -> None:
    a, rate = await _wav(srv, FAMILY, voice={"id": voices["low"]}, extra_body={"seed": 5})
    b, _ = await _wav(srv, FAMILY, voice={"id": voices["low"]}, extra_body={"seed": 5})
    high, _ = await _wav(srv, FAMILY, voice={"id": voices["high"]}, extra_body={"seed": 5})
    untold, _ = await _wav(srv, FAMILY, voice={"id": voices["low_untold"]}, extra_body={"seed": 5})
    assert rate == 24000 and a.size and a.size % FAMILY.frame == 0
    assert a.size == b.size and np.allclose(a, b, atol=1e-4)
    for other in (high, untold):  # another clip; the same clip without its transcript (no codes in context)
        assert other.size != a.size or not np.allclose(other, a, atol=1e-3)
    for audio in (a, high, untold):  # only the new frames are spoken, never the 2 s clip
        assert 0 < audio.size <= MAX_FRAMES * FAMILY.frame
    await eventually(lambda: idle(srv.orch))


async def test_sse_stream_of_a_cloned_voice_matches_the_whole_answer(srv: Server, voices) -> None:
    whole, _ = await _wav(srv, FAMILY, voice={"id": voices["low"]}, extra_body={"seed": 6})
    body = {"model": FAMILY.model, "input": TEXT, "voice": {"id": voices["low"]}, "response_format": "pcm",
            "stream_format": "sse", "seed": 6}
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.post(srv.url + "/v1/audio/speech",
                                                                        json=body) as resp:
        assert resp.status == 200
        data = [line async for line in resp.content if line.startswith(b"data: ")]
    events = [json.loads(line[6:]) for line in data]
    pcm = b"".join(base64.b64decode(e["audio"]) for e in events if e["type"] == "speech.audio.delta")
    streamed = np.frombuffer(pcm, "<i2").astype(np.float32) / 32768
    assert events[-1]["type"] == "speech.audio.done" and streamed.size == whole.size
    assert np.abs(streamed - whole).max() < 2e-3


async def test_base_refuses_builtin_voices_no_voice_and_instructions(srv: Server, voices) -> None:
    client = srv.client()
    for name in ("alloy", "vivian"):
        with pytest.raises(openai.BadRequestError) as err:
            await client.audio.speech.create(model=FAMILY.model, input=TEXT, voice=name)
        body = err.value.body
        assert body["param"] == "voice" and body["code"] == "custom_voice_required" and "custom voice" in body["message"]
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.post(
            srv.url + "/v1/audio/speech", json={"model": FAMILY.model, "input": TEXT}) as resp:
        assert resp.status == 400 and (await resp.json())["error"]["param"] == "voice"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=FAMILY.model, input=TEXT, voice={"id": voices["low"]},
                                         instructions="Whisper.")
    assert err.value.body["param"] == "instructions"
    with pytest.raises(openai.BadRequestError) as err:
        await client.audio.speech.create(model=FAMILY.model, input=TEXT, voice={"id": "voice_missing"})
    assert err.value.body["param"] == "voice"
    with pytest.raises(openai.BadRequestError) as err:  # too short for a speaker embedding
        await client.audio.speech.create(model=FAMILY.model, input=TEXT, voice={"id": voices["blip"]})
    assert "too short" in err.value.body["message"]
    await eventually(lambda: idle(srv.orch))


def test_the_clone_prompt_layout(model_dir) -> None:
    """In process: the speaker embedding takes the speaker's row; with a transcript the clip's frames follow
    codec-bos under transcript + text; without one only the speaker row clones."""
    ctx = EngineContext(stage_id=0, replica=0, model_stage="talker", model_path=model_dir, device="cpu",
                        max_num_seqs=2, dtype="float32", gpu_memory_utilization=0.5, tensor_parallel_size=1,
                        engine_extras={})  # fmt: skip
    talker = Qwen3TTSTalkerAdapter(ctx)
    model = talker.load()
    clip, _ = sf.read(io.BytesIO(_tone(180, rate=24000)), dtype="float32")
    spk = talker.clone.speaker_row(clip, torch.float32)
    tc, ids = talker.tc, (lambda t: talker.tokenizer(t, add_special_tokens=False).input_ids)
    codec = model.get_input_embeddings()
    role = len(ids("<|im_start|>assistant\n"))  # (3 tokens in Qwen's vocabulary, more in the tiny one)
    head = 3  # nothink, think-bos, think-eos (the language is automatic)
    for transcript in ("A low hum.", None):
        seq = ARSeq("r", {}, False)
        talker.start(seq, {"text": TEXT, "reference_audio": clip, "reference_text": transcript})
        with torch.inference_mode():
            rows = talker.prefill(seq).embeds
            torch.testing.assert_close(rows[role + head], talker.tts_pad + spk)
            bos = codec(torch.tensor(tc["codec_bos_id"]))
            text = (ids(transcript) if transcript else []) + ids(TEXT)  # each tokenized alone, as the original
            first = model.text(torch.tensor(text[:1]))[0]
            torch.testing.assert_close(rows[role + head + 2], first + bos)
        d = seq.data
        if transcript is None:
            assert rows.shape[0] == role + head + 3 and d["context"] is None
            assert d["trailing"].shape[0] == len(text)  # the text's rest, then tts-eos
        else:
            frames = -(-clip.size // 1920)
            assert d["context"].shape == (frames, tc["num_code_groups"])
            assert rows.shape[0] == role + head + 2 + 1 + frames
            assert d["trailing"].shape[0] == max(0, len(text) + 1 - (1 + frames))
    with pytest.raises(ValueError, match="custom voice"):
        talker.start(ARSeq("r", {}, False), {"text": TEXT, "voice": "vivian"})


async def test_text_in_socket_speaks_in_a_cloned_voice(srv: Server, voices) -> None:
    """The text-in socket: without a voice a Base model's text is an `error` (the session lives on);
    with a custom voice the first clause speaks before input_text.done."""
    async with aiohttp.ClientSession(headers=srv.headers) as s, s.ws_connect(
            srv.url.replace("http", "ws") + "/v1/audio/speech/stream") as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        await ws.send_json({"type": "session.update", "session": {"voice": "alloy"}})
        err = await ws.receive_json()
        assert err["type"] == "error" and err["error"]["param"] == "session.voice"
        await ws.send_json({"type": "session.update", "session": {"voice": {"id": voices["low"]}, "seed": 3}})
        assert (await ws.receive_json())["type"] == "session.updated"
        await ws.send_json({"type": "input_text.append", "text": "Hello there, friend. And"})
        first = await ws.receive_json()
        assert first["type"] == "speech.audio.delta"
        await ws.send_json({"type": "input_text.append", "text": " goodbye."})
        await ws.send_json({"type": "input_text.done"})
        _, pcm = await speech_until_done(ws, [first])
        assert len(pcm) % (2 * FAMILY.frame) == 0 and len(pcm) >= 3 * 2 * FAMILY.frame
    await eventually(lambda: idle(srv.orch), timeout_s=10)


def test_the_speaker_mel_of_a_tone_peaks_at_its_band(model_dir) -> None:
    """128 log-mel bands, frames every 256 samples after (1024 - 256) / 2 reflect padding a side; a
    1 kHz tone is loudest in the band whose filter peaks nearest 1 kHz."""
    from omni_actors.models.qwen3_tts.clone import CloneEncoder
    from omni_actors.models.qwen3_tts.modules import load_talker

    _talker, spk, _ = load_talker(model_dir, "cpu", torch.float32)
    enc = CloneEncoder(model_dir, spk, "cpu")
    n = 24000
    mel = enc.mel((0.5 * np.sin(2 * np.pi * 1000 * np.arange(n) / 24000)).astype(np.float32))
    assert mel.shape == (1, (n + 768 - 1024) // 256 + 1, 128)
    peaks = enc.filters.argmax(dim=1).float() * 24000 / 1024  # each band's peak frequency
    loudest = int(mel[0].mean(0).argmax())
    assert abs(float(peaks[loudest]) - 1000) < 60
    assert float(mel.min()) >= np.log(1e-5) - 1e-4


def _talker_engine(model_dir, **extras):
    from omni_actors.workers.engines.hf_ar import HfAREngine

    adapter = "omni_actors.models.qwen3_tts.talker:Qwen3TTSTalkerAdapter"
    return HfAREngine(EngineContext(stage_id=0, replica=0, model_stage="talker", model_path=model_dir,
                                    device="cpu", max_num_seqs=2, dtype="float32", gpu_memory_utilization=0.5,
                                    tensor_parallel_size=1, engine_extras={"adapter": adapter, **extras}))


def _speak(engine, rid: str, inputs: dict) -> tuple[np.ndarray, np.ndarray | None]:
    """(every frame's codes, the context codes sent with the first) of one request run to its end."""
    engine.add(rid, {"text": TEXT, **inputs}, {"seed": 5})
    codes, context = [], None
    while engine.has_work():
        for out in engine.step():
            assert out.error is None and out.request_id == rid
            codes.extend(out.payload.get("codes", []))
            context = out.payload.get("context_codes", context)
    return np.array(codes), context


def test_a_repeated_voice_skips_both_encoders_and_speaks_the_same(model_dir) -> None:
    """Through the real talker engine: the second request of a voice hits the clone cache (no encoder
    runs: hooks on both count) and its frames and clip codes equal the first's and an uncached engine's."""
    clip, _ = sf.read(io.BytesIO(_tone(180, rate=24000)), dtype="float32")
    other, _ = sf.read(io.BytesIO(_tone(700, rate=24000)), dtype="float32")
    low = {"reference_audio": clip, "reference_text": "A low hum.", "reference_id": "voice_low"}
    cached, uncached = _talker_engine(model_dir), _talker_engine(model_dir, clone_cache_size=0)
    talker = cached.adapter
    runs: list[str] = []
    talker.clone.speaker.register_forward_hook(lambda *_: runs.append("speaker"))
    talker.clone.codec.encoder.register_forward_hook(lambda *_: runs.append("codec"))  # Mimi's conv encoder
    first = _speak(cached, "a", low)
    assert sorted(set(runs)) == ["codec", "speaker"] and talker.clone_prompts.statistics().misses == 1
    runs.clear()
    again = _speak(cached, "b", low)
    stats = talker.clone_prompts.statistics()
    assert runs == [] and (stats.hits, stats.misses, stats.entries) == (1, 1, 1)
    fresh = _speak(uncached, "c", low)
    assert uncached.adapter.clone_prompts.statistics().entries == 0
    for got in (again, fresh):
        assert np.array_equal(got[0], first[0]) and np.array_equal(got[1], first[1])
    assert len(first[0]) > 0 and first[1] is not None and first[1].shape[0] > 0
    # the same id with another clip, or without the transcript, is another entry (no stale hit)
    _speak(cached, "d", {**low, "reference_audio": other})
    _speak(cached, "e", {**low, "reference_text": None})
    assert talker.clone_prompts.statistics().misses == 3 and talker.clone_prompts.statistics().entries == 3
    # bounded: a third voice in a cache of two drops the least recently used
    small = ClonePrompts(talker.clone, 2)
    keys = [ClonePrompts.key(f"voice_{i}", clip * (1 + i), "") for i in range(3)]
    for key in (keys[0], keys[1], keys[0], keys[2]):
        small.parts(key, clip, torch.float32, codes=False)
    assert set(small.entries) == {keys[0], keys[2]} and small.statistics().hits == 1
