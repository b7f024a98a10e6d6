"""A realtime session's config changes: session.update and transcription_session.update checked and taken.

Every field a client sets is checked as the REST routes check it (tools as
tools.check_tools does, a voice as POST /v1/audio/speech, transcription options
as /v1/audio/transcriptions) before the session takes any of it: a bad update is
one `error` event naming the field, and the session is left as it was. The
voice and tool checks are response.create's too. `SessionUpdates` is mixed into
the session class (handler.py), whose state it reads and writes; a duplex
session adds its own checks (duplex.py).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web
from msgspec import UNSET

from omni_actors.api.errors import ApiError
from omni_actors.api.realtime import client_events as ce
from omni_actors.api.realtime import events as ev
from omni_actors.api.realtime.audio import Resampler, WireStream, wire_rate
from omni_actors.api.realtime.function_calls import forced_call
from omni_actors.api.realtime.session import (
    SessionConfig,
    apply_update,
    render_session,
    render_transcription_session,
)
from omni_actors.api.realtime.transcription import (
    beta_update,
    check_options,
    conversation_refusal,
    no_transcripts,
    only_transcribes,
    transcribes_only,
    transcription_params,
)
from omni_actors.api.realtime.vad import VAD_RATE
from omni_actors.api.speech_inputs import speech_call
from omni_actors.api.tools import chat_shaped, chat_shaped_choice, check_tools, tools_refusal


class SessionUpdates:
    """The config changes of one session (mixed into RealtimeSession; see the module docstring)."""

    id: str
    request: web.Request
    orch: Any
    cfg: SessionConfig
    dialect: ev.Dialect
    beta_transcription: bool
    _in: Resampler
    _wire: WireStream

    def _session_event(self, updated: bool) -> ev.ServerEvent:
        """session.created/.updated, or transcription_session.* for a beta transcription session."""
        if self.beta_transcription:
            session = render_transcription_session(self.cfg, self.id)
            return ev.TranscriptionSessionUpdated(session=session) if updated else \
                ev.TranscriptionSessionCreated(session=session)
        session = render_session(self.cfg, self.id, self.dialect)
        return ev.SessionUpdated(session=session) if updated else ev.SessionCreated(session=session)

    def _refuse_tools(self, tools: Any, tool_choice: Any, prefix: str) -> None:
        """An `error` for tools this pipeline cannot call, or a call it cannot force (the client's
        values; a forced choice is then checked against the tools it would use: session.update
        here, response.create in Options.build)."""
        if (refusal := tools_refusal(self.orch.pipeline, tools, tool_choice, prefix, can_force=True)) is not None:
            raise ce.BadEvent(refusal[0], code="unsupported_parameter", param=refusal[1])

    async def _check_tool_schemas(self, tools: Any, tool_choice: Any, where: str) -> None:
        """OpenAI's refusals of the tools themselves (tools.check_tools: a name twice, parameters that are no
        object's schema, strict-mode refusals, a forced schema the decoder cannot follow) as an `error`."""
        if not tools:
            return
        try:
            await check_tools(chat_shaped(tools), chat_shaped_choice(tool_choice), lambda i: f"{where}[{i}]")
        except ApiError as err:
            raise ce.BadEvent(err.message, code=err.code, param=err.param) from None

    async def _session_update(self, s: ce.SessionIn, eid: str | None) -> None:
        cfg, dialect = await self._checked_update(s, eid)
        await self._take_update(cfg, dialect)

    async def _transcription_session_update(self, s: ce.TranscriptionSessionIn, eid: str | None) -> None:
        """Beta `transcription_session.update`: the GA transcription session's update (the same checks and
        engine path, transcription.py `beta_update`). The session is a beta transcription one after it."""
        try:
            update = beta_update(s, self.orch.pipeline)
        except ce.BadEvent as err:
            err.event_id = eid
            raise
        cfg, _ = await self._checked_update(update, eid)
        self.beta_transcription = True
        await self._take_update(cfg, None)

    async def _take_update(self, cfg: SessionConfig, dialect: ev.Dialect | None) -> None:
        """The checked `cfg` becomes the session's, announced with session.updated (or its beta
        transcription name)."""
        old, self.cfg = self.cfg, cfg
        if dialect is not None:
            self.dialect = dialect
        if cfg.input_audio_format != old.input_audio_format:
            self._in = Resampler(wire_rate(cfg.input_audio_format), VAD_RATE)
            self._wire = WireStream(cfg.input_audio_format)
        if cfg.turn_detection != old.turn_detection:
            self._reset_vad()
        await self.send(self._session_event(updated=True))

    async def _checked_update(self, s: ce.SessionIn, eid: str | None) -> tuple[SessionConfig, ev.Dialect | None]:
        """The config and dialect `s` asks for, checked as every session checks them (a duplex one adds its
        own checks): a BadEvent naming `eid`, and nothing changed, for anything this pipeline cannot do."""
        try:
            self._refuse_tools(s.tools, s.tool_choice, "session.")
            cfg, dialect = apply_update(self.cfg, s)
            await self._check_tool_schemas(cfg.tools, cfg.tool_choice, "session.tools")
            forced_call(cfg.tools, cfg.tool_choice, "session.")  # a choice the session's tools cannot meet
            # A model that only transcribes is told at once to open the session type it serves; one with
            # none to offer (text to speech) keeps its session, and each response.create says why not.
            if s.type == "realtime" and transcribes_only(self.orch.pipeline):
                raise ce.BadEvent(only_transcribes(self.cfg.model), code="unsupported_session_type",
                                  param="session.type")
            if cfg.type == "transcription" and (refusal := no_transcripts(self.orch.pipeline)) is not None:
                raise ce.BadEvent(refusal, code="unsupported_session_type", param="session.type")
            if s.voice is not UNSET:
                await self._check_voice(cfg.voice, "session.voice")
            elif s.audio is not UNSET and s.audio.output is not UNSET and s.audio.output.voice is not UNSET:
                await self._check_voice(cfg.voice, "session.audio.output.voice")
            if transcription_params(cfg) != transcription_params(self.cfg):  # (the last: it asks the pipeline)
                await self._check_transcription(s, cfg)
        except ce.BadEvent as err:
            err.event_id = eid
            raise
        return cfg, dialect

    async def _check_transcription(self, s: ce.SessionIn, cfg: SessionConfig) -> None:
        """New transcription options the pipeline's recognizer refuses are an `error` naming the option,
        as /v1/audio/transcriptions answers the same fields with a 400 (transcription.py `check_options`)."""
        refused = await check_options(self, cfg)
        if refused is None:
            return
        ga = s.audio is not UNSET and s.audio.input is not UNSET and s.audio.input.transcription is not UNSET
        param = "session.audio.input.transcription" if ga else "session.input_audio_transcription"
        if refused.option is not None:
            param = f"{param}.{refused.option}"
        raise ce.BadEvent(f"{refused.message} (field `{param}`)", code=refused.code, param=param)

    async def _check_voice(self, voice: str, param: str) -> None:
        """A voice a client sets (session.update, response.create) is checked as POST /v1/audio/speech
        checks it (the same codes)."""
        try:
            await speech_call(self.request, self.orch.pipeline, "-", voice, None, 1.0, None)
        except ApiError as err:
            raise ce.BadEvent(err.message.replace("`voice`", f"`{param}`"), code=err.code or "invalid_value",
                              param=param) from None

    def _conversation_refusal(self) -> str | None:
        """Why this session's pipeline cannot answer a conversation (transcription.py), else None."""
        return conversation_refusal(self.orch.pipeline, self.cfg.model)
