"""Fashion-MNIST on disk: download the real data set, or write a synthetic stand-in.

Both end up where `torchvision.datasets.FashionMNIST(root)` reads them,
`<root>/FashionMNIST/raw/`, in the data set's own IDX format. The stand-in has ten
learnable classes of garment silhouettes (random shifts, scales, rotations, strokes and
noise) so that accuracy climbs over epochs as it does on the real thing; a file
`SYNTHETIC_STAND_IN.txt` beside the IDX files labels it, and the lab's script prints a
note whenever it trains on it.

    python -m autograde.data synthetic --root data/synthetic [--train-size N --val-size N --seed S]
    python -m autograde.data download --root data
"""
from __future__ import annotations

import argparse
import os
import struct
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image, ImageDraw

IMAGE_SIZE = 28
MARKER = "SYNTHETIC_STAND_IN.txt"
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]

# One silhouette per class, as polygons on a 28x28 grid (x right, y down).
_Polygon = list[tuple[float, float]]
_SHAPES: list[list[_Polygon]] = [
    # T-shirt/top: body with short sleeves
    [[(9, 4), (19, 4), (26, 9), (23, 13), (20, 11), (20, 25), (8, 25), (8, 11), (5, 13), (2, 9)]],
    # Trouser: two legs
    [[(9, 2), (19, 2), (21, 26), (16, 26), (14, 9), (12, 26), (7, 26)]],
    # Pullover: long sleeves, round neck
    [[(9, 4), (12, 6), (16, 6), (19, 4), (24, 7), (26, 23), (22, 23), (20, 12), (20, 25),
      (8, 25), (8, 12), (6, 23), (2, 23), (4, 7)]],
    # Dress: narrow top, flared skirt
    [[(11, 2), (17, 2), (18, 10), (24, 26), (4, 26), (10, 10)]],
    # Coat: long sleeves, long body (its opening is drawn as a stroke below)
    [[(9, 2), (19, 2), (24, 5), (26, 24), (22, 24), (20, 11), (21, 27), (7, 27), (8, 11),
      (6, 24), (2, 24), (4, 5)]],
    # Sandal: a thin sole and straps
    [[(2, 19), (26, 18), (26, 21), (2, 22)], [(5, 19), (9, 12), (11, 13), (8, 19)],
     [(13, 18), (17, 11), (19, 12), (16, 18)], [(20, 18), (23, 13), (25, 14), (23, 18)]],
    # Shirt: like the T-shirt, with mid-length sleeves and a collar notch
    [[(9, 4), (14, 8), (19, 4), (25, 10), (23, 17), (20, 13), (20, 25), (8, 25), (8, 13),
      (5, 17), (3, 10)]],
    # Sneaker: low shoe
    [[(2, 14), (11, 12), (17, 15), (26, 17), (26, 21), (2, 21)]],
    # Bag: a box with a handle (the handle is drawn as a stroke below)
    [[(4, 11), (24, 11), (25, 25), (3, 25)]],
    # Ankle boot: high shaft, heel and toe
    [[(7, 3), (15, 3), (15, 13), (25, 16), (26, 22), (7, 22)]],
]


def _render(label: int, rng: np.random.Generator) -> np.ndarray:
    """One 28x28 uint8 image of class `label`, drawn at 4x size and shrunk for smooth edges."""
    scale = 4
    canvas = Image.new("L", (IMAGE_SIZE * scale, IMAGE_SIZE * scale), 0)
    draw = ImageDraw.Draw(canvas)
    fill = int(rng.integers(110, 256))
    for polygon in _SHAPES[label]:
        draw.polygon([(x * scale, y * scale) for x, y in polygon], fill=fill)
    if label == 4:  # coat opening
        draw.line([(14 * scale, 3 * scale), (14 * scale, 27 * scale)], fill=fill // 3, width=scale)
    if label == 8:  # bag handle
        draw.arc([8 * scale, 3 * scale, 20 * scale, 19 * scale], 180, 360, fill=fill, width=2 * scale)
    for _ in range(int(rng.integers(0, 4))):  # random strokes: prints, seams, stripes
        x0, y0, x1, y1 = (rng.uniform(2, 26, size=4) * scale).tolist()
        draw.line([(x0, y0), (x1, y1)], fill=int(rng.integers(0, 256)), width=int(rng.integers(1, 3)) * scale)
    # Random size, rotation and position.
    zoom = rng.uniform(0.75, 1.1)
    canvas = canvas.rotate(float(rng.uniform(-12, 12)), resample=Image.Resampling.BILINEAR,
                           translate=(round(rng.uniform(-3, 3) * scale), round(rng.uniform(-3, 3) * scale)))
    size = max(8, round(IMAGE_SIZE * zoom))
    small = canvas.resize((size, size), Image.Resampling.BILINEAR)
    image = Image.new("L", (IMAGE_SIZE, IMAGE_SIZE), 0)
    image.paste(small, ((IMAGE_SIZE - size) // 2, (IMAGE_SIZE - size) // 2))
    pixels = np.asarray(image, dtype=np.float32)
    pixels += rng.normal(0, 25, size=pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)


def make_split(size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """`size` images (N x 28 x 28, uint8) and labels (N, uint8), the same for the same seed.

    The classes take turns, so every class has size // 10 or one more images.
    """
    rng = np.random.default_rng(seed)
    labels = rng.permutation(np.arange(size) % len(CLASSES)).astype(np.uint8)
    images = np.stack([_render(int(label), rng) for label in labels]) if size else \
        np.zeros((0, IMAGE_SIZE, IMAGE_SIZE), np.uint8)
    return images, labels


def write_idx_images(path: Path, images: np.ndarray) -> None:
    """IDX3 file: magic 0x00000803 (unsigned bytes, 3 dimensions), the sizes big-endian, the pixels."""
    _write_whole(path, struct.pack(">IIII", 0x0803, *images.shape) + images.tobytes())


def write_idx_labels(path: Path, labels: np.ndarray) -> None:
    """IDX1 file: magic 0x00000801 (unsigned bytes, 1 dimension), the count big-endian, the labels."""
    _write_whole(path, struct.pack(">II", 0x0801, len(labels)) + labels.tobytes())


def _write_whole(path: Path, content: bytes) -> None:
    """Written beside `path`, then renamed onto it: a process that reads it while another writes the
    same stand-in (two at once, from one shared folder) reads a whole file, never part of one."""
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_bytes(content)
    os.replace(partial, path)


def write_synthetic(root: Path, train_size: int = 60000, val_size: int = 10000, seed: int = 0) -> Path:
    """Write the stand-in under root/FashionMNIST/raw/ and return that folder."""
    raw = Path(root) / "FashionMNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, size, split_seed in (("train", train_size, seed), ("t10k", val_size, seed + 1_000_003)):
        images, labels = make_split(size, split_seed)
        write_idx_images(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx_labels(raw / f"{prefix}-labels-idx1-ubyte", labels)
    (raw / MARKER).write_text(
        "These files are a SYNTHETIC stand-in for Fashion-MNIST, written by `python -m autograde.data synthetic`\n"
        f"(train_size={train_size}, val_size={val_size}, seed={seed}). Accuracies measured on them say nothing\n"
        "about Fashion-MNIST. Get the real data set with `make data`.\n")
    return raw


def is_synthetic(root: Path) -> bool:
    """True if root holds the stand-in rather than the real data set."""
    return (Path(root) / "FashionMNIST" / "raw" / MARKER).exists()


def has_data(root: Path) -> bool:
    """True if root holds the four uncompressed IDX files torchvision reads."""
    raw = Path(root) / "FashionMNIST" / "raw"
    return all((raw / f"{p}-{kind}-idx{d}-ubyte").is_file()
               for p in ("train", "t10k") for kind, d in (("images", 3), ("labels", 1)))


def choose(real: Path, fake: Path | None = None, train_size: int = 60000, val_size: int = 10000,
           seed: int = 0, say: Callable[[str], None] | None = None) -> tuple[Path, bool]:
    """Where to train, and whether it is the stand-in: Fashion-MNIST when `real` holds it, else
    the stand-in in `fake` (default real/synthetic), written there first if it is missing.
    Every tool that trains asks this, so the choice exists once."""
    if has_data(real) and not is_synthetic(real):
        return Path(real), False
    fake = Path(fake) if fake is not None else Path(real) / "synthetic"
    if not has_data(fake):
        if say:
            say(f"No Fashion-MNIST in {real} (`make data` downloads it): writing the synthetic stand-in to {fake} ...")
        write_synthetic(fake, train_size, val_size, seed)
    return fake, True


def temp_stand_in(name: str, train_size: int, val_size: int, seed: int = 5) -> Path:
    """A synthetic stand-in of this size in the folder `name` of the temporary folder, written on first use
    (a notebook's demos share it from one cell, and one run, to the next)."""
    folder = Path(tempfile.gettempdir()) / name
    return choose(folder, folder, train_size, val_size, seed)[0]


def download(root: Path) -> None:
    """Fetch the real Fashion-MNIST with torchvision; exit with one line of advice if that fails."""
    from torchvision.datasets import FashionMNIST  # imported here: torch is slow to import

    if is_synthetic(root):
        sys.exit(f"error: {root} holds the synthetic stand-in; download into another folder "
                 "or delete that one first")
    try:
        for train in (True, False):
            FashionMNIST(str(root), train=train, download=True)
    except (OSError, RuntimeError) as err:
        reason = str(err).strip().splitlines()[-1]
        sys.exit(f"error: could not download Fashion-MNIST into {root} ({reason}). Offline, put the four "
                 f"*-ubyte.gz files in {Path(root) / 'FashionMNIST' / 'raw'}/, or use the stand-in: make synthetic-data")
    print(f"Fashion-MNIST is in {Path(root) / 'FashionMNIST' / 'raw'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m autograde.data", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    synthetic = commands.add_parser("synthetic", help="write the synthetic stand-in")
    synthetic.add_argument("--root", type=Path, default=Path("data/synthetic"))
    synthetic.add_argument("--train-size", type=int, default=60000)
    synthetic.add_argument("--val-size", type=int, default=10000)
    synthetic.add_argument("--seed", type=int, default=0)
    fetch = commands.add_parser("download", help="download the real Fashion-MNIST")
    fetch.add_argument("--root", type=Path, default=Path("data"))
    args = parser.parse_args(argv)
    if args.command == "download":
        download(args.root)
        return
    if args.train_size < 1 or args.val_size < 1:
        parser.error("--train-size and --val-size must be at least 1")
    try:
        raw = write_synthetic(args.root, args.train_size, args.val_size, args.seed)
    except OSError as err:
        sys.exit(f"error: cannot write the stand-in into {args.root} ({err.strerror}); choose another --root")
    print(f"wrote a SYNTHETIC stand-in for Fashion-MNIST ({args.train_size} training and "
          f"{args.val_size} validation images, seed {args.seed}) to {raw}")


if __name__ == "__main__":
    main()
