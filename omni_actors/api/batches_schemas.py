"""The Batch API's wire types: the create request, the Batch object, its errors, counts, usage and pages."""

from __future__ import annotations

from typing import Literal

from msgspec import Struct, field

from omni_actors.api.schemas import Metadata, RequestStruct

BatchStatus = Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling",
                      "cancelled"]


class ExpiresAfter(RequestStruct):
    anchor: Literal["created_at"]
    seconds: int


class BatchCreate(RequestStruct):
    input_file_id: str
    endpoint: str
    completion_window: Literal["24h"]
    metadata: Metadata | None = None
    output_expires_after: ExpiresAfter | None = None


class BatchError(Struct):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(Struct):
    data: list[BatchError]
    object: Literal["list"] = "list"


class RequestCounts(Struct):
    total: int
    completed: int = 0
    failed: int = 0


class InputTokensDetails(Struct):
    cached_tokens: int = 0


class OutputTokensDetails(Struct):
    reasoning_tokens: int = 0


class BatchUsage(Struct):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0
    input_tokens_details: InputTokensDetails = field(default_factory=InputTokensDetails)
    output_tokens_details: OutputTokensDetails = field(default_factory=OutputTokensDetails)


class Batch(Struct):
    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    request_counts: RequestCounts | None = None
    model: str | None = None
    metadata: dict[str, str] | None = None
    errors: BatchErrors | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    usage: BatchUsage | None = None
    object: Literal["batch"] = "batch"


class BatchPage(Struct):
    data: list[Batch]
    has_more: bool
    first_id: str | None
    last_id: str | None
    object: Literal["list"] = "list"
