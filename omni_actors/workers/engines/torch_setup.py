"""The torch setup stage engines share: dtype names, the load dtype, where weights load, CPU threads,
seeded generators, attention backends for forwards of varying shapes, a stage's share of its device."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from omni_actors.workers.engine import EngineContext, direct_load, timed

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_dtype(ctx: EngineContext) -> torch.dtype:
    """float32 on CPU; else the deploy's dtype (bfloat16 for "auto")."""
    return torch.float32 if ctx.device == "cpu" else DTYPES.get(ctx.dtype, torch.bfloat16)


def weights_device_map(ctx: EngineContext) -> dict[str, torch.device] | None:
    """`device_map` for `from_pretrained`: on CUDA the weights load straight from safetensors onto
    the stage's device (no copy of the whole model in host memory, no `.to(device)` pass; MoE
    experts are merged there too); None on CPU, which loads as it always has, and where
    `direct_load` is off. The first call on CUDA makes the process's CUDA context (start-up phase
    "cuda_init")."""
    if ctx.device == "cpu" or not direct_load(ctx):
        return None
    if ctx.device != "cuda":
        return {"": torch.device(ctx.device)}
    with timed(ctx, "cuda_init"):
        device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.synchronize(device)  # (the context is made on the first call that needs it)
    return {"": device}


def cap_device_memory(ctx: EngineContext) -> None:
    """On CUDA, the stage's `gpu_memory_utilization` as the most its process's allocator may take of
    the device (`torch.cuda.set_per_process_memory_fraction`): a request too large for that share
    fails as out of memory instead of starving the stages beside it. (Stages on vLLM reserve their
    share themselves.) Nothing on CPU, nor at 1.0."""
    if ctx.device != "cuda" or ctx.gpu_memory_utilization >= 1.0:
        return
    torch.cuda.set_per_process_memory_fraction(ctx.gpu_memory_utilization, torch.cuda.current_device())


def one_cpu_thread(ctx: EngineContext) -> None:
    """Stages on CPU share the box: one intra-op thread each."""
    if ctx.device == "cpu":
        torch.set_num_threads(1)


def seeded(seed: Any, device: torch.device) -> torch.Generator | None:
    """A generator seeded with `seed` on `device`; None when the request names no seed."""
    return None if seed is None else torch.Generator(device=device).manual_seed(int(seed))


def varying_shapes_attention(device: torch.device) -> contextlib.AbstractContextManager[None]:
    """On CUDA, scaled_dot_product_attention without its cuDNN backend, for forwards whose shapes
    change from call to call (prompts): cuDNN builds an execution plan for every new shape, which
    made an H200 prefill of four Higgs-Audio-V2 prompts 90 ms instead of 42 ms (and a process's first
    prefill 1.4 s instead of 0.47 s). Decode steps, captured once per shape, keep it."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
