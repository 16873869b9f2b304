"""Seed derivation: every random choice in evolm is a pure function of one root seed and a key path.

Design decisions:

- ``derive_seed(root, *path)`` mixes the root seed and the key path with NumPy's ``SeedSequence`` (a
  proper hash-based mixer), so related keys give unrelated seeds: never ``seed + small offset``, never
  one seed shared by every tensor (which gives identical noise to same-shaped layers, as the ES
  reference code does). String parts are hashed to 32-bit words (CRC-32), integers must be >= 0.
  The result is a 63-bit integer.
- ``seed31`` is the same seed reduced to 31 bits, for consumers that take a signed 32-bit seed
  (``random.Random`` does not care, but task samplers, torch generators and NumPy legacy code do).
- ``ids_seed(root, ids)`` seeds one evaluation call from the root seed and the ids of the problems
  in it (a SHA-256 of their text form), so a problem's samples do not depend on which other problems
  were generated before it or cached.
- Stdlib and NumPy only: the bottom layer of the package.
"""

from __future__ import annotations

import hashlib
import zlib
from typing import Sequence

import numpy as np


def _word(part: int | str) -> int:
    if isinstance(part, str):
        return zlib.crc32(part.encode())
    if part < 0:
        raise ValueError("key parts must be non-negative")
    return int(part)


def derive_seed(root: int, *path: int | str) -> int:
    """A 63-bit seed for the key ``path`` under ``root`` (strings are hashed to 32-bit words)."""
    ss = np.random.SeedSequence(entropy=int(root), spawn_key=tuple(_word(p) for p in path))
    return int(ss.generate_state(1, dtype=np.uint64)[0] >> np.uint64(1))


def seed31(root: int, *path: int | str) -> int:
    """``derive_seed(root, *path)`` reduced to 31 bits."""
    return derive_seed(root, *path) % (2**31)


def ids_seed(root: int, ids: Sequence[str]) -> int:
    """The sampling seed of one generator call: a hash of the root seed and the problem ids in the call."""
    return int(hashlib.sha256(f"{root}|{'|'.join(map(str, ids))}".encode()).hexdigest()[:8], 16)
