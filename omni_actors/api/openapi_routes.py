"""Every HTTP route the server answers, as /openapi.json describes it (openapi.py builds the document).

One `Route` per (method, path) that `app.build_app` registers, but for the WebSockets
(`/v1/realtime`, `/v1/audio/speech/stream`: not OpenAPI operations) and the playground's
page and assets. `tests/api/test_openapi.py` checks the table against the app's router,
so a new route without a row here fails a test. A route is listed for a pipeline when the
pipeline produces every output type in its `needs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omni_actors.api import chat_schemas as cs
from omni_actors.api import chat_stored as cst
from omni_actors.api import completions_schemas as cps
from omni_actors.api import conversations as cv
from omni_actors.api import responses_schemas as rs
from omni_actors.api import schemas as s
from omni_actors.api.audio_codec import CONTENT_TYPES as AUDIO_TYPES
from omni_actors.api.audio_generation import ROUTES as AUDIO_GENERATION_ROUTES
from omni_actors.api.audio_generation import AudioGenerationRequest
from omni_actors.api.batches import MAX_PAGE as BATCHES_PAGE
from omni_actors.api.batches_schemas import Batch, BatchCreate, BatchPage
from omni_actors.api.files import MAX_PAGE as FILES_PAGE
from omni_actors.api.files import FileDeleted, FileObject, FilePage
from omni_actors.api.image_edits import TEXT_FIELDS as IMAGE_EDIT_FIELDS
from omni_actors.api.image_files import CONTENT_TYPES as IMAGE_TYPES
from omni_actors.api.image_files import ROUTE as IMAGE_FILE_ROUTE
from omni_actors.api.not_served import NOT_SERVED
from omni_actors.api.realtime.client_secrets import ROUTE as CLIENT_SECRETS_ROUTE
from omni_actors.api.realtime.client_secrets import ClientSecret, ClientSecretRequest
from omni_actors.api.responses import MAX_PAGE as RESPONSES_PAGE
from omni_actors.api.speech_audio import TYPES as SPEECH_TYPES
from omni_actors.api.status import ServerStatus
from omni_actors.api.video_derive import EDIT_FIELDS, EXTEND_FIELDS
from omni_actors.api.video_jobs import RANK
from omni_actors.api.video_request import FIELDS as VIDEO_FIELDS
from omni_actors.api.videos import LIST_MAX as VIDEOS_PAGE
from omni_actors.api.videos import MAX_WAIT_S, RemixBody, Video, VideoDeleted, VideoList
from omni_actors.api.videos_store import VARIANTS
from omni_actors.api.voices import MAX_PAGE as CONSENTS_PAGE
from omni_actors.api.voices import (
    ConsentDeleted,
    ConsentObject,
    ConsentPage,
    ConsentUpdate,
    VoiceDeleted,
    VoiceList,
    VoiceObject,
)

SSE = "text/event-stream"
NOT_FOUND = "No such object"


@dataclass(frozen=True)
class Form:
    """A multipart/form-data body: its file parts and text fields (names), the required ones."""

    files: tuple[str, ...]
    fields: tuple[str, ...]
    required: tuple[str, ...] = ()


@dataclass(frozen=True)
class Query:
    """A query-string parameter a route reads (optional): its name, JSON type, what it means, its choices."""

    name: str
    kind: str
    description: str
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    request: type | Form | None
    """A msgspec struct sent as JSON, a multipart form, or no body."""
    ok: dict[str, Any]
    """Content type -> schema of the 200 answer (None: a string / binary body)."""
    needs: frozenset[str] = frozenset()
    """Output types the pipeline must produce for the route to be served."""
    extra: tuple[tuple[str, str, type], ...] = ()
    """Other answers: (status, description, schema), sent as JSON."""
    query: tuple[Query, ...] = ()
    """The query-string parameters it reads."""


def _binary(types: Any) -> dict[str, None]:
    return dict.fromkeys(sorted(set(types)))


_SPEECH = _binary(SPEECH_TYPES.values())
_MISSING = (("404", NOT_FOUND, s.ErrorResponse),)
_BUSY = (("404", NOT_FOUND, s.ErrorResponse), ("409", "Not in a state that allows this", s.ErrorResponse))
_TEXT, _AUDIO, _IMAGE, _VIDEO = (frozenset({k}) for k in ("text", "audio", "image", "video"))
GENERATED_AUDIO = "generated_audio"
"""Not an output type: audio from a DIFFUSION stage (a sound from a prompt, not speech of a text;
openapi.served_outputs)."""
_VIDEO_FORM = Form(("input_reference",), tuple(sorted(VIDEO_FIELDS - {"input_reference"})), ("prompt",))
_AFTER = Query("after", "string", "The id after which the page starts")
_ORDER = Query("order", "string", "By creation time", ("asc", "desc"))


def _limit(most: int) -> Query:
    return Query("limit", "integer", f"Items in a page, 1 to {most}")


_CHAT_ID = "/v1/chat/completions/{completion_id}"
_VIDEO_ID = "/v1/videos/{video_id}"
_RESPONSE_ID = "/v1/responses/{response_id}"
_CONVERSATION_ID = "/v1/conversations/{conversation_id}"
_INCLUDE = Query("include", "string", "Accepted (OpenAI's include values; repeat it for several): changes nothing",
                 tuple(sorted(cv.INCLUDABLE)))
_CONSENTS = "/v1/audio/voice_consents"
_VOICES = "/v1/audio/voices"
_FILE_ID = "/v1/files/{file_id}"
_BATCH_ID = "/v1/batches/{batch_id}"

ROUTES = (
    Route("post", "/v1/chat/completions", "Chat completion (chat.completion.chunk events when stream=true)",
          cs.ChatCompletionRequest, {"application/json": cs.ChatCompletion, SSE: cs.ChatCompletionChunk}, _TEXT),
    Route("post", "/v1/completions", "Legacy text completion of a raw prompt (text_completion chunks when "
          "stream=true)", cps.CompletionRequest, {"application/json": cps.Completion, SSE: cps.CompletionChunk}, _TEXT),
    Route("get", "/v1/chat/completions", "Stored chat completions (store=true)", None,
          {"application/json": cst.ChatCompletionList}, _TEXT,
          query=(_AFTER, _limit(cst.MAX_PAGE), Query("order", "string", "By when stored (default asc)", ("asc", "desc")),
                 Query("model", "string", "Only completions of this model"),
                 Query("metadata[key]", "string", "Only completions with this metadata value (one per key)"))),
    Route("get", _CHAT_ID, "A stored chat completion", None, {"application/json": cst.StoredChatCompletion},
          _TEXT, _MISSING),
    Route("post", _CHAT_ID, "Replace a stored chat completion's metadata", cst.ChatCompletionUpdate,
          {"application/json": cst.StoredChatCompletion}, _TEXT, _MISSING),
    Route("delete", _CHAT_ID, "Delete a stored chat completion", None,
          {"application/json": cst.ChatCompletionDeleted}, _TEXT, _MISSING),
    Route("get", _CHAT_ID + "/messages", "A stored chat completion's request messages", None,
          {"application/json": cst.ChatMessageList}, _TEXT, _MISSING,
          (_AFTER, _limit(cst.MAX_PAGE), Query("order", "string", "By place (default asc)", ("asc", "desc")))),
    Route("post", "/v1/audio/speech", "Text to speech: audio in response_format (speech.audio.* events "
          "when stream_format=sse)", s.SpeechRequest, {**_SPEECH, SSE: s.SpeechAudioDelta | s.SpeechAudioDone},
          _AUDIO),
    Route("post", "/v1/audio/transcriptions", "Speech to text (multipart/form-data upload; "
          "transcript.text.* events when stream=true)", s.TranscriptionForm,
          {"application/json": s.Transcription | s.TranscriptionVerbose, "text/plain": None,
           "application/x-subrip": None, "text/vtt": None, SSE: s.TranscriptTextDelta | s.TranscriptTextDone},
          frozenset({"transcript"})),
    *(Route("post", path, "Audio from a text prompt (an audio-generating model)", AudioGenerationRequest,
            _binary(AUDIO_TYPES.values()), frozenset({GENERATED_AUDIO})) for path in AUDIO_GENERATION_ROUTES),
    Route("post", "/v1/responses", "Responses API (response.* events when stream=true)", rs.ResponseRequest,
          {"application/json": rs.Response, SSE: rs.StreamEvent}, _TEXT),
    Route("get", _RESPONSE_ID, "A stored response (its events with stream=true)", None,
          {"application/json": rs.Response, SSE: rs.StreamEvent}, _TEXT, _MISSING,
          (Query("stream", "boolean", "Replay the response's events"),
           Query("starting_after", "integer", "With stream: the sequence number after which events start"))),
    Route("delete", _RESPONSE_ID, "Delete a stored response", None, {"application/json": rs.ResponseDeleted},
          _TEXT, _MISSING),
    Route("post", _RESPONSE_ID + "/cancel", "Cancel a background response", None,
          {"application/json": rs.Response}, _TEXT, _BUSY),
    Route("get", _RESPONSE_ID + "/input_items", "A stored response's input items", None,
          {"application/json": rs.InputItemList}, _TEXT, _MISSING, (_AFTER, _limit(RESPONSES_PAGE), _ORDER)),
    Route("post", "/v1/conversations", "Create a conversation (its first items, metadata)", cv.ConversationCreate,
          {"application/json": cv.Conversation}, _TEXT),
    Route("get", _CONVERSATION_ID, "A conversation", None, {"application/json": cv.Conversation}, _TEXT, _MISSING),
    Route("post", _CONVERSATION_ID, "Replace a conversation's metadata", cv.ConversationUpdate,
          {"application/json": cv.Conversation}, _TEXT, _MISSING),
    Route("delete", _CONVERSATION_ID, "Delete a conversation and its items", None,
          {"application/json": cv.ConversationDeleted}, _TEXT, _MISSING),
    Route("post", _CONVERSATION_ID + "/items", "Add items to a conversation (at most 20)", cv.ItemsCreate,
          {"application/json": rs.InputItemList}, _TEXT, _MISSING, (_INCLUDE,)),
    Route("get", _CONVERSATION_ID + "/items", "A conversation's items, newest first (after, limit, order)", None,
          {"application/json": rs.InputItemList}, _TEXT, _MISSING, (_AFTER, _limit(cv.MAX_PAGE), _ORDER, _INCLUDE)),
    Route("get", _CONVERSATION_ID + "/items/{item_id}", "One item of a conversation", None,
          {"application/json": rs.InputItem}, _TEXT, _MISSING, (_INCLUDE,)),
    Route("delete", _CONVERSATION_ID + "/items/{item_id}", "Delete an item (answers the conversation)", None,
          {"application/json": cv.Conversation}, _TEXT, _MISSING),
    Route("post", CLIENT_SECRETS_ROUTE, "A realtime client secret (ek_...): opens /v1/realtime sessions preset with "
          "its session until it expires", ClientSecretRequest, {"application/json": ClientSecret}),
    Route("post", "/v1/images/generations", "Text to image", s.ImageRequest,
          {"application/json": s.ImagesResponse, SSE: s.ImageStreamEvent}, _IMAGE),
    Route("post", "/v1/images/edits", "Edit images (multipart/form-data: image or image[], mask, prompt)",
          Form(("image", "image[]", "mask"), tuple(sorted(IMAGE_EDIT_FIELDS)), ("prompt",)),
          {"application/json": s.ImagesResponse, SSE: s.ImageStreamEvent}, _IMAGE),
    Route("get", IMAGE_FILE_ROUTE, "An image answered with response_format=url (until it expires)", None,
          _binary(IMAGE_TYPES.values()), _IMAGE, _MISSING),
    Route("post", "/v1/videos", "Start a video job (multipart/form-data or JSON)", _VIDEO_FORM,
          {"application/json": Video}, _VIDEO),
    Route("post", "/v1/videos/sync", "Make a video and answer with the MP4", _VIDEO_FORM, {"video/mp4": None},
          _VIDEO),
    Route("get", "/v1/videos", "Video jobs, newest first (after, limit, order)", None,
          {"application/json": VideoList}, _VIDEO, query=(_AFTER, _limit(VIDEOS_PAGE), _ORDER)),
    Route("get", _VIDEO_ID, "One video job: status and progress", None, {"application/json": Video}, _VIDEO,
          _MISSING, (Query("wait_s", "number", f"Wait up to this many seconds (at most {MAX_WAIT_S:g}) for "
                           "the status to pass `past`"),
                     Query("past", "string", "With wait_s: the status to wait past", tuple(RANK)))),
    Route("delete", _VIDEO_ID, "Delete a video job (a running one is aborted)", None,
          {"application/json": VideoDeleted}, _VIDEO, _MISSING),
    Route("get", _VIDEO_ID + "/content", "A completed video's MP4 (variant=video), first frame (thumbnail) or "
          "a grid of up to 16 of its frames (spritesheet)",
          None, {"video/mp4": None, "image/jpeg": None}, _VIDEO, _BUSY,
          (Query("variant", "string", "Which file (default video)", tuple(VARIANTS)),)),
    Route("post", _VIDEO_ID + "/remix", "Make a completed video again with a new prompt", RemixBody,
          {"application/json": Video}, _VIDEO, _BUSY),
    Route("post", "/v1/videos/extensions", "Continue a video from its last frame: a completed job (video[id]) "
          "or an MP4 upload (video); the job's MP4 is the source and the new segment",
          Form(("video",), tuple(sorted(EXTEND_FIELDS - {"video"})), ("prompt",)), {"application/json": Video},
          _VIDEO, _BUSY),
    Route("post", "/v1/videos/edits", "Re-make a completed job (video[id]) or an MP4 upload (video) under a new "
          "prompt, keeping `1 - strength` of it (families with video_input)",
          Form(("video",), tuple(sorted(EDIT_FIELDS - {"video"})), ("prompt",)), {"application/json": Video},
          _VIDEO, _BUSY),
    Route("post", _CONSENTS, "Record a speaker's consent (multipart/form-data: recording, name, language)",
          Form(("recording",), ("language", "name"), ("recording", "name", "language")),
          {"application/json": ConsentObject}),
    Route("get", _CONSENTS, "Voice consents, a page at a time (after, limit)", None,
          {"application/json": ConsentPage}, query=(_AFTER, _limit(CONSENTS_PAGE))),
    Route("get", _CONSENTS + "/{consent_id}", "One voice consent", None, {"application/json": ConsentObject},
          extra=_MISSING),
    Route("post", _CONSENTS + "/{consent_id}", "Rename a voice consent", ConsentUpdate,
          {"application/json": ConsentObject}, extra=_MISSING),
    Route("delete", _CONSENTS + "/{consent_id}", "Delete a voice consent no voice uses", None,
          {"application/json": ConsentDeleted}, extra=_BUSY),
    Route("post", _VOICES, "Make a custom voice from a sample (multipart/form-data)",
          Form(("audio_sample",), ("consent", "name", "transcript", "type"), ("audio_sample", "consent", "name")),
          {"application/json": VoiceObject}),
    Route("get", _VOICES, "Custom voices", None, {"application/json": VoiceList}),
    Route("get", _VOICES + "/{voice_id}", "One custom voice", None, {"application/json": VoiceObject},
          extra=_MISSING),
    Route("delete", _VOICES + "/{voice_id}", "Delete a custom voice", None, {"application/json": VoiceDeleted},
          extra=_MISSING),
    Route("post", "/v1/files", "Upload a file (multipart/form-data: file, purpose, expires_after[...])",
          Form(("file",), ("expires_after[anchor]", "expires_after[seconds]", "purpose"), ("file", "purpose")),
          {"application/json": FileObject}),
    Route("get", "/v1/files", "Uploaded files, a page at a time", None, {"application/json": FilePage},
          query=(Query("purpose", "string", "Only files of this purpose"), _AFTER, _limit(FILES_PAGE), _ORDER)),
    Route("get", _FILE_ID, "One uploaded file", None, {"application/json": FileObject}, extra=_MISSING),
    Route("get", _FILE_ID + "/content", "An uploaded file's bytes", None, {"application/octet-stream": None},
          extra=_MISSING),
    Route("delete", _FILE_ID, "Delete an uploaded file", None, {"application/json": FileDeleted}, extra=_MISSING),
    Route("post", "/v1/batches", "Run a file of requests (an upload of purpose batch) in the background",
          BatchCreate, {"application/json": Batch}),
    Route("get", "/v1/batches", "Batches, newest first, a page at a time", None, {"application/json": BatchPage},
          query=(_AFTER, _limit(BATCHES_PAGE))),
    Route("get", _BATCH_ID, "One batch: its status, counts and output files", None, {"application/json": Batch},
          extra=_MISSING),
    Route("post", _BATCH_ID + "/cancel", "Cancel a batch (the answers so far are kept)", None,
          {"application/json": Batch}, extra=_BUSY),
    Route("get", "/v1/models", "Served models", None, {"application/json": s.ModelList}),
    Route("get", "/v1/models/{model}", "One served model", None, {"application/json": s.Model}, extra=_MISSING),
    Route("get", "/v1/status", "Every pipeline's stages and replicas: health, queues, steps", None,
          {"application/json": ServerStatus}),
    Route("get", "/health", "Readiness of every stage", None, {"application/json": s.Health},
          extra=(("503", "Some stage not ready", s.Health),)),
    Route("get", "/metrics", "Prometheus metrics", None, {"text/plain": None}),
    Route("get", "/openapi.json", "This document", None, {"application/json": None}),
)

UNDOCUMENTED = frozenset({
    ("get", "/v1/realtime"), ("get", "/v1/audio/speech/stream"), ("get", "/"), ("get", "/playground/{name}"),
    ("post", "/v1/audio/translations"), *(("post", path) for path in NOT_SERVED),
})
"""Routes the app registers that are not OpenAPI operations: WebSockets, the playground's page, and OpenAI's
routes this server registers only to say it does not serve them (a 404, not_served.NOT_SERVED; translations,
a 400 saying the model cannot translate)."""
