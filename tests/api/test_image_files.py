"""The in-memory store behind image URLs: expiry by timer, a byte bound, nothing left at shutdown."""

from __future__ import annotations

import asyncio

from omni_actors.api.image_files import ImageFiles


async def test_a_file_expires_by_its_timer() -> None:
    files = ImageFiles(ttl_s=0.0)
    name, _ = files.put(b"png-bytes", "png")
    assert files.get(name) is not None and name.endswith(".png")
    for _ in range(3):  # a 0 s timer fires on the next turns of the loop
        await asyncio.sleep(0)
    assert files.get(name) is None and len(files) == 0


async def test_over_the_byte_bound_the_oldest_go_first_and_clear_drops_all() -> None:
    files = ImageFiles(ttl_s=3600.0, max_bytes=10)
    first, _ = files.put(b"123456", "jpeg")
    second, _ = files.put(b"abcdef", "webp")
    assert files.get(first) is None and files.get(second).content_type == "image/webp"
    files.clear()
    assert len(files) == 0 and files.get(second) is None


async def test_one_answers_images_never_push_one_another_out() -> None:
    """An answer of n images past the bound together dropped its own first links before it was sent: the
    client got URLs that were already 404s. Older files go; the answer's own stay, as a lone image does."""
    files = ImageFiles(ttl_s=3600.0, max_bytes=10)
    older, _ = files.put(b"old", "png")
    names, _ = files.put_all([b"123456", b"abcdef", b"ghijkl"], "png")
    assert [files.get(n).data for n in names] == [b"123456", b"abcdef", b"ghijkl"]
    assert files.get(older) is None and len(files) == 3
    files.clear()
