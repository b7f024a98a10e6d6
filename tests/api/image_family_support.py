"""Helpers for the image family tests: a tiny family folder served as `omni-run --model DIR` serves it."""

from __future__ import annotations

import base64
import contextlib
import io
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
from PIL import Image

from omni_actors.cli import served_folder
from omni_actors.models.tiny import make_tiny
from tests.api.conftest import API_KEY, Server, serve_deploy


@contextlib.asynccontextmanager
async def serve_family(name: str, root: Path) -> AsyncIterator[Server]:
    """Build tiny `name` under `root` and serve it with no deploy file (the folder's name is the model)."""
    folder = make_tiny(name, root / name)
    deploy = served_folder(str(folder), {"model": str(folder), "server": {"api_keys": [API_KEY]}})
    async with serve_deploy(deploy, API_KEY) as srv:
        yield srv


def decode(b64: str) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(b64))))


def png(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()
