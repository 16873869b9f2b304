"""Read a model's weights as a float32 state dict without building the model, and put them back.

Design decisions:

- ``load_state(spec)`` reads the safetensors files of the directory ``evolm.models.local_dir`` gives
  for the spec (embedded names via the float32 GGUF cache, Hugging Face directories, run directories'
  ``final/``, hub ids from the local HF cache), so drift and localisation never instantiate a model.
  Every tensor is converted to float32 on CPU; the dtype it was stored in is reported, because a
  bfloat16 checkpoint's rounding would fake "sparsity" (an update smaller than half a bf16 spacing is
  stored as exactly zero).
- Tied embeddings are counted once, as the embedding: ``save_pretrained`` omits ``lm_head.weight``
  when it is tied, and when a file or an in-memory state dict holds both names for one tensor
  (same storage, or bit-identical values in a file whose config says the weights are tied) the
  ``lm_head`` alias is dropped. ``tied_embeddings`` says so in every analysis's output.
- ``load_into_model`` copies a state dict into a model's existing tensors (strict about names, aware
  of tied aliases), which is how re-evaluation runners swap weights without reloading the model.
- The base of an analysis is the weights the run started from. A run directory's ``run.json``
  records their fingerprint (``base``, written by ``evolm.jobs.open_run``; ``evolm.state``) and where
  they are: ``run_base_spec`` gives the spec that loads them (a bfloat16 run's saved ``base/``, a
  pipeline stage's predecessor, else the run's model spec) and ``check_base`` refuses, in one line,
  a base whose fingerprint is not the recorded one, unless the caller allows it. Runs written before
  the record existed cannot be checked and say so (``check: "unrecorded"``).
- ``trained_scope`` is the set of tensors a run trained (an ES run's seed-log header lists the ones it
  perturbed), the population the localisation and drift nulls draw from.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from safetensors import safe_open

from evolm import models
from evolm.models import unreadable_as_user_error
from evolm.errors import UserError
from evolm.runs import RunDir
from evolm.state import EMBEDDING_NAMES, LM_HEAD_NAMES, deduplicate_tied  # noqa: F401  (re-exported)


@dataclass
class StateInfo:
    """Where a state dict came from and what was done to it while loading."""

    spec: str
    directory: str
    tied_embeddings: bool
    stored_dtypes: list[str] = field(default_factory=list)
    num_tensors: int = 0
    num_params: int = 0

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _weights_dir(spec: str) -> Path:
    location = models.local_dir(spec)
    path = Path(location)
    if path.is_dir():
        return path
    try:  # a hub id: only a warm local HF cache will do (no network here)
        from huggingface_hub import snapshot_download  # local: only hub ids need it (a transformers dependency)

        return Path(snapshot_download(location, local_files_only=True))
    except Exception:
        raise UserError(f"no local weights for '{spec}'; pass a model directory, a run directory or an embedded model name") from None


def _safetensors_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / s for s in shards]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise UserError(f"{directory} has no .safetensors weights; re-save the model with save_pretrained(safe_serialization=True)")
    return files


def load_state_info(spec: str) -> tuple[dict, StateInfo]:
    """``(state, info)``: the float32 CPU state dict of ``spec`` (tied tensors once) and how it was read."""
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    directory = _weights_dir(str(spec))
    state: dict[str, torch.Tensor] = {}
    dtypes: set[str] = set()
    with unreadable_as_user_error(str(spec)):
        for f in _safetensors_files(directory):
            with safe_open(str(f), framework="pt") as reader:
                for name in reader.keys():
                    t = reader.get_tensor(name)
                    dtypes.add(str(t.dtype).replace("torch.", ""))
                    state[name] = t.to(torch.float32)
        config = {}
        if (directory / "config.json").exists():
            config = json.loads((directory / "config.json").read_text())
    tie_flag = config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", True))
    state, aliases = deduplicate_tied(state, by_value=bool(tie_flag))
    has_embedding = any(n in state for n in EMBEDDING_NAMES)
    tied = bool(aliases) or (has_embedding and not any(n in state for n in LM_HEAD_NAMES) and bool(tie_flag))
    info = StateInfo(spec=str(spec), directory=str(directory), tied_embeddings=tied, stored_dtypes=sorted(dtypes),
                     num_tensors=len(state), num_params=sum(t.numel() for t in state.values()))
    return state, info


def load_state(spec: str) -> dict:
    """The float32 CPU state dict of a model spec or run directory, tied tensors counted once."""
    return load_state_info(spec)[0]


def check_compatible(base: dict, trained: dict) -> None:
    """Raise a one-line UserError unless both state dicts have the same names and shapes."""
    missing, extra = sorted(set(base) - set(trained)), sorted(set(trained) - set(base))
    if missing or extra:
        raise UserError(f"the two models have different parameters (only in base: {missing[:3]}, only in trained: "
                        f"{extra[:3]}); compare checkpoints of the same architecture")
    bad = [n for n in base if tuple(base[n].shape) != tuple(trained[n].shape)]
    if bad:
        raise UserError(f"parameter {bad[0]} has shape {tuple(base[bad[0]].shape)} in base but "
                        f"{tuple(trained[bad[0]].shape)} in trained; compare checkpoints of the same architecture")


def load_into_model(model, state: dict) -> None:
    """Copy ``state`` into ``model``'s tensors in place; names must match except for tied aliases."""
    import torch  # local: torch is slow to import, and `evolm --help` imports this module

    own = model.state_dict()
    param_names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    groups: dict[tuple, list[str]] = {}
    for name, t in own.items():
        groups.setdefault((t.data_ptr(), tuple(t.shape)), []).append(name)
    missing, extra = [], sorted(set(state) - set(own))
    if extra:
        raise UserError(f"weights {extra[:3]} are not parameters of the model; use the base model of the same architecture")
    with torch.no_grad():
        for key, names in groups.items():
            given = [n for n in names if n in state]
            if not given:
                missing += [n for n in names if n in param_names]  # absent buffers keep their values
                continue
            if len(given) > 1 and not all(torch.equal(state[given[0]], state[g]) for g in given[1:]):
                raise UserError(f"{given} are tied in the model but differ in the weights; load a model with untied embeddings")
            own[names[0]].copy_(state[given[0]].to(own[names[0]].dtype))
    if missing:
        raise UserError(f"weights for {missing[:3]} are missing; the weights do not belong to this model's architecture")


# -- the base a run started from ----------------------------------------------------------------------

def run_info(spec: str) -> dict | None:
    """The ``run.json`` of an evolm run directory, None when ``spec`` is not one."""
    path = Path(str(spec))
    if not (path / "run.json").exists():
        return None
    return RunDir(path).info()


def recorded_base(spec: str) -> dict | None:
    """What a run directory's ``run.json`` records about its starting weights (``base``), None when absent."""
    info = run_info(spec)
    return (info or {}).get("base")


def run_base_spec(spec: str) -> str | None:
    """The spec that loads the weights run directory ``spec`` started from: ``<run>/<base.path>`` when evolm
    knows where they are (a lower-precision run's saved ``base/``, a pipeline stage's predecessor), else
    the recorded or configured ``[model] spec``; None when ``spec`` is not a run directory."""
    info = run_info(spec)
    if info is None:
        return None
    base = info.get("base") or {}
    if base.get("path"):
        return os.path.normpath(str(Path(str(spec)) / base["path"]))
    return base.get("spec") or RunDir(Path(str(spec))).config().get("model", {}).get("spec")


def trained_scope(spec: str) -> list[str] | None:
    """The tensors a run trained: an ES run's perturbed parameters (its seed-log header), else None (all)."""
    path = Path(str(spec))
    if not (path / "seed_log.jsonl").exists():
        return None
    header = next((r for r in RunDir(path).seed_log() if r.get("kind") == "header"), None)
    return list(header["params"]) if header and header.get("params") else None


def check_base(label: str, trained_spec: str, base_spec: str, fingerprint: str, allow_mismatch: bool = False) -> dict:
    """``{"spec", "fingerprint", "recorded", "check"}`` for the base ``base_spec`` (content ``fingerprint``) of
    the trained model ``label`` (``trained_spec``). ``check`` is ``"matches"`` (the recorded fingerprint),
    ``"unrecorded"`` (not a run directory, or one written before runs recorded their base) or
    ``"mismatch allowed"``; a mismatch is a one-line ``UserError`` unless ``allow_mismatch``."""
    record = recorded_base(trained_spec)
    out = {"spec": str(base_spec), "fingerprint": fingerprint, "recorded": record, "check": "unrecorded"}
    if not record or not record.get("fingerprint"):
        return out
    if record["fingerprint"] == fingerprint:
        out["check"] = "matches"
        return out
    if allow_mismatch:
        out["check"] = "mismatch allowed"
        return out
    own = run_base_spec(trained_spec)
    why = f" (the run rounded its weights to {'/'.join(record['rounded_to'])})" if record.get("rounded_to") else ""
    raise UserError(f"the base {base_spec} is not the weights '{label}' ({trained_spec}) started from: fingerprint "
                    f"{fingerprint[:12]} vs {record['fingerprint'][:12]} in its run.json{why}; omit --base to compare "
                    f"with the run's own base ({own}), or pass --allow-base-mismatch to compare anyway")
