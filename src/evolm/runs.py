"""Run directories: everything a run computes lands here, written atomically, so it can resume.

Layout of ``runs/<name>/`` (the same for ES, GRPO and pipeline stages)::

    config.toml          the resolved config (defaults filled in)
    run.json             kind ("es", "grpo", ...), model spec, status, versions, start/end times
    metrics.jsonl        one JSON object per line; training records carry "step" (updates done)
    seed_log.jsonl       ES only: per update, the member keys and shaped coefficients (replayable)
    checkpoints/step_000010/   model weights (safetensors, Hugging Face names) + state.json
    checkpoints/LATEST   name of the newest complete checkpoint
    final/               the trained model and tokenizer, loadable with from_pretrained
    plots/*.png, eval_*.json, ...

Design decisions:

- Every file is written to a temporary name in the same directory and ``os.replace``d into place;
  checkpoints are whole directories renamed into place, and ``LATEST`` is updated only afterwards, so a
  kill at any moment leaves the previous checkpoint intact and discoverable.
- Appends to JSONL files are flushed and fsynced per record. On resume, records newer than the
  checkpoint are dropped (``truncate_after``) so the resumed stream has no duplicates.
- Weights are saved with ``save_pretrained`` (safetensors, tied weights handled, Hugging Face names),
  never in a backend's internal (e.g. fused vLLM) naming.
- One read side for every consumer (report, sweep, pipeline, plots, demo): ``RunDir.state()``
  (absent / started / finished), ``train_records()`` and ``probes()`` (one record per step, the last
  one logged winning; a record without ``kind`` is a training record), ``evaluation(label)``
  (``eval_<label>.json``), ``config()``.
- One training-record schema for every method (``train_record``): the same reward statistics (None
  when no reward is finite), cost fields, running totals and peak memory for ES and GRPO.
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from evolm import __version__
from evolm.errors import UserError
from evolm.models import quiet_transformers


_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_text(path: str | Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the usual permissions
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=json_default) + "\n")


def atomic_write_jsonl(path: str | Path, records: Sequence[dict]) -> None:
    """Replace a JSONL file with ``records`` in one atomic step."""
    atomic_write_text(path, "".join(json.dumps(r, default=json_default) + "\n" for r in records))


def json_default(o):
    """``json.dumps(default=...)`` for tensors, NumPy values and paths."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "item"):
        return o.item()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_jsonl(path: str | Path) -> list[dict]:
    """All complete records of a JSONL file (a torn last line from a kill is ignored)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


def append_jsonl(path: str | Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record, default=json_default) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "trl", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    out["evolm"] = __version__
    return out


class RunDir:
    """A run directory on disk. Create one with ``RunDir.create`` or reopen one with ``RunDir.open``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    # -- creation ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, out_dir: str | Path, name: str, config_toml: str, kind: str, info: dict | None = None,
               exist_ok: bool = False) -> "RunDir":
        name = name.replace("{time}", time.strftime("%Y%m%d-%H%M%S"))
        path = Path(out_dir) / name
        if path.exists() and any(path.iterdir()) and not exist_ok:
            raise UserError(f"run directory {path} already exists; pass --resume to continue it or choose another run.name")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        atomic_write_text(path / "config.toml", config_toml)
        atomic_write_json(path / "run.json", {"kind": kind, "status": "running", "started": time.time(),
                                               "versions": _versions(), **(info or {})})
        return run

    @classmethod
    def open(cls, path: str | Path) -> "RunDir":
        path = Path(path)
        if not (path / "config.toml").exists():
            raise UserError(f"{path} is not an evolm run directory (no config.toml)")
        return cls(path)

    # -- small files -------------------------------------------------------------------------------
    @property
    def config_path(self) -> Path:
        return self.path / "config.toml"

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def seed_log_path(self) -> Path:
        return self.path / "seed_log.jsonl"

    def info(self) -> dict:
        p = self.path / "run.json"
        return json.loads(p.read_text()) if p.exists() else {}

    def update_info(self, **fields: Any) -> None:
        atomic_write_json(self.path / "run.json", {**self.info(), **fields})

    def log_metrics(self, record: dict) -> None:
        append_jsonl(self.metrics_path, record)

    def log_seed(self, record: dict) -> None:
        append_jsonl(self.seed_log_path, record)

    def metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    def seed_log(self) -> list[dict]:
        return read_jsonl(self.seed_log_path)

    # -- reading -----------------------------------------------------------------------------------
    def state(self) -> str:
        """``absent`` (no ``run.json`` or ``config.toml``: nothing to resume), ``finished`` (``run.json``
        says finished and ``final/`` is complete) or ``started`` (anything in between: resumable)."""
        if not self.config_path.exists() or not (self.path / "run.json").exists():
            return "absent"
        try:
            status = self.info().get("status")
        except ValueError:  # a torn run.json cannot happen (atomic writes) but must not crash a sweep
            return "started"
        return "finished" if status == "finished" and (self.path / "final" / "config.json").exists() else "started"

    def config(self) -> dict:
        """The resolved config as a dict (``config.toml``)."""
        import tomllib

        return tomllib.loads(self.config_path.read_text()) if self.config_path.exists() else {}

    def records(self, kind: str) -> list[dict]:
        """Metrics records of one kind (``train``, ``probe``, ``eval``), one per step, the last one logged
        winning (a resumed run may have logged a step twice), in step order. A record without ``kind``
        is a training record."""
        by_step: dict[int, dict] = {}
        for r in self.metrics():
            if r.get("kind", "train") == kind and "step" in r:
                by_step[int(r["step"])] = r
        return [by_step[s] for s in sorted(by_step)]

    def train_records(self) -> list[dict]:
        return self.records("train")

    def probes(self) -> list[dict]:
        return self.records("probe")

    def evaluation(self, label: str) -> dict | None:
        """The held-out evaluation ``eval_<label>.json`` (``before`` / ``after``), or None."""
        path = self.path / f"eval_{label}.json"
        return json.loads(path.read_text()) if path.exists() else None

    def write_json(self, name: str, obj: Any) -> Path:
        atomic_write_json(self.path / name, obj)
        return self.path / name

    def truncate_after(self, step: int) -> None:
        """Drop metrics and seed-log records with ``step`` > ``step`` (records without a step are kept)."""
        for p in (self.metrics_path, self.seed_log_path):
            if p.exists():
                keep = [r for r in read_jsonl(p) if r.get("step", 0) <= step]
                atomic_write_jsonl(p, keep)

    # -- checkpoints -------------------------------------------------------------------------------
    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def save_checkpoint(self, model, step: int, state: dict, keep: int = 2,
                        write_extra: Callable[[Path], None] | None = None) -> Path:
        """Save the model weights and a state dict for ``step``; keep the newest ``keep`` checkpoints.

        ``write_extra(tmp_dir)``, when given, writes further files (e.g. optimizer state) into the
        checkpoint before it is renamed into place, so they appear atomically with the weights.
        """
        name = f"step_{step:06d}"
        final = self.checkpoint_dir / name
        save_model_dir(final, model, None, extra={"state.json": {"step": step, **state}}, write_extra=write_extra)
        atomic_write_text(self.checkpoint_dir / "LATEST", name + "\n")
        for old in self.checkpoints()[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def checkpoints(self) -> list[Path]:
        if not self.checkpoint_dir.exists():
            return []
        return sorted(p for p in self.checkpoint_dir.iterdir() if p.is_dir() and p.name.startswith("step_"))

    def latest_checkpoint(self) -> tuple[Path, dict] | None:
        """The newest complete checkpoint and its state, or None."""
        pointer = self.checkpoint_dir / "LATEST"
        candidates = []
        if pointer.exists():
            candidates.append(self.checkpoint_dir / pointer.read_text().strip())
        candidates += reversed(self.checkpoints())
        for c in candidates:
            if (c / "state.json").exists() and (c / "config.json").exists():
                return c, json.loads((c / "state.json").read_text())
        return None

    def save_final(self, model, tokenizer=None, state: dict | None = None) -> Path:
        save_model_dir(self.path / "final", model, tokenizer, extra={"state.json": state or {}})
        return self.path / "final"

    def finish(self, **fields: Any) -> None:
        self.update_info(status="finished", finished=time.time(), **fields)


def save_model_dir(target: Path, model, tokenizer, extra: dict[str, Any],
                   write_extra: Callable[[Path], None] | None = None) -> None:
    """Write a model directory (``save_pretrained`` safetensors in Hugging Face names, the tokenizer,
    JSON files ``extra``, and whatever ``write_extra(tmp)`` adds) and rename it into place atomically."""
    quiet_transformers()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for fname, obj in extra.items():
            atomic_write_json(tmp / fname, obj)
        if write_extra is not None:
            write_extra(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_weights(model, directory: Path) -> None:
    """Load safetensors weights saved by ``save_pretrained`` into ``model`` (tied weights allowed missing)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    files = [f for f in files if f.name != "masters.safetensors"]
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {directory}")
    state = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {n for n, p in model.named_parameters(remove_duplicate=False)} - {n for n, p in model.named_parameters()}
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"checkpoint {directory} does not match the model (missing {sorted(set(missing) - tied)[:3]}, "
                           f"unexpected {unexpected[:3]})")


@dataclass
class TrainResult:
    """What a method's training loop hands back to the lifecycle (``jobs.finish_run``)."""

    steps: int
    """Updates done in all (the run's step count)."""
    final_model: object
    """The model whose float32 weights are the run's final weights."""
    totals: dict = field(default_factory=dict)
    """Running totals (``seconds_total``, ``gen_sequences_total``, ``gen_tokens_total``)."""


# -- the training record -------------------------------------------------------------------------------

def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB (Linux reports KiB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


TOTALS = ("seconds", "gen_sequences", "gen_tokens")
"""Per-update cost fields that records also carry as running totals (``<field>_total``)."""

MATCH_FIELDS = {"updates": "step", "sequences": "gen_sequences_total", "tokens": "gen_tokens_total",
                "seconds": "seconds_total"}
"""The quantities runs can be matched on (``run.match``, ``pipeline.match``, ``evolm report --match``) and the
training-record field that holds each one's running total."""


def spent(record: dict, unit: str) -> float:
    """How much of ``unit`` (a ``MATCH_FIELDS`` key) a run had spent by ``record`` (a training record, or
    running totals with ``step``); 0 when the record does not say."""
    return float(record.get(MATCH_FIELDS[unit]) or 0)


def budget_reached(run_cfg, totals: dict, step: int) -> bool:
    """Whether a run with ``run.match`` / ``run.budget`` (``config.RunConfig``) has spent its budget after
    ``step`` updates with running ``totals``; always False for an update budget (the loop's own count)."""
    if run_cfg.match == "updates" or not run_cfg.budget:
        return False
    return spent({**totals, "step": step}, run_cfg.match) >= run_cfg.budget


def train_record(step: int, method: str, rewards: Sequence[float], *, seconds: float, gen_sequences: int,
                 gen_tokens: int, totals: dict, **extra: Any) -> dict:
    """One ``kind="train"`` metrics record, the same schema for every method.

    ``rewards``: the values whose statistics the record carries (ES: the members' fitness; GRPO: the
    update's rollout rewards); non-finite values are left out and the statistics are None when none is
    finite. ``totals``: running totals after this update (``seconds_total``, ``gen_sequences_total``,
    ``gen_tokens_total``). ``extra``: method-specific fields, appended after the common ones.
    """
    finite = [float(r) for r in rewards if r is not None and math.isfinite(float(r))]
    mean = sum(finite) / len(finite) if finite else None
    record = {
        "step": int(step), "method": method, "kind": "train",
        "reward_mean": mean,
        "reward_std": math.sqrt(sum((r - mean) ** 2 for r in finite) / len(finite)) if finite else None,
        "reward_min": min(finite) if finite else None,
        "reward_max": max(finite) if finite else None,
        "seconds": float(seconds), "gen_sequences": int(gen_sequences), "gen_tokens": int(gen_tokens),
    }
    record.update({f"{k}_total": totals[f"{k}_total"] for k in TOTALS if f"{k}_total" in totals})
    record.update(extra)
    record["peak_rss_mb"] = peak_rss_mb()
    return record
