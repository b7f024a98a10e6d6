"""torch.compile of HfAREngine's static decode step (engine_extras["compile"], CUDA only; on by
default where the fused step runs, compile_scope "layer": see COMPILE_SCOPES).

Inductor fuses the step's small elementwise kernels (RMSNorm, rotary, SiLU x up,
residual adds, sampling prep) that otherwise dominate a batch-1 decode of a small
model. Shapes are fixed per (batch, length) bucket, so the step is compiled with
`dynamic=False`: one specialisation per bucket, each captured afterwards as a
CUDA graph by hf_ar_graphs.py exactly as the eager step is (the first call of a
bucket compiles and runs, COMPILE_WARMUPS more calls settle it, then it is
captured). The capture runs the compiled code under the "eager_on_recompile"
stance: the kernels inductor made for the bucket go into the graph, and a frame
that would need compiling (never inside a capture) runs eagerly instead. (Until
issue 16's fused step, the capture ran the eager step, so a graphed compiled
step replayed the eager kernels.) Compiled code is cached on disk by inductor
(TORCHINDUCTOR_CACHE_DIR), so a restart recompiles from the cache. A step that
fails to compile falls back to eager for the engine (logged once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from omni_actors import logs

log = logs.get(__name__)

COMPILE_WARMUPS = 2
"""Compiled calls of a bucket before its CUDA-graph capture (no compiling may happen inside one)."""
RECOMPILE_LIMIT = 64
"""Specialisations dynamo keeps per function: one per (batch, length) bucket used."""
COMPILE_MODE = "default"
"""Inductor mode: fused kernels, no autotuning (it multiplies compile time per bucket); the
CUDA graphs are ours (hf_ar_graphs.py), not inductor's. engine_extras["compile_mode"] picks
another of COMPILE_MODES ("max-autotune-no-cudagraphs": autotuned GEMMs, minutes per bucket)."""
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
COMPILE_SCOPES = ("layer", "step")
"""engine_extras["compile_scope"] with the fused step: "layer" (the default) compiles one layer's
code and the head's, shared by every layer (the weights are inputs), so a bucket compiles one
layer's worth (4-6 s cold for a 28-layer 1.5B on an H200); "step" compiles the whole step as one
graph per bucket (24-29 s cold; no faster a step). Without the fused step the whole step compiles."""
BLAS_LIBRARIES = ("cublas", "cublaslt")
"""engine_extras["blas"]: the library the worker's GEMMs go to on CUDA (torch's default: cublas)."""


def compile_wanted(ctx: Any, fused: bool) -> bool:
    """engine_extras["compile"], checked: on CUDA it defaults to whether the fused step runs
    (`fused`; its layer-scope compile costs seconds a bucket), off elsewhere and under enforce_eager."""
    extras = ctx.engine_extras
    want = extras.get("compile", fused)
    if not isinstance(want, bool):
        raise ValueError(f"engine_extras.compile: expected true or false, got {want!r}")
    return ctx.device == "cuda" and want and not extras.get("enforce_eager")


def prefer_blas(ctx: Any) -> None:
    """engine_extras["blas"], checked, set for the worker's process on CUDA (one process per stage
    replica, so the choice is the stage's): cuBLASLt picks other GEMV kernels for a batch-1 step."""
    lib = ctx.engine_extras.get("blas")
    if lib is None:
        return
    if lib not in BLAS_LIBRARIES:
        raise ValueError(f"engine_extras.blas: expected one of {BLAS_LIBRARIES}, got {lib!r}")
    if ctx.device == "cuda":
        torch.backends.cuda.preferred_blas_library(lib)


def compile_mode(ctx: Any) -> str:
    """engine_extras["compile_mode"], checked (COMPILE_MODE when unset)."""
    mode = ctx.engine_extras.get("compile_mode", COMPILE_MODE)
    if mode not in COMPILE_MODES:
        raise ValueError(f"engine_extras.compile_mode: expected one of {COMPILE_MODES}, got {mode!r}")
    return mode


def compile_scope(ctx: Any) -> str:
    """engine_extras["compile_scope"], checked ("layer" when unset)."""
    scope = ctx.engine_extras.get("compile_scope", "layer")
    if scope not in COMPILE_SCOPES:
        raise ValueError(f"engine_extras.compile_scope: expected one of {COMPILE_SCOPES}, got {scope!r}")
    return scope


def compile_dynamic(ctx: Any) -> bool:
    """engine_extras["compile_dynamic"] (layer scope; default true): the layer compiled with
    symbolic sizes at load, so a few compiles serve every bucket (batch 1, and every batch above
    it at every length) and none happens under a request; false: one static compile per bucket,
    at the bucket's first use (~3 s each cold, a stall for the rows in that step). Checked."""
    value = ctx.engine_extras.get("compile_dynamic", True)
    if not isinstance(value, bool):
        raise ValueError(f"engine_extras.compile_dynamic: expected true or false, got {value!r}")
    return value


def compiled_step(step: Callable[[int, int], Any], mode: str = COMPILE_MODE) -> Callable[[int, int], Any]:
    """`step(batch, length)` compiled per bucket; on a compile error, the eager step from then on."""
    return compiled(step, mode, "hf_ar.compile_off")


def compiled(
    fn: Callable[..., Any], mode: str = COMPILE_MODE, event: str = "hf_ar.compile_off", dynamic: bool = False,
) -> Callable[..., Any]:
    """`fn` compiled (dynamic=False: one specialisation per shape, up to RECOMPILE_LIMIT; True: sizes
    symbolic, so one compile serves every batch above 1, which dynamo always specialises); inside
    a CUDA-graph capture only code compiled before runs (else eager); on a compile error, `fn`
    eagerly from then on (`event` logged once with the reason)."""
    import torch._dynamo as dynamo

    for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(dynamo.config, name):
            setattr(dynamo.config, name, max(getattr(dynamo.config, name), RECOMPILE_LIMIT))
    fast = torch.compile(fn, dynamic=dynamic, mode=mode)
    state = {"ok": True}

    cuda = torch.cuda.is_available()

    def run(*args: Any) -> Any:
        if state["ok"] and cuda and torch.cuda.is_current_stream_capturing():
            with torch.compiler.set_stance("eager_on_recompile"):  # replay compiled code only
                return fast(*args)
        if state["ok"]:
            try:
                return fast(*args)
            except Exception as err:  # compilation is an optimisation: fall back, say why once
                state["ok"] = False
                log.warning(event, args=[a for a in args if isinstance(a, int)],
                            reason=f"{type(err).__name__}: {err}"[:300])  # fmt: skip
        return fn(*args)

    return run
