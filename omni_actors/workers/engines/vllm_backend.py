"""Every difference between running vLLM on CPU and on CUDA: environment, KV cache size, engine args.

`VllmAREngine` asks this module for two things and knows nothing else about
the device: the environment variables to set while vLLM lives (`backend_env`)
and the `EngineArgs` keyword arguments (`engine_kwargs`).

Why the process mode differs by device (measured on 2 CPU cores, tiny Llama):
vLLM's multiprocess mode runs the engine core in a child process (and on CPU
one more process for the model worker), so a step in our worker overlaps with
the core scheduling and running the next batch. On CUDA that overlap is what
keeps the GPU busy and is the default. On CPU the same three processes share
the cores the model runs on, start in ~20 s instead of ~6 s, and gain nothing
from overlap (the forward pass is the bottleneck), so the default there is the
in-process core. `engine_extras["multiprocess"]` overrides either default.

engine_extras keys understood here (all optional):
    max_model_len (int)         context length; defaults to the model's
    kv_cache_space_gib (float)  CPU only: KV cache size; default 1 GiB
    enforce_eager (bool)        CUDA only (CPU is always eager); default False
    multiprocess (bool)         engine core in its own process; see above
    seed (int)                  engine-wide seed; default 0
    enable_prefix_caching (bool)
    enable_prompt_embeds (bool) accept "prompt_embeds" inputs; default False
    limit_mm_per_prompt (dict)  e.g. {"image": 1, "audio": 1}
    trust_remote_code (bool)
    tokenizer (str)             tokenizer folder when it is not the model's
    cache_dir (str)             a lasting folder for vLLM's caches; by default they
                                live in the engine's private folder and go at close,
                                which costs a ~10 s model-class inspection per start
    engine_args (dict)          any other EngineArgs field, passed through as is
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omni_actors.workers.engine import EngineContext

GIB = 1 << 30
CPU_KV_CACHE_SPACE_GIB_DEFAULT = 1.0
CPU_MULTIPROCESS_DEFAULT = False
CUDA_MULTIPROCESS_DEFAULT = True

# Passed to EngineArgs unchanged when present in engine_extras.
_PASSTHROUGH_KEYS = (
    "max_model_len",
    "seed",
    "enable_prefix_caching",
    "enable_prompt_embeds",
    "limit_mm_per_prompt",
    "trust_remote_code",
    "tokenizer",
)
KNOWN_EXTRAS = frozenset(
    (
        *_PASSTHROUGH_KEYS,
        "kv_cache_space_gib",
        "cache_dir",
        "enforce_eager",
        "multiprocess",
        "engine_args",
    )
)


def is_cpu(ctx: EngineContext) -> bool:
    return ctx.device == "cpu"


def use_multiprocess(ctx: EngineContext) -> bool:
    default = CPU_MULTIPROCESS_DEFAULT if is_cpu(ctx) else CUDA_MULTIPROCESS_DEFAULT
    return bool(ctx.engine_extras.get("multiprocess", default))


def backend_env(ctx: EngineContext, private_dir: Path) -> dict[str, str]:
    """Environment for vLLM: private IPC and cache folders, process mode, CPU threading."""
    env = {
        # vLLM's ZeroMQ IPC sockets and its compile/asset caches go into a
        # folder the engine removes at close, not the shared temp dir or ~.
        "VLLM_RPC_BASE_PATH": str(private_dir / "rpc"),
        "VLLM_CACHE_ROOT": str(ctx.engine_extras.get("cache_dir") or private_dir / "cache"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if use_multiprocess(ctx) else "0",
        "VLLM_NO_USAGE_STATS": "1",
        # Nothing may be fetched at run time; offline also skips hub look-ups
        # that otherwise wait on the network during engine start.
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "VLLM_DO_NOT_TRACK": "1",
        # Child processes (engine core, model workers) must not fork a process
        # that already holds threads or, on CUDA, a CUDA context.
        "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
    }
    if is_cpu(ctx):
        space = float(ctx.engine_extras.get("kv_cache_space_gib", CPU_KV_CACHE_SPACE_GIB_DEFAULT))
        # vLLM's CPU platform reads this (whole GiB) and overrides
        # kv_cache_memory_bytes with it; keep both consistent.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(space)))
        # Pinning OpenMP threads to cores fights the other processes on a
        # small shared host; OMP_NUM_THREADS set by the deployment still applies.
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def engine_kwargs(ctx: EngineContext) -> dict[str, Any]:
    """Keyword arguments for `vllm.EngineArgs` from the stage context."""
    extras = ctx.engine_extras
    if ctx.model_path is None:
        raise ValueError("the vLLM engine needs a model path")
    kwargs: dict[str, Any] = {
        "model": str(ctx.model_path),
        "dtype": ctx.dtype,
        "max_num_seqs": ctx.max_num_seqs,
        "tensor_parallel_size": ctx.tensor_parallel_size,
        "seed": 0,
        "disable_log_stats": True,
    }
    kwargs.update({k: extras[k] for k in _PASSTHROUGH_KEYS if k in extras})
    if is_cpu(ctx):
        space = float(extras.get("kv_cache_space_gib", CPU_KV_CACHE_SPACE_GIB_DEFAULT))
        kwargs["kv_cache_memory_bytes"] = int(space * GIB)
        # No CUDA graphs on CPU; eager also skips minutes of torch.compile.
        kwargs["enforce_eager"] = True
    else:
        kwargs["gpu_memory_utilization"] = ctx.gpu_memory_utilization
        kwargs["enforce_eager"] = bool(extras.get("enforce_eager", False))
    kwargs.update(extras.get("engine_args", {}))
    return kwargs
