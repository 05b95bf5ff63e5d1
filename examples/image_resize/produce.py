"""The producer: one resize task per ``*.pgm`` image of a folder.

python -m examples.image_resize.produce --images /tmp/images --samples 20 --broken
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from examples.image_resize import images
from examples.image_resize.tasks import resize


def make_samples(folder: Path, count: int, *, broken: bool) -> None:
    """*count* sample images, and with *broken* one file that is not an image (it will be dead-lettered)."""
    for i in range(count):
        images.write_atomically(folder / f"sample-{i:03d}.pgm", images.encode(images.sample(320, 240, seed=i)))
    if broken:
        (folder / "broken.pgm").write_bytes(b"this is not an image")


def enqueue_folder(folder: Path, out_dir: Path, width: int) -> list[str]:
    """Enqueue one task per image; returns the image ids (file stems)."""
    ids = []
    for path in sorted(folder.glob("*.pgm")):
        resize.delay(path.stem, str(path), width, str(out_dir))
        ids.append(path.stem)
    return ids


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=Path, required=True, help="folder of *.pgm images")
    parser.add_argument("--out", type=Path, help="folder for thumbnails (default: IMAGES/thumbnails)")
    parser.add_argument("--width", type=int, default=64, help="thumbnail width in pixels (default 64)")
    parser.add_argument("--samples", type=int, default=0, help="first write this many sample images")
    parser.add_argument("--broken", action="store_true", help="and one broken file, to see a dead letter")
    args = parser.parse_args(argv)
    args.images.mkdir(parents=True, exist_ok=True)
    make_samples(args.images, args.samples, broken=args.broken)
    ids = enqueue_folder(args.images, args.out or args.images / "thumbnails", args.width)
    print(f"enqueued {len(ids)} resize task(s); run: celery -A examples.image_resize.tasks worker -c 4")
    return 0


if __name__ == "__main__":
    sys.exit(main())
