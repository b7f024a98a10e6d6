"""Every message that crosses the orchestrator <-> worker bus, and its codec.

Frames on the wire: ROUTER side `[identity, body]`, DEALER side `[body]`,
where `body` is one msgpack-encoded `Message` (a tagged union, decoded by one
typed decoder and dispatched with `match`). Several messages may travel in one
`Batch` to amortise per-frame costs. No pickle, ever.
"""

from __future__ import annotations

from typing import Any

import msgspec


class CudaIpcRef(msgspec.Struct, array_like=True, gc=False):
    """A CUDA tensor in another process's allocation: torch's IPC reduction fields (bus.cuda_ipc)."""

    device: int
    handle: bytes
    storage_size: int
    storage_offset: int
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes | None
    event_sync: bool
    tensor_offset: int
    """In elements of the tensor's dtype, within the storage."""
    stride: tuple[int, ...]
    dtype: str
    """torch dtype name, e.g. "bfloat16"."""


class CudaSegmentRef(msgspec.Struct, array_like=True, gc=False):
    """A CUDA tensor by the IPC handle of the allocation that holds it (bus.cuda_ipc, the fast path).

    The handle is the same for every tensor in one allocation (a caching-allocator segment), so
    a consumer maps each allocation once and keeps it mapped.
    """

    device: int
    handle: bytes
    """The allocation's cudaIpcMemHandle."""
    buffer: int
    """The allocation's id in the producer (CU_POINTER_ATTRIBUTE_BUFFER_ID: never reused), so a
    consumer never takes a mapping it keeps for a later allocation."""
    offset: int
    """Bytes from the allocation's base to the tensor's first element."""
    stride: tuple[int, ...]
    """In elements."""
    dtype: str
    """torch dtype name, e.g. "bfloat16"."""
    event: bytes
    """A cudaIpcEventHandle recorded on the producer's stream after it wrote the tensor."""


class ArrayRef(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """An array that crossed a process boundary.

    Small arrays travel `inline`; larger ones live in the producer's
    shared-memory arena at (`segment`, `offset`) under `lease`, owned by
    `producer` until released. To and from a worker that does not share the
    orchestrator's memory (another node), a large array travels as message
    frame number `frame` (1-based, after the body; bus.codec.to_wire / attach_frames), or as
    `frames` consecutive frames from there when it is larger than one frame (codec.FRAME_CHUNK_BYTES).
    Between stages on one GPU a CUDA tensor travels as `cuda_segment` (its allocation's IPC
    handle) or `cuda` (torch's per-storage IPC reduction), leased either way.
    """

    dtype: str
    shape: tuple[int, ...]
    inline: bytes | None = None
    segment: str = ""
    offset: int = 0
    nbytes: int = 0
    lease: int = 0
    producer: str = ""
    frame: int = 0
    cuda: CudaIpcRef | None = None
    frames: int = 0
    """How many frames the array spans from `frame` (0: one)."""
    cuda_segment: CudaSegmentRef | None = None


class Payload(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A flat dict split into plain values and arrays."""

    data: dict[str, Any] = {}
    arrays: dict[str, ArrayRef] = {}


class LeaseId(msgspec.Struct, array_like=True, gc=False):
    producer: str
    lease: int


# ---- worker -> orchestrator -------------------------------------------------


class StartupPhases(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """Where a worker's start-up went, in seconds (measured by the worker; workers/main.py).

    `boot_s + imports_s + engine_s <= total_s`, and the `engine` phases (disjoint, each timed by
    engine or model code with `workers.engine.timed`) add up to at most `engine_s`.
    """

    boot_s: float = 0.0
    """Process start (fork) -> the worker's main() runs: interpreter start and the bus modules."""
    imports_s: float = 0.0
    """-> the stage's engine class imported (torch, transformers, the model's code), bus set up."""
    engine_s: float = 0.0
    """The engine's construction: config, weights, tokenizers, KV buffers, any warm-up at start."""
    total_s: float = 0.0
    """Process start -> Ready sent."""
    engine: dict[str, float] = {}
    """Phases inside `engine_s` the engine timed itself: "weights" (disk -> device), "config",
    "processors" (tokenizers, feature extractors), "warmup" (warm-up, graph capture or compile
    at start), ..."""


class Ready(msgspec.Struct, tag=1, array_like=True, gc=False):
    """First message of a worker: its engine is loaded.

    `info["arrays"] == "frames"`: the worker does not map the orchestrator's shared memory
    (it runs on another node); arrays for it travel as message frames.
    """

    stage_id: int
    replica: int
    pid: int
    info: dict[str, Any] = {}
    startup: StartupPhases | None = None
    """How long the worker took to get here, phase by phase (None: a worker that did not say)."""


class StartFailed(msgspec.Struct, tag=2, array_like=True, gc=False):
    """The engine could not start; the worker exits after sending this."""

    stage_id: int
    replica: int
    error: str


class Heartbeat(msgspec.Struct, tag=3, array_like=True, gc=False):
    busy: int
    """Requests the engine holds."""
    leased: int = 0
    """Leases of this worker's arena not yet given back."""
    steps: int = 0
    """Engine steps the worker has completed."""
    step_s: float = 0.0
    """How long the step now running has run (0: none is running). Heartbeats leave from the
    worker's heartbeat thread during a step, so the supervisor can tell a long step from a stuck one."""
    busy_s: float = 0.0
    """Seconds the worker has spent in completed engine steps (with `steps`: the mean step time)."""
    step_counts: list[int] = []
    """Completed steps per duration bucket (STEP_BUCKETS_S, then one past the last), since start."""


STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds of the engine step-duration buckets a heartbeat counts (Heartbeat.step_counts)."""


class StageOutput(msgspec.Struct, tag=4, array_like=True, omit_defaults=True, gc=False):
    """A delta of one request's output at one stage."""

    request_id: str
    stage_id: int
    payload: Payload
    finished: bool = False
    error: str | None = None
    rejected: bool = False
    """With `error`: the stage refused the request's inputs or parameters (the caller's fault)."""
    code: str | None = None
    """With `rejected`: which refusal, where the stage typed it (errors.REJECT_CODES)."""


class Release(msgspec.Struct, tag=5, array_like=True, gc=False):
    """A consumer is done with these leases (the orchestrator forwards to producers)."""

    leases: list[LeaseId]


class FirstOutput(msgspec.Struct, tag=6, array_like=True, gc=False):
    """The worker is about to step for some request's first output (True), or that step is done
    (False). With deploy `first_output_priority`, the stages sharing its device hold meanwhile."""

    active: bool


class Aborted(msgspec.Struct, tag=7, array_like=True, gc=False):
    """The answer to an Abort: every message sent before it for these requests has been handled
    (read or dropped), so the shared memory their inputs came in may be reused or unlinked."""

    request_ids: list[str]


# ---- orchestrator -> worker -------------------------------------------------


class AddRequest(msgspec.Struct, tag=10, array_like=True, omit_defaults=True, gc=False):
    """Start a request at a stage.

    Entry stages get the request `inputs`. A downstream stage gets either all
    upstream chunks at once in `upstream` (full-payload mode), or `streaming`
    set and its input later through `Feed` messages (async chunk).
    """

    request_id: str
    stage_id: int
    inputs: Payload
    params: dict[str, Any] = {}
    upstream: dict[int, list[Payload]] = {}
    streaming: bool = False
    sources: tuple[int, ...] = ()


CLIENT_SOURCE = -1
"""The `source` of input fed by the client (Orchestrator.feed) rather than by an upstream stage."""


class Feed(msgspec.Struct, tag=11, array_like=True, omit_defaults=True, gc=False):
    """One upstream chunk for a streaming request (source CLIENT_SOURCE: more client input)."""

    request_id: str
    source: int
    payload: Payload
    last: bool = False


class Abort(msgspec.Struct, tag=12, array_like=True, gc=False):
    request_ids: list[str]


class FreeLeases(msgspec.Struct, tag=13, array_like=True, gc=False):
    """Producer: these leases of yours may be reused."""

    leases: list[int]


class Shutdown(msgspec.Struct, tag=14, array_like=True, gc=False):
    """Finish nothing more; exit now."""


class Hold(msgspec.Struct, tag=15, array_like=True, gc=False):
    """Take no engine step for up to `s` seconds (0: step again now): a stage sharing this worker's
    device is computing a request's first output."""

    s: float


class Batch(msgspec.Struct, tag=20, array_like=True, gc=False):
    items: list[Message]


Message = (
    Ready | StartFailed | Heartbeat | StageOutput | Release | FirstOutput | Aborted
    | AddRequest | Feed | Abort | FreeLeases | Shutdown | Hold | Batch
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)


def encode(msg: Message) -> bytes:
    return _encoder.encode(msg)


def decode(body: bytes | memoryview) -> Message:
    return _decoder.decode(body)


def encode_many(msgs: list[Message]) -> bytes:
    """One frame for a list of messages (a lone message is sent bare)."""
    return _encoder.encode(msgs[0] if len(msgs) == 1 else Batch(items=msgs))


def unbatch(msg: Message) -> list[Message]:
    return msg.items if isinstance(msg, Batch) else [msg]


_REQUEST_TAGS = frozenset(t.__struct_config__.tag for t in (StageOutput, AddRequest, Feed))
"""Messages whose second field is a request id."""


def salvage(body: bytes | memoryview) -> tuple[list[Message], list[str]]:
    """What can be read of a frame `decode` refused: its messages that are valid, and the request
    ids of those that are not (where an id can be read). A frame that is not msgpack gives neither.
    Only plain msgpack is read here, never pickle, whatever the frame holds."""
    try:
        raw = msgspec.msgpack.decode(body)
    except msgspec.DecodeError:
        return [], []
    batch_tag = Batch.__struct_config__.tag
    items = raw[1] if _is_list(raw) and raw[0] == batch_tag and _is_list(raw[1]) else [raw]
    good: list[Message] = []
    bad: list[str] = []
    for item in items:
        try:
            msg = msgspec.convert(item, Message)
        except (msgspec.ValidationError, TypeError):
            if _is_list(item) and item[0] in _REQUEST_TAGS and isinstance(item[1], str):
                bad.append(item[1])
            continue
        if not isinstance(msg, Batch):  # (a batch is never nested)
            good.append(msg)
    return good, bad


def _is_list(value: Any) -> bool:
    return isinstance(value, list) and len(value) >= 2
