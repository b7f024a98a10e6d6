"""CUDA IPC handoff: the descriptors on the wire, their leases, and when the launcher allows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from omni_actors.bus import messages as m
from omni_actors.bus.codec import (
    INLINE_MAX_BYTES,
    PayloadCodec,
    leases_of,
    leases_released_on_receipt,
)
from omni_actors.bus.cuda_driver import CudaDriverError, Driver
from omni_actors.bus.cuda_ipc import CudaImporter, _Mapping, _View
from omni_actors.bus.shm import Arena, SegmentCache
from omni_actors.config.pipeline import get_pipeline
from omni_actors.orchestrator.launcher import Launcher
from tests.conftest import make_deploy

REF = m.CudaIpcRef(
    device=0, handle=b"\x01" * 64, storage_size=1 << 26, storage_offset=512, ref_counter_handle=b"/torch_1_2",
    ref_counter_offset=3, event_handle=b"\x02" * 64, event_sync=True, tensor_offset=8, stride=(4096, 1),
    dtype="bfloat16",
)


def test_the_descriptor_crosses_the_bus_as_msgpack_and_carries_a_lease() -> None:
    ref = m.ArrayRef(dtype="torch:cuda", shape=(8192, 4096), cuda=REF, lease=-1, producer="s0r0g0")
    feed = m.decode(m.encode(m.Feed("r", 0, m.Payload(arrays={"hidden": ref}))))
    assert isinstance(feed, m.Feed)
    assert feed.payload.arrays["hidden"] == ref and feed.payload.arrays["hidden"].cuda == REF
    assert leases_of(feed.payload) == [m.LeaseId("s0r0g0", -1)]
    # Older refs (no `cuda`) still decode, and encode without it.
    plain = m.ArrayRef(dtype="<f4", shape=(2,), inline=b"\0" * 8)
    assert m.decode(m.encode(m.Feed("r", 0, m.Payload(arrays={"a": plain})))).payload.arrays["a"].cuda is None


SEGMENT = m.CudaSegmentRef(device=0, handle=b"\x03" * 64, buffer=17, offset=1 << 21, stride=(4096, 1), dtype="bfloat16",
                           event=b"\x04" * 64)


def test_an_allocation_handle_crosses_the_bus_and_its_lease_waits_for_the_tensor_not_the_message() -> None:
    refs = {
        "h": m.ArrayRef(dtype="torch:cuda", shape=(8192, 4096), cuda_segment=SEGMENT, lease=-2, producer="s0r0g0"),
        "t": m.ArrayRef(dtype="torch:cuda", shape=(8192, 4096), cuda=REF, lease=-3, producer="s0r0g0"),
        "s": m.ArrayRef(dtype="<f4", shape=(1 << 20,), segment="seg", nbytes=1 << 22, lease=7, producer="s0r0g0"),
    }
    feed = m.decode(m.encode(m.Feed("r", 0, m.Payload(arrays=refs))))
    assert isinstance(feed, m.Feed) and feed.payload.arrays == refs
    assert feed.payload.arrays["h"].cuda_segment == SEGMENT and feed.payload.arrays["h"].cuda is None
    # The orchestrator counts every lease; a consumer gives back on receipt all but the handle's.
    assert leases_of(feed.payload) == [m.LeaseId("s0r0g0", x) for x in (-2, -3, 7)]
    assert leases_released_on_receipt(feed.payload) == [m.LeaseId("s0r0g0", x) for x in (-3, 7)]


def test_a_tensor_on_a_mapped_allocation_gives_its_lease_back_when_it_ends() -> None:
    importer = CudaImporter()
    codec = PayloadCodec("c", None, SegmentCache())
    codec._cuda_import = importer
    mapping = _Mapping(base=1 << 32, device=0)
    views = [_View(importer, mapping, m.LeaseId("p", -1), {}), _View(importer, mapping, None, {})]
    assert mapping.live == 2 and not codec.cuda_pending
    views.pop(0)  # (what torch drops when the tensor's storage ends)
    assert mapping.live == 1 and list(importer.done) == [(m.LeaseId("p", -1), 0)] and codec.cuda_pending
    views.clear()
    assert mapping.live == 0 and len(importer.done) == 1  # a view without a lease gives nothing back


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error where libcuda is absent")
def test_without_a_cuda_driver_the_handle_path_says_so() -> None:
    try:
        Driver()
    except CudaDriverError as err:
        assert "libcuda.so.1" in str(err)
    else:
        pytest.skip("libcuda loads here")


def test_omni_cuda_ipc_picks_the_path_and_refuses_anything_else() -> None:
    probe = ("from omni_actors.bus.codec import PayloadCodec; from omni_actors.bus.shm import SegmentCache; "
             "print(PayloadCodec('p', None, SegmentCache(), cuda_ipc=True).cuda_export is None)")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    runs = {v: subprocess.run([sys.executable, "-c", probe], env={**env, "OMNI_CUDA_IPC": v},
                              capture_output=True, text=True, timeout=60) for v in ("", "torch", "handles")}
    assert runs[""].stdout.strip() == "False"  # (default: the allocation handle, torch's where it cannot)
    assert runs["torch"].stdout.strip() == "True"
    assert runs["handles"].returncode != 0 and "OMNI_CUDA_IPC: expected one of" in runs["handles"].stderr


def test_cuda_and_shared_memory_leases_of_one_producer_are_freed_apart() -> None:
    arena = Arena(f"omni-test-{uuid.uuid4().hex[:8]}")
    codec = PayloadCodec("p", arena, SegmentCache(), cuda_ipc=True)
    try:
        shm_lease = codec.encode({"x": np.zeros(INLINE_MAX_BYTES + 1, np.uint8)}).arrays["x"].lease
        held = torch.zeros(3)
        cuda_lease = codec.cuda.hold(held)
        assert shm_lease > 0 > cuda_lease and codec.leased == 2
        codec.free([cuda_lease])
        assert codec.leased == 1 and arena.leased == 1
        codec.free([shm_lease])
        assert codec.leased == 0
        # A CPU tensor still goes through shared memory, not as a handle.
        ref = codec.encode({"t": torch.ones(INLINE_MAX_BYTES)}).arrays["t"]
        assert ref.cuda is None and ref.segment
    finally:
        arena.close()


def test_the_launcher_allows_handles_only_between_stages_on_one_device() -> None:
    same = make_deploy(stages=[{"stage_id": s, "devices": "0"} for s in (0, 1, 2)])
    pipe = get_pipeline("synthetic")  # 0 (text, final) -> 1 (codes) -> 2 (audio, final)
    gpu = Launcher(same, pipe, "", "p", "cuda")
    assert [gpu.cuda_ipc_ok(s) for s in (0, 1, 2)] == [False, True, False]  # the orchestrator reads 0 and 2
    assert not Launcher(same, pipe, "", "p", "cpu").cuda_ipc_ok(1)
    apart = make_deploy(stages=[{"stage_id": 1, "devices": "0"}, {"stage_id": 2, "devices": "1"}])
    assert not Launcher(apart, pipe, "", "p", "cuda").cuda_ipc_ok(1)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_tensor_crosses_between_two_processes_by_handle() -> None:
    script = Path(__file__).parents[2] / "scripts" / "bench_cuda_ipc.py"
    out = subprocess.run([sys.executable, str(script), "--mib", "4", "--rounds", "3"],
                         capture_output=True, text=True, timeout=300, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["equal"] is True and r["bad_rounds"] == 0
    assert r["paths_seen"] == {"segment": ["segment"], "torch": ["torch"], "warm": ["segment"], "stream": ["segment"]}
    assert r["consumer_maps_reused"] >= 1 and r["mapped_after"] == 0  # mapped once, then unmapped
