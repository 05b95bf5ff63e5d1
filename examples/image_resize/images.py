"""Tiny 8-bit binary PGM (P5) images: parse, nearest-neighbour resize, encode; no imaging library needed."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

#: Larger images are refused as not-an-image: a decompression bomb must not take a worker down.
MAX_SIDE = 10_000

_HEADER = re.compile(rb"\AP5\s+(\d+)\s+(\d+)\s+(\d+)\s")


class NotAnImageError(ValueError):
    """The bytes are not an image this example can read: a permanent error, retrying cannot help."""


@dataclass(frozen=True)
class Image:
    width: int
    height: int
    #: Row-major, one byte per pixel.
    pixels: bytes


def parse(data: bytes) -> Image:
    match = _HEADER.match(data)
    if not match:
        raise NotAnImageError("not a binary PGM (P5) image")
    width, height, maxval = (int(g) for g in match.groups())
    if not (0 < width <= MAX_SIDE and 0 < height <= MAX_SIDE) or not 0 < maxval < 256:
        raise NotAnImageError(f"unsupported size {width}x{height} or depth {maxval}")
    pixels = data[match.end() : match.end() + width * height]
    if len(pixels) < width * height:
        raise NotAnImageError(f"truncated: {len(pixels)} of {width * height} pixels")
    return Image(width, height, pixels)


def encode(image: Image) -> bytes:
    return b"P5\n%d %d\n255\n" % (image.width, image.height) + image.pixels


def resize(image: Image, width: int) -> Image:
    """Nearest-neighbour resize to *width* pixels wide, keeping the aspect ratio."""
    height = max(1, round(image.height * width / image.width))
    rows = []
    for y in range(height):
        start = (y * image.height // height) * image.width
        rows.append(bytes(image.pixels[start + x * image.width // width] for x in range(width)))
    return Image(width, height, b"".join(rows))


def sample(width: int, height: int, seed: int = 0) -> Image:
    """A diagonal gradient, different per seed: something to resize."""
    pixels = bytes((x + y + seed * 37) % 256 for y in range(height) for x in range(width))
    return Image(width, height, pixels)


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file and rename it: a reader (or a retry) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
