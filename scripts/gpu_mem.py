"""GPU memory readings for the benchmarks: device-wide used memory (nvidia-smi) and torch's peak in this process.

Not a script itself. On CPU (or without nvidia-smi) every reading is None, so a
benchmark's JSON line carries null for its GPU keys.
"""

from __future__ import annotations

import gc
import subprocess

NVIDIA_SMI_TIMEOUT_S = 20


def gpu_used_gb() -> float | None:
    """Memory in use on every visible GPU together, GiB, as nvidia-smi reports it: all processes (the
    bench's own CUDA context and cache included), not one worker's share. None without nvidia-smi."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=True,
        ).stdout  # fmt: skip
        return round(sum(float(x) for x in out.split()) / 1024, 2)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def _cuda(device: str) -> bool:
    return device.startswith("cuda")


def reset_peak(device: str) -> None:
    """Start a fresh `max_memory_allocated` window on `device` (no-op off CUDA)."""
    if _cuda(device):
        import torch

        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def peak_gb(device: str) -> float | None:
    """torch's peak allocated memory on `device` since the last `reset_peak`, GiB (None off CUDA)."""
    if not _cuda(device):
        return None
    import torch

    torch.cuda.synchronize(device)
    return round(torch.cuda.max_memory_allocated(device) / 2**30, 2)


def free_cached(device: str) -> None:
    """Collect garbage and hand torch's cached blocks back to the driver, so that a worker process
    started next finds the memory free and nvidia-smi stops counting it against this process."""
    gc.collect()
    if _cuda(device):
        import torch

        torch.cuda.empty_cache()
