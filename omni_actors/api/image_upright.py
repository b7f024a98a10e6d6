"""Uploaded images shown as a viewer shows them: turned by their EXIF orientation, and in a mode whose
convert() keeps what they show (16-bit greyscale, colour-key transparency). Used by every route that
takes an image: chat and responses inputs, image edits and masks, a video's first frame."""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

EXIF_ORIENTATION = 0x0112
ORIENTATIONS = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}
"""EXIF orientation -> the PIL.Image.Transpose that shows it upright, as ImageOps.exif_transpose's table: 2
FLIP_LEFT_RIGHT, 3 ROTATE_180, 4 FLIP_TOP_BOTTOM, 5 TRANSPOSE, 6 ROTATE_270, 7 TRANSVERSE, 8 ROTATE_90."""
EXIF_ERRORS = (SyntaxError, struct.error, ValueError, OSError)
"""What Pillow raises reading a malformed EXIF block."""


def upright(img: Any) -> Any:
    """`img` turned by its EXIF orientation, as a viewer shows a phone photo (so a mask drawn over it
    lines up). EXIF is untrusted metadata: where Pillow cannot parse it (it raises SyntaxError or
    struct.error from its TIFF reader; ImageOps.exif_transpose also TypeError rewriting it, all once
    a 500), the image is taken as stored, as browsers show it."""
    from PIL import Image

    try:
        orientation = img.getexif().get(EXIF_ORIENTATION, 1)
    except EXIF_ERRORS:
        return img
    method = ORIENTATIONS.get(orientation) if isinstance(orientation, int) else None
    return img if method is None else img.transpose(Image.Transpose(method))


def readable(img: Any) -> Any:
    """`img` in a mode whose convert() keeps what it shows. 16-bit greyscale ("I;16*": 16-bit PNG and
    TIFF) is scaled to 8 bits: PIL's convert clips it at 255 (a mid-grey file became white).
    Transparency given as a colour key (a palette PNG's or GIF's, a tRNS chunk's) becomes an alpha
    band, which getbands() does not show: a mask saved that way (as PNG optimisers write them) was
    read by its colours, so its transparent black was kept and its opaque white painted."""
    from PIL import Image

    if img.mode.startswith("I;16"):
        arr = np.asarray(img).astype(np.int64)
        grey = Image.fromarray((arr // 257).astype(np.uint8), "L")
        key = img.info.get("transparency")
        if not isinstance(key, int):
            return grey
        grey.putalpha(Image.fromarray(np.where(arr == key, 0, 255).astype(np.uint8), "L"))
        return grey
    if "A" not in img.getbands() and img.has_transparency_data:
        return img.convert("RGBA")
    return img
