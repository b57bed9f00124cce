"""What crosses the process boundary in the capstone: the data set's rule (which bytes are a sample of
which split), the key that names a sample by its bytes, and the events the in-process tracing adds.

The data set is the standard library's Python sources of the Python that runs the course, split by
file: the same rule as the handed-out baseline's (exercises/capstone_lm.py, which imports nothing of
the course; tests/parts/capstone/ holds the two to the same bytes). Pure Python: the checker reads it
without torch."""
from __future__ import annotations

import hashlib
import sysconfig
import zlib
from pathlib import Path

CONTEXT = 64         # bytes a sample feeds the model (a sample holds one more: its last target)
VAL_MODULUS = 20     # a file is in the validation split when the CRC-32 of its path is 0 modulo this
# folders of the standard library left out, besides its test suites (every folder whose name starts with
# "test"): the tools bundled with it, and what was installed into it
SKIP = frozenset({"idle_test", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages"})

# The events the capstone's in-process code adds to a trace, with their fields (protocol.EVENTS has the core's)
EVENTS: dict[str, tuple[str, ...]] = {
    "lm_model": (),                           # the model was built (its token embedding made)
    # a batch went into the model: "train" or "eval", each row's key, a digest of the weights it met
    "lm_rows": ("mode", "keys", "weights"),
    "lm_recheck": ("evaluation", "loss"),     # the course's own loss of the weights the k-th evaluation used
    "lm_shapes": ("shapes",),                 # the model's parameters' shapes, sorted (at its first batch)
    "lm_optimizer": ("name",),                # an optimizer was built: its class's name
}


def sources() -> tuple[Path, list[Path]]:
    """The standard library's folder and its .py files in the rule's order (their paths from it, sorted)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = [p for p in root.rglob("*.py") if not any(folder.startswith("test") or folder in SKIP
                                                      for folder in p.relative_to(root).parts[:-1])]
    return root, sorted(files, key=lambda p: p.relative_to(root).as_posix())


def split_bytes(split: str, limit: int) -> bytes:
    """The first `limit` bytes of the split ("train" or "val"): its files joined in order."""
    root, files = sources()
    stream = bytearray()
    for path in files:
        if (zlib.crc32(path.relative_to(root).as_posix().encode()) % VAL_MODULUS == 0) == (split == "val"):
            stream += path.read_bytes()
            if len(stream) >= limit:
                break
    return bytes(stream[:limit])


def samples(split: str, limit: int) -> list[bytes]:
    """The split's samples: CONTEXT + 1 bytes each, every one starting where the last one's inputs end."""
    stream = split_bytes(split, limit)
    return [stream[i * CONTEXT: i * CONTEXT + CONTEXT + 1] for i in range((len(stream) - 1) // CONTEXT)]


def key(inputs: bytes) -> str:
    """A sample's name: a digest of the CONTEXT bytes the model is given (its inputs)."""
    return hashlib.blake2b(inputs[:CONTEXT], digest_size=8).hexdigest()
