"""Pipeline topology: frozen stage specs and the registry of named pipelines.

A pipeline is defined in code (never in a deploy file). Each stage names the
engine that runs it and the processors that turn upstream output into its
input; processors are "module:function" strings resolved in the consuming
worker, so nothing model-specific lives in shared code.
"""

from __future__ import annotations

import enum
import importlib
from collections.abc import Callable
from typing import Any

import msgspec

from omni_actors.config.speech import SpeechSpec


class ExecutionType(enum.StrEnum):
    LLM_AR = "LLM_AR"
    LLM_GENERATION = "LLM_GENERATION"
    DIFFUSION = "DIFFUSION"


class StageSpec(msgspec.Struct, frozen=True, kw_only=True):
    """One stage of a pipeline graph."""

    stage_id: int
    model_stage: str
    execution_type: ExecutionType
    engine: str
    """"module:Class" of the StageEngine that runs this stage."""
    input_sources: tuple[int, ...] = ()
    """Upstream stage ids; empty means the stage receives the request input."""
    processor: str | None = None
    """"module:function" for full-payload handoff: (upstream, request) -> inputs."""
    chunk_processor: str | None = None
    """"module:function" for async-chunk handoff: (source, payload, request, state) -> inputs|None."""
    final_output: bool = False
    final_output_type: str | None = None
    """What this stage's final output is: "text", "audio", "image", ..."""
    sampling_constraints: dict[str, Any] = {}
    """Sampling fields forced for this stage; they win over request and deploy values."""
    engine_defaults: dict[str, Any] = {}
    """Engine settings of this stage; the deploy's `engine_extras` override them."""
    subdir: str | None = None
    """Sub-folder of the deploy `model` path holding this stage's weights, if any."""
    tool_parser: str | None = None
    """For a stage writing a text answer: the tool parser (a vLLM tool-parser name, e.g. "hermes") that reads
    function calls out of its text. None: this stage cannot call tools, and chat `tools` are refused (api/tools.py)."""

    guided: bool = False
    """A transformers-engine stage whose adapter guides its text by a JSON schema (llguidance,
    workers/engines/hf_ar_grammar.py). vLLM stages always do."""

    @property
    def guided_decoding(self) -> bool:
        """Its engine constrains decoding to a JSON schema (chat `response_format` json_object / json_schema,
        forced tool calls: api/structured.py): vLLM's structured outputs, or `guided`."""
        return self.guided or self.engine.partition(":")[0].endswith(".vllm_ar")


class PipelineConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A named, frozen pipeline topology."""

    name: str
    stages: tuple[StageSpec, ...]
    requires_model: bool = True
    """False for pipelines that need no weights (the synthetic family)."""
    preparer: str | None = None
    """"module:function" () -> Path that prepares (idempotently) and returns the default model folder."""
    planner: str | None = None
    """"module:function" choosing the stage subset for a request: (pipeline, request) -> ids."""
    description: str = ""
    detect: tuple[str, ...] = ()
    """Folders this pipeline serves without a deploy file (`omni-run --model DIR`): entries
    "diffusers:<model_index.json _class_name>" or "transformers:<config.json model_type>";
    "diffusers:*" serves any diffusers folder no other pipeline claims. See models/detect.py."""
    duplex: bool = False
    """A full-duplex speech model: a realtime session is one long streaming request that is fed the
    user's audio frame by frame while it speaks (api/realtime/duplex.py, workers/engines/duplex.py)."""
    speech: SpeechSpec | None = None
    """Voices and speech options, for pipelines that make speech (config/speech.py)."""
    speech_of: str | None = None
    """"module:function" (model folder: Path) -> SpeechSpec, for a pipeline whose checkpoints differ in
    what they offer the speech API (voices, cloning); it replaces `speech` once the deploy's model folder
    is known (config/deploy_checks.py). Reads files only, without torch."""
    transcript_words: bool = False
    """The recognizer times each word when params["timestamps"] is "word" (a transcript payload's
    "words"); /v1/audio/transcriptions refuses word timestamps for other pipelines. Segment timing
    needs no flag: a stage that does not send "segments" is one segment over the audio."""
    live_transcription: bool = False
    """A streaming recognizer: a realtime transcription session feeds each turn's audio to one streaming
    request as it arrives, and its transcript deltas go out before the turn is committed
    (api/realtime/live_transcription.py); otherwise a turn is transcribed once committed."""

    def stage(self, stage_id: int) -> StageSpec:
        for spec in self.stages:
            if spec.stage_id == stage_id:
                return spec
        raise KeyError(stage_id)

    @property
    def stage_ids(self) -> tuple[int, ...]:
        return tuple(s.stage_id for s in self.stages)

    def downstream(self, stage_id: int) -> tuple[int, ...]:
        return tuple(s.stage_id for s in self.stages if stage_id in s.input_sources)

    def output_types(self) -> frozenset[str]:
        return frozenset(
            s.final_output_type for s in self.stages if s.final_output and s.final_output_type
        )

    def stages_for_outputs(self, wanted: frozenset[str] | set[str]) -> tuple[int, ...]:
        """Stages producing any `wanted` output type, plus every stage they depend on."""
        keep: set[int] = set()
        todo = [
            s.stage_id for s in self.stages if s.final_output and s.final_output_type in wanted
        ]
        while todo:
            sid = todo.pop()
            if sid not in keep:
                keep.add(sid)
                todo.extend(self.stage(sid).input_sources)
        return tuple(sid for sid in self.stage_ids if sid in keep)

    def validate(self) -> None:
        ids = self.stage_ids
        if len(set(ids)) != len(ids):
            raise ValueError(f"pipeline {self.name}: duplicate stage ids {ids}")
        for spec in self.stages:
            for src in spec.input_sources:
                if src not in ids:
                    raise ValueError(f"pipeline {self.name}: stage {spec.stage_id} source {src}")
                if src >= spec.stage_id:
                    raise ValueError(f"pipeline {self.name}: sources must precede stage ids")


_REGISTRY: dict[str, Callable[[], PipelineConfig]] = {}
_BUILTIN_MODULES = (
    "omni_actors.models.synthetic",
    "omni_actors.models.assistant",
    "omni_actors.models.qwen2_5_omni",
    "omni_actors.models.qwen3_omni_moe",
    "omni_actors.models.diffusion",
    "omni_actors.models.video",
    "omni_actors.models.llm",
    "omni_actors.models.moshi",
    "omni_actors.models.csm",
    "omni_actors.models.qwen3_tts",
    "omni_actors.models.dia",
    "omni_actors.models.higgs_audio_v2",
    "omni_actors.models.vibevoice",
    "omni_actors.models.qwen3_asr",
    "omni_actors.models.voxtral_realtime",
)


def register_pipeline(name: str) -> Callable[[Callable[[], PipelineConfig]], Callable[[], PipelineConfig]]:
    """Decorator: register a function returning a PipelineConfig under `name`."""

    def wrap(fn: Callable[[], PipelineConfig]) -> Callable[[], PipelineConfig]:
        _REGISTRY[name] = fn
        return fn

    return wrap


def _load_builtins() -> None:
    # Pipeline modules only define topology: they must import without torch.
    for mod in _BUILTIN_MODULES:
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as err:
            if err.name != mod:  # a missing dependency inside it is a real error
                raise


def pipeline_names() -> list[str]:
    _load_builtins()
    return sorted(_REGISTRY)


def get_pipeline(name: str) -> PipelineConfig:
    _load_builtins()
    try:
        cfg = _REGISTRY[name]()
    except KeyError:
        raise KeyError(name) from None
    cfg.validate()
    return cfg


def resolve(ref: str) -> Any:
    """Import "module:attr" and return the attribute."""
    module, _, attr = ref.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
