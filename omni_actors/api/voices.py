"""Custom voices, OpenAI's API as the SDK calls it: voice consents and voices made from audio samples.

    POST   /v1/audio/voice_consents          multipart: recording, name, language
    GET    /v1/audio/voice_consents          ?after=&limit= (1-100, default 20): a cursor page; an `after`
                                             that names no consent (nor a deleted one) is a 400 naming it
    GET    /v1/audio/voice_consents/{id}
    POST   /v1/audio/voice_consents/{id}     JSON {"name"}: rename
    DELETE /v1/audio/voice_consents/{id}     409 while a voice uses it
    POST   /v1/audio/voices                  multipart: audio_sample, consent, name, [type
                                             "audio_sample"], [transcript: what the sample says];
                                             a prompt voice (type "prompt", prompt, ...) is a 400 naming `type`
    GET    /v1/audio/voices                  every voice (a list object)
    GET    /v1/audio/voices/{id}
    DELETE /v1/audio/voices/{id}

A voice is its sample (stored as WAV) and the sample's transcript. Pipelines that
clone (`SpeechSpec.cloning`) condition on both; the transcript is the form's
`transcript` field when given (an empty one too), else what the bundled Whisper
tiny.en hears in the sample (voice_asr.py: English consents only; else empty, which
cloning families accept with a weaker match).
A sample shorter than MIN_SAMPLE_S (1 s) is a 400 naming `audio_sample` (code
`audio_too_short`, its length in samples and ms); a longer one is cut to MAX_SAMPLE_S (60 s). A consent
recording has the same minimum (a 400 naming `recording`, same code).
A sample whose kept part peaks below SILENCE_DBFS (-60 dBFS: silence, or near it) is a 400
naming `audio_sample` (code `audio_silent`): there is no voice in it to clone. A consent
recording is held to the same floor (a 400 naming `recording`, same code): silence consents to nothing.
Rows live in SQLite (voice_store.py) and survive a restart. Upload parts are
read with the server's body size and time limits.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import msgspec
import numpy as np
from aiohttp import web
from msgspec import Struct

from omni_actors.api.audio_codec import decode_audio, off_loop
from omni_actors.api.errors import ApiError, bad_request
from omni_actors.api.multipart import read_form
from omni_actors.api.paging import page_limit
from omni_actors.api.schemas import read_body
from omni_actors.api.voice_asr import transcribe
from omni_actors.api.voice_store import Consent, ConsentInUse, Voice, VoiceStore

VOICES_KEY = web.AppKey("voice_store", VoiceStore)
"""The app's voice store (set by tests to a private data dir; else the process's store)."""
MAX_NAME_CHARS = 256
MAX_LANGUAGE_CHARS = 35
MAX_TRANSCRIPT_CHARS = 4096
MAX_SAMPLE_S = 60.0
"""Longest voice sample kept (a cloning prompt longer than this only costs time)."""
MIN_SAMPLE_S = 1.0
"""Shortest voice sample taken: a clone of less than a second of speech is no voice, and the cloning
models' encoders fail on clips of a few milliseconds (the models refuse those themselves too)."""
SILENCE_DBFS = -60.0
"""A sample peaking below this (dB of full scale) is silence, or near it: no voice to clone. Speech peaks
tens of dB above it; a quiet room's noise floor, or a dithered digital silence, stays below it."""
DEFAULT_PAGE, MAX_PAGE = 20, 100
PROMPT_VOICE_FIELDS = frozenset({"prompt", "model", "script_hint"})
"""The fields of OpenAI's prompt voices (`type: "prompt"`), which are not made here: taken only to refuse
them as such, naming `type`, instead of as unknown fields."""


class ConsentObject(Struct):
    id: str
    created_at: int
    language: str
    name: str
    object: Literal["audio.voice_consent"] = "audio.voice_consent"


class ConsentDeleted(Struct):
    id: str
    deleted: bool = True
    object: Literal["audio.voice_consent"] = "audio.voice_consent"


class ConsentPage(Struct):
    data: list[ConsentObject]
    has_more: bool
    first_id: str | None
    last_id: str | None
    object: Literal["list"] = "list"


class VoiceObject(Struct):
    id: str
    created_at: int
    name: str
    type: Literal["audio_sample"] = "audio_sample"
    object: Literal["audio.voice"] = "audio.voice"


class VoiceList(Struct):
    data: list[VoiceObject]
    object: Literal["list"] = "list"


class VoiceDeleted(Struct):
    id: str
    deleted: bool = True
    object: Literal["audio.voice.deleted"] = "audio.voice.deleted"


class ConsentUpdate(Struct, forbid_unknown_fields=True):
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_NAME_CHARS)]


_DEFAULT: list[VoiceStore] = []


def voice_store(request: web.Request) -> VoiceStore:
    """The app's store if it was given one, else the process's (opened on first use)."""
    given = request.app.get(VOICES_KEY)
    if given is not None:
        return given
    if not _DEFAULT:
        _DEFAULT.append(VoiceStore())
    return _DEFAULT[0]


def _json(body: Struct) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), content_type="application/json")


def _consent(c: Consent) -> ConsentObject:
    return ConsentObject(c.id, c.created_at, c.language, c.name)


def _voice(v: Voice) -> VoiceObject:
    return VoiceObject(v.id, v.created_at, v.name)


def _length(samples: int, rate: int) -> str:
    """A length as samples and ms, never "0" for a non-empty clip (0.000 s hid a 1-sample upload)."""
    return f"{samples} sample{'' if samples == 1 else 's'} at {rate} Hz ({samples * 1000 / rate:.6g} ms)"


def silence(audio: np.ndarray, what: str) -> str | None:
    """Why `audio` (float32 in [-1, 1]) holds no voice (to clone, or consenting): its peak is below SILENCE_DBFS; else None."""
    peak = float(np.max(np.abs(audio))) if audio.size else 0.0
    if peak >= 10 ** (SILENCE_DBFS / 20):
        return None
    level = "every sample is 0" if peak == 0 else f"its peak is {20 * math.log10(peak):.1f} dBFS"
    return (f"{what} is silent ({level}, below the {SILENCE_DBFS:g} dBFS floor); a voice needs a recording "
            "of the speaker speaking")


def too_short(audio: np.ndarray, rate: int, what: str) -> str | None:
    """Why `audio` is too short to be a voice sample or a consent (under MIN_SAMPLE_S); else None."""
    if audio.size >= MIN_SAMPLE_S * rate:
        return None
    return (f"{what} is too short: {_length(audio.size, rate)}; a voice needs at least {MIN_SAMPLE_S:g} s of "
            f"the speaker ({math.ceil(MIN_SAMPLE_S * rate)} samples at {rate} Hz)")


def _text(fields: dict[str, str], name: str, limit: int, required: bool = True) -> str:
    value = fields.get(name, "")
    if required and not value:
        raise bad_request(f"form field `{name}` is required", name, "missing_required_parameter")
    if len(value) > limit:
        raise bad_request(f"`{name}` is longer than {limit} characters", name)
    return value


# ---- consents ----------------------------------------------------------------------------


async def create_consent(request: web.Request) -> web.Response:
    fields, blobs = await read_form(request, {"recording"}, {"name", "language"})
    name = _text(fields, "name", MAX_NAME_CHARS)
    language = _text(fields, "language", MAX_LANGUAGE_CHARS)
    if not blobs.get("recording"):
        raise bad_request("form field `recording` is required (the consent audio)", "recording",
                          "missing_required_parameter")
    audio, rate = await off_loop(decode_audio, blobs["recording"], None, "recording")  # 400 unless it is audio
    short = too_short(audio, rate, "the consent recording")  # (a 0.05 s clip was taken before 2026-12-05)
    if short:
        raise bad_request(short, "recording", "audio_too_short")
    silent = silence(audio, "the consent recording")  # (taken unheard before 2026-12-05, as samples were)
    if silent:
        raise bad_request(silent, "recording", "audio_silent")
    store = voice_store(request)
    return _json(_consent(await off_loop(store.add_consent, name, language, blobs["recording"])))


def _consent_or_404(store: VoiceStore, cid: str) -> Consent:
    found = store.consent(cid)
    if found is None:
        raise ApiError(404, f"voice consent {cid!r} does not exist", "consent_id", "not_found")
    return found


async def get_consent(request: web.Request) -> web.Response:
    return _json(_consent(_consent_or_404(voice_store(request), request.match_info["consent_id"])))


async def list_consents(request: web.Request) -> web.Response:
    after = request.query.get("after") or None
    limit = page_limit(request.query, DEFAULT_PAGE, MAX_PAGE)
    try:
        page, more = voice_store(request).consents(after, limit)
    except KeyError:  # (an empty page before 2026-12-05; /v1/videos answers the same)
        raise bad_request(f"after: no voice consent with id {after!r}", "after") from None
    data = [_consent(c) for c in page]
    return _json(ConsentPage(data, more, data[0].id if data else None, data[-1].id if data else None))


async def update_consent(request: web.Request) -> web.Response:
    body = await read_body(request, ConsentUpdate)
    cid = request.match_info["consent_id"]
    found = voice_store(request).rename_consent(cid, body.name)
    if found is None:
        raise ApiError(404, f"voice consent {cid!r} does not exist", "consent_id", "not_found")
    return _json(_consent(found))


async def delete_consent(request: web.Request) -> web.Response:
    cid = request.match_info["consent_id"]
    try:
        gone = voice_store(request).delete_consent(cid)
    except ConsentInUse as err:
        raise ApiError(409, str(err), "consent_id", "consent_in_use") from None
    if not gone:
        raise ApiError(404, f"voice consent {cid!r} does not exist", "consent_id", "not_found")
    return _json(ConsentDeleted(cid))


# ---- voices ------------------------------------------------------------------------------


async def create_voice(request: web.Request) -> web.Response:
    fields, blobs = await read_form(request, {"audio_sample"},
                                    {"name", "consent", "type", "transcript", *PROMPT_VOICE_FIELDS})
    prompted = sorted(PROMPT_VOICE_FIELDS & fields.keys())
    typed = fields.get("type", "audio_sample") != "audio_sample"
    if typed or prompted:
        raise bad_request("only `audio_sample` voices can be made here (prompt voices are not supported)",
                          "type" if typed else prompted[0], "unsupported_value")
    name = _text(fields, "name", MAX_NAME_CHARS)
    consent = _text(fields, "consent", MAX_NAME_CHARS)
    transcript = _text(fields, "transcript", MAX_TRANSCRIPT_CHARS, required=False)
    heard = "transcript" not in fields  # none given: recognise the sample
    if not blobs.get("audio_sample"):
        raise bad_request("form field `audio_sample` is required", "audio_sample", "missing_required_parameter")
    store = voice_store(request)
    agreed = store.consent(consent)
    if agreed is None:
        raise bad_request(f"voice consent {consent!r} does not exist", "consent", "not_found")
    audio, rate = await off_loop(decode_audio, blobs["audio_sample"], None, "audio_sample")
    if not audio.size:
        raise bad_request("the audio sample holds no samples", "audio_sample", "invalid_audio")
    short = too_short(audio, rate, "the audio sample")
    if short:
        raise bad_request(short, "audio_sample", "audio_too_short")
    audio = audio[: int(MAX_SAMPLE_S * rate)]
    silent = silence(audio, "the audio sample")
    if silent:
        raise bad_request(silent, "audio_sample", "audio_silent")
    if heard:
        transcript = await transcribe(audio, rate, agreed.language, MAX_TRANSCRIPT_CHARS)
    try:
        made = await off_loop(store.add_voice, name, consent, audio, rate, transcript)
    except KeyError:
        raise bad_request(f"voice consent {consent!r} does not exist", "consent", "not_found") from None
    return _json(_voice(made))


async def list_voices(request: web.Request) -> web.Response:
    return _json(VoiceList([_voice(v) for v in voice_store(request).voices()]))


async def get_voice(request: web.Request) -> web.Response:
    vid = request.match_info["voice_id"]
    found = voice_store(request).voice(vid)
    if found is None:
        raise ApiError(404, f"voice {vid!r} does not exist", "voice_id", "not_found")
    return _json(_voice(found))


async def delete_voice(request: web.Request) -> web.Response:
    vid = request.match_info["voice_id"]
    if not voice_store(request).delete_voice(vid):
        raise ApiError(404, f"voice {vid!r} does not exist", "voice_id", "not_found")
    return _json(VoiceDeleted(vid))


def add_routes(app: web.Application) -> None:
    """Every custom-voice route (one line in app.py)."""
    r = app.router
    r.add_post("/v1/audio/voice_consents", create_consent)
    r.add_get("/v1/audio/voice_consents", list_consents)
    r.add_get("/v1/audio/voice_consents/{consent_id}", get_consent)
    r.add_post("/v1/audio/voice_consents/{consent_id}", update_consent)
    r.add_delete("/v1/audio/voice_consents/{consent_id}", delete_consent)
    r.add_post("/v1/audio/voices", create_voice)
    r.add_get("/v1/audio/voices", list_voices)
    r.add_get("/v1/audio/voices/{voice_id}", get_voice)
    r.add_delete("/v1/audio/voices/{voice_id}", delete_voice)
