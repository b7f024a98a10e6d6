"""The exception tree of omni-actors, in one place.

    OmniError
    ├── ConfigError              deploy file / CLI validation failed (exit code 2)
    ├── AdmissionError           a stage queue is full (HTTP 429)
    ├── StageUnavailable         no ready replica for a stage (HTTP 503)
    ├── StartupError             a worker could not start (omni-run exits non-zero)
    └── RequestError             a request ended abnormally; carried on its stream
        ├── RequestAborted       aborted by the caller (disconnect, cancel)
        ├── RequestTimeout       the request deadline passed (HTTP 504)
        ├── WorkerDied           a worker serving it died (HTTP 503)
        └── StageFailed          a stage engine raised for this request (HTTP 500)
            └── RequestRejected  a stage refused the request's inputs or parameters (HTTP 400)
"""

from __future__ import annotations


class OmniError(Exception):
    """Base of every error this package raises on purpose."""


class ConfigError(OmniError):
    """Configuration is invalid. `str(err)` is one readable message naming file and field."""


class AdmissionError(OmniError):
    """A stage's queue is full; the caller should retry later."""

    def __init__(self, stage_id: int, limit: int) -> None:
        super().__init__(f"stage {stage_id} queue is full ({limit} requests)")
        self.stage_id = stage_id
        self.limit = limit


class StageUnavailable(OmniError):
    """A stage has no ready replica (starting, dead or restarting)."""

    def __init__(self, stage_id: int) -> None:
        super().__init__(f"stage {stage_id} has no ready worker")
        self.stage_id = stage_id


class RequestError(OmniError):
    """A request ended abnormally. Raised from the request's output stream, once."""


class RequestAborted(RequestError):
    """The request was aborted by its caller."""


class RequestTimeout(RequestError):
    """The request did not finish before its deadline."""


class WorkerDied(RequestError):
    """A worker process serving the request died."""

    def __init__(self, stage_id: int, replica: int, detail: str = "") -> None:
        msg = f"worker for stage {stage_id} replica {replica} died"
        super().__init__(f"{msg}: {detail}" if detail else msg)
        self.stage_id = stage_id
        self.replica = replica


class StageFailed(RequestError):
    """A stage engine failed while serving this request (the worker lives on)."""

    def __init__(self, stage_id: int, detail: str) -> None:
        super().__init__(f"stage {stage_id} failed: {detail}")
        self.stage_id = stage_id
        self.detail = detail


class RequestRejected(StageFailed):
    """A stage refused this request's inputs or parameters: the caller's to fix, not the engine's.
    `code` says which refusal it is where the stage typed it (REJECT_CODES), else None."""

    def __init__(self, stage_id: int, detail: str, code: str | None = None) -> None:
        super().__init__(stage_id, detail)
        self.code = code


CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""A stage's refusal of a prompt longer than its context (OpenAI's code for it)."""
REJECT_CODES = frozenset({CONTEXT_LENGTH_EXCEEDED})
"""The refusals a stage types (StageOutput.code); any other code from a worker is dropped."""


class StartupError(OmniError):
    """A stage's worker could not start (engine failed to load, or it timed out)."""

    CONFIG_CAUSES = ("ConfigError: ", "FileNotFoundError: ")
    """What a worker's start failure begins with when the model folder or the deploy is at fault (a
    checkpoint file missing, an engine option refused): `config` then, and omni-run exits 2."""

    def __init__(self, stage_id: int, detail: str) -> None:
        super().__init__(f"stage {stage_id} did not start: {detail}")
        self.stage_id = stage_id
        self.detail = detail
        self.config = detail.startswith(self.CONFIG_CAUSES)
