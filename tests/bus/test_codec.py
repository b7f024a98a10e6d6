"""Payload codec and shared-memory arena: inline vs shared memory, types kept, segments reused."""

from __future__ import annotations

import time
import uuid

import numpy as np
import pytest
import torch

from omni_actors.bus import messages as m
from omni_actors.bus.codec import INLINE_MAX_BYTES, PayloadCodec, leases_of
from omni_actors.bus.shm import Arena, SegmentCache, unlink_prefix
from tests.conftest import shm_files


@pytest.fixture
def pair():
    prefix = f"omni-test-{uuid.uuid4().hex[:8]}"
    arena = Arena(prefix)
    producer = PayloadCodec("p", arena, SegmentCache())
    consumer = PayloadCodec("c", None, SegmentCache())
    yield prefix, arena, producer, consumer
    consumer.segments.close()
    producer.segments.close()
    arena.close()
    assert shm_files(prefix) == []
    unlink_prefix(prefix)


def roundtrip(producer: PayloadCodec, consumer: PayloadCodec, values: dict) -> tuple[m.Payload, dict]:
    payload = producer.encode(values)
    wire = m.decode(m.encode(m.Feed("r", 0, payload)))
    assert isinstance(wire, m.Feed)
    return wire.payload, consumer.decode(wire.payload)


def test_small_arrays_inline_large_in_shared_memory(pair) -> None:
    prefix, _arena, producer, consumer = pair
    small = np.arange(10, dtype=np.float32)
    big = np.arange(INLINE_MAX_BYTES, dtype=np.int16).reshape(2, -1)
    payload, out = roundtrip(producer, consumer, {"small": small, "big": big, "text": "hi", "n": np.int64(3)})
    assert payload.arrays["small"].inline is not None
    assert payload.arrays["big"].inline is None and payload.arrays["big"].segment.startswith(prefix)
    np.testing.assert_array_equal(out["small"], small)
    np.testing.assert_array_equal(out["big"], big)
    assert out["big"].flags.writeable is False  # a view of shared memory
    assert out["text"] == "hi" and out["n"] == 3
    assert [r.lease for r in leases_of(payload)] == [payload.arrays["big"].lease]


def test_torch_tensors_keep_type_and_bfloat16(pair) -> None:
    _, _, producer, consumer = pair
    bf = torch.randn(300, 300).to(torch.bfloat16)
    f32 = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    _, out = roundtrip(producer, consumer, {"bf": bf, "f": f32})
    assert isinstance(out["bf"], torch.Tensor) and out["bf"].dtype == torch.bfloat16
    assert torch.equal(out["bf"], bf)
    assert torch.equal(out["f"], f32)


def test_segments_are_reused_after_release(pair) -> None:
    _, arena, producer, _ = pair
    big = np.ones(1 << 20, dtype=np.uint8)
    first = producer.encode({"x": big})
    producer.encode({"x": big})
    assert arena.segments == 2 and arena.leased == 2
    arena.free([r.lease for r in leases_of(first)])
    producer.encode({"x": big})
    assert arena.segments == 2, "a freed segment of the same size class must be reused"
    assert arena.leased == 2


def test_past_its_budget_an_arena_drops_free_segments_and_never_reuses_a_name() -> None:
    prefix = f"omni-test-{uuid.uuid4().hex[:8]}"
    arena = Arena(prefix, budget_bytes=3 << 20, idle_s=60.0)
    cache = SegmentCache(idle_s=60.0)
    producer = PayloadCodec("p", arena, cache)
    try:
        small = producer.encode({"x": np.ones(1 << 19, dtype=np.uint8)})  # a 512 KiB segment
        big = producer.encode({"x": np.ones(1 << 21, dtype=np.uint8)})  # a 2 MiB segment: at 2.5 MiB
        assert not arena.over_budget
        arena.free([r.lease for r in leases_of(small)])
        names = {small.arrays["x"].segment, big.arrays["x"].segment}
        other = producer.encode({"x": np.ones(1 << 20, dtype=np.uint8)})  # 1 MiB more: the free 512 KiB goes
        assert other.arrays["x"].segment not in names and arena.segments == 2
        assert shm_files(small.arrays["x"].segment) == [] and arena.bytes == 3 << 20
        assert arena.over_budget  # 3 MiB leased: its owner stops producing
        t0 = time.monotonic()
        arena.free([r.lease for p in (big, other) for r in leases_of(p)])
        assert arena.trim(t0 + 30.0) == 0 and arena.segments == 2  # free, but not idle long enough
        assert 0 < arena.next_trim_s() <= 60.0
        assert arena.trim(t0 + 61.0) == 2 and arena.segments == 0 and arena.bytes == 0
        assert arena.next_trim_s() is None and shm_files(prefix) == []
    finally:
        cache.close()
        arena.close()


def test_a_consumer_closes_mappings_it_has_not_used_for_its_idle_time(pair) -> None:
    _, _, producer, consumer = pair
    payload = producer.encode({"x": np.ones(1 << 20, dtype=np.uint8)})
    consumer.decode(payload, copy=True)
    t0 = time.monotonic()
    assert len(consumer.segments) == 1 and consumer.segments.trim(t0) == 0
    assert consumer.segments.trim(t0 + consumer.segments.idle_s + 1) == 1 and len(consumer.segments) == 0
    assert consumer.decode(payload, copy=True)["x"].sum() == 1 << 20  # mapped again on demand


def test_unsupported_value_is_rejected_by_the_encoder(pair) -> None:
    _, _, producer, _ = pair
    with pytest.raises(TypeError):
        m.encode(m.Feed("r", 0, producer.encode({"obj": object()})))


def test_batch_roundtrip() -> None:
    msgs = [m.Abort(["a"]), m.Heartbeat(busy=2), m.FreeLeases([1, 2])]
    assert m.unbatch(m.decode(m.encode_many(msgs))) == msgs
    assert m.decode(m.encode_many(msgs[:1])) == msgs[0]


def test_arrays_nested_in_lists_and_dicts_round_trip(pair) -> None:
    _, _, producer, consumer = pair
    audio = np.linspace(-1, 1, 100_000, dtype=np.float32)  # big enough for shared memory
    msgs = [{"role": "user", "content": [{"type": "input_audio", "audio": audio, "sample_rate": 16000},
                                         {"type": "text", "text": "hi", "n": np.int32(2)}]}]
    payload, out = roundtrip(producer, consumer, {"messages": msgs, "top": np.zeros(3)})
    assert "/messages/0/content/0/audio" in payload.arrays
    part = out["messages"][0]["content"][0]
    np.testing.assert_array_equal(part["audio"], audio)
    assert part["sample_rate"] == 16000 and out["messages"][0]["content"][1] == {"type": "text", "text": "hi", "n": 2}
    assert len(leases_of(payload)) == 1


def test_unlink_prefix_spares_a_later_generation_whose_name_extends_it() -> None:
    run = f"omni-test-{uuid.uuid4().hex[:8]}"
    g1, g10 = Arena(f"{run}-s1r0g1"), Arena(f"{run}-s1r0g10")
    try:
        g1.put(np.zeros(4, np.float32))
        g10.put(np.zeros(4, np.float32))
        assert unlink_prefix(f"{run}-s1r0g1") == 1
        assert shm_files(f"{run}-s1r0g10") != [] and shm_files(f"{run}-s1r0g1-") == []
    finally:
        g1.close()
        g10.close()
