"""Default stage input processors, used when a stage names none.

Full-payload:  (upstream: {source: [chunk, ...]}, request: dict) -> inputs
Async chunk:   (source, chunk, last, request, state) -> inputs or None
"""

from __future__ import annotations

from typing import Any

import numpy as np


def merge_chunks(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    """Join deltas key by key: strings and lists concatenate, arrays along axis 0, else last wins."""
    out: dict[str, Any] = {}
    parts: dict[str, list[Any]] = {}
    for chunk in chunks:
        for key, value in chunk.items():
            parts.setdefault(key, []).append(value)
    for key, values in parts.items():
        first = values[0]
        if isinstance(first, str):
            out[key] = "".join(values)
        elif isinstance(first, list):
            out[key] = [x for v in values for x in v]
        elif isinstance(first, np.ndarray):
            out[key] = np.concatenate(values, axis=0) if first.ndim else values[-1]
        elif type(first).__module__.startswith("torch"):
            import torch

            out[key] = torch.cat(values, dim=0) if first.dim() else values[-1]
        else:
            out[key] = values[-1]
    return out


def concat_upstream(upstream: dict[int, list[dict[str, Any]]], request: dict[str, Any]) -> dict[str, Any]:
    """All chunks of all sources (in source order) merged into one input."""
    return merge_chunks([c for src in sorted(upstream) for c in upstream[src]])


def pass_chunk(
    source: int, chunk: dict[str, Any], last: bool, request: dict[str, Any], state: dict[str, Any]
) -> dict[str, Any] | None:
    """Forward each upstream chunk unchanged."""
    return chunk
