"""Run directories: everything a run computes lands here, written atomically, so it can resume.

Layout of ``runs/<name>/`` (the same for ES, GRPO and pipeline stages)::

    config.toml          the resolved config (defaults filled in): the run as it stands now
    config_history.jsonl the config at creation and every resume, with the fields the resume changed
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
- Every JSON file is strict JSON (RFC 8259, readable by any parser): NaN and infinities are written
  as null (``to_json``); files written before that, with bare NaN, still read.
- What a kill leaves behind is cleaned on resume (``clean_temporaries``): half-written temporary files
  and directories are removed, and a ``final/`` or checkpoint caught between its two renames is put
  back from its ``.old`` copy. The two renames run with SIGINT/SIGTERM blocked.
- ``run.json`` records the writing process (host, pid, start time), so a resume refuses a run another
  live process is still writing, and a run that failed before computing anything can be created
  again under the same name. A ``run.json`` update that finds the disk full rewrites the file in
  place (it fits in its own blocks), so a run stopped by a full disk still says so.
- Weights are saved as ``save_pretrained`` lays them out (safetensors, tied weights handled, Hugging Face
  names), never in a backend's internal (e.g. fused vLLM) naming, but written tensor by tensor
  (``evolm.streamsave``): a save holds one tensor beyond the steady state, never a copy of the model
  (the float32 masters of a lower-precision run are written in place of its tensors); ``final/``
  optionally in bfloat16 (``run.save_dtype``). Every file and directory a run writes gets the usual permissions under the
  umask (0644 / 0755 under umask 022), although ``mkstemp``/``mkdtemp`` and safetensors create them
  private, so a colleague can read the models.
- ``run.save``: ``all`` (checkpoints + ``final/``), ``final`` or ``none``; a run that saved no weights
  says so in ``run.json`` (``weights = "none"``) and counts as finished without ``final/``.
- ``listeners`` receive every record ``log_metrics`` appends (``evolm.trackers``), after it is on disk.
- One read side for every consumer (report, sweep, pipeline, plots, demo): ``RunDir.state()``
  (absent / started / finished), ``train_records()`` and ``probes()`` (one record per step, the last
  one logged winning; a record without ``kind`` is a training record), ``evaluation(label)``
  (``eval_<label>.json``), ``config()``.
- One training-record schema for every method (``train_record``): the same reward statistics (None
  when no reward is finite), cost fields, running totals and peak memory for ES and GRPO.
"""

from __future__ import annotations

import errno
import json
import math
import os
import platform
import re
import resource
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from evolm import __version__
from evolm.errors import UserError
from evolm.models import quiet_transformers, unreadable_as_user_error


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
    atomic_write_text(path, to_json(obj, indent=2) + "\n")


def atomic_write_jsonl(path: str | Path, records: Sequence[dict]) -> None:
    """Replace a JSONL file with ``records`` in one atomic step."""
    atomic_write_text(path, "".join(to_json(r) + "\n" for r in records))


def to_json(obj: Any, **kwargs: Any) -> str:
    """``obj`` as strict JSON: NaN and infinities (Python, NumPy or torch) become null, because
    ``json.dumps``' bare ``NaN`` is not JSON (JavaScript's ``JSON.parse`` and many parsers reject it)."""
    try:
        return json.dumps(obj, default=json_default, allow_nan=False, **kwargs)
    except ValueError:
        return json.dumps(finite_or_none(obj), default=json_default, allow_nan=False, **kwargs)


def finite_or_none(obj: Any) -> Any:
    """A copy of ``obj`` (dicts, lists, numbers, arrays) with every non-finite float replaced by None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    if not isinstance(obj, (str, int, bool, type(None))) and (hasattr(obj, "tolist") or hasattr(obj, "item")):
        return finite_or_none(json_default(obj))
    return obj


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
    """Append one record and fsync; a torn last line (a kill mid-write) is ended first, not glued onto."""
    with open(path, "a+b") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write((to_json(record) + "\n").encode())
        f.flush()
        os.fsync(f.fileno())


# -- who is writing a run ------------------------------------------------------------------------------

def _process_start(pid: int) -> str | None:
    """The start time of live process ``pid`` (Linux ``/proc``), which tells it from a later process
    that reused its pid; None when there is no such process, it is a zombie, or it cannot be known."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[19] if len(fields) > 19 and fields[0] not in ("Z", "X") else None


def this_process() -> dict:
    """``{"host", "pid", "pid_start"}`` of this process, recorded in ``run.json`` by whoever writes the run."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "pid_start": _process_start(os.getpid())}


def writer_alive(info: dict) -> bool:
    """Whether the process ``run.json`` names as its writer is still running (on this host; False when
    it cannot be known, e.g. another host, no pid recorded, or not Linux)."""
    pid, start = info.get("pid"), info.get("pid_start")
    if not pid or info.get("host") != socket.gethostname() or int(pid) == os.getpid() or start is None:
        return False
    return _process_start(int(pid)) == start


TEMPORARY = re.compile(r"^\.(?P<name>[^.].*)\.(?P<tag>old|[a-z0-9_]{8})$")
"""Names of the temporaries atomic writes create (``tempfile``'s ``.<name>.XXXXXXXX``) and of the
``.<name>.old`` copy a directory swap keeps for a moment."""

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("torch", "transformers", "trl", "numpy"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    out["evolm"] = __version__
    return out


RECORD_ENV = "EVOLM_RECORD_FILES"
"""Environment variable: ``os.pathsep``-separated files whose sha256 a new run records in ``run.json`` under
``recorded`` at its start (the reproduction study sets it to its claims file, so each run says which
declaration of its tests existed when it began: pre-registration the study loader can check)."""


def recorded_files() -> dict[str, dict]:
    """``{path: {"sha256", "bytes"}}`` of the files ``$EVOLM_RECORD_FILES`` names ({} when unset); a named file that
    does not exist is a ``UserError`` (a declaration that is not there cannot be recorded)."""
    import hashlib

    out = {}
    for name in filter(None, os.environ.get(RECORD_ENV, "").split(os.pathsep)):
        try:
            data = Path(name).read_bytes()
        except OSError as e:
            raise UserError(f"{RECORD_ENV} names {name}, which cannot be read ({e.strerror}); fix the path or unset "
                            f"{RECORD_ENV}") from None
        out[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    return out


class RunDir:
    """A run directory on disk. Create one with ``RunDir.create`` or reopen one with ``RunDir.open``."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.listeners: list[Callable[[dict], None]] = []
        """Called with every record ``log_metrics`` appends, after it is on disk (experiment trackers)."""

    # -- creation ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, out_dir: str | Path, name: str, config_toml: str, kind: str, info: dict | None = None,
               exist_ok: bool = False) -> "RunDir":
        """Create ``out_dir/name`` (``{time}`` in the name becomes a timestamp). An existing non-empty
        directory is refused, unless it holds a run that failed before computing anything (then it is
        replaced, so the same command can be run again once its error is fixed)."""
        name = name.replace("{time}", time.strftime("%Y%m%d-%H%M%S"))
        path = Path(out_dir) / name
        recorded = recorded_files()
        try:
            if not exist_ok and cls.check_new(out_dir, name):
                shutil.rmtree(path)
            path.mkdir(parents=True, exist_ok=True)
            run = cls(path)
            atomic_write_text(path / "config.toml", config_toml)
            atomic_write_json(path / "run.json", {"kind": kind, "status": "running", "started": time.time(),
                                                   "versions": _versions(), **this_process(),
                                                   **({"recorded": recorded} if recorded else {}), **(info or {})})
        except PermissionError as e:
            raise UserError(f"cannot create the run directory {path}: permission denied ({e.filename}); "
                            "choose a writable run.out_dir") from None
        except OSError as e:
            if e.errno in (errno.EROFS, errno.EACCES, *DISK_FULL):
                raise UserError(f"cannot create the run directory {path}: {e.strerror}; choose another run.out_dir "
                                "or free space") from None
            raise
        return run

    @classmethod
    def check_new(cls, out_dir: str | Path, name: str) -> bool:
        """Refuse (one line) a new run at ``out_dir/name`` where a run directory with work in it exists; True
        when a run that failed before computing anything is there (``create`` replaces it). Cheap: the jobs
        call it right after the config is read, before anything loads."""
        path = Path(out_dir) / name
        if "{time}" in name or not path.is_dir() or not any(path.iterdir()):
            return False
        if not cls(path).failed_before_computing():
            raise UserError(f"run directory {path} already exists; pass --resume to continue it or choose "
                            "another run.name")
        return True

    def failed_before_computing(self) -> bool:
        """A run that stopped (failed or interrupted) before it computed anything: no metrics record,
        no checkpoint, no final weights, no evaluation file. Safe to replace."""
        try:
            info = self.info()
        except ValueError:
            return False
        if info.get("status") not in ("failed", "interrupted"):
            return False
        computed = (self.metrics() or self.checkpoints() or (self.path / "final").exists()
                    or any(self.path.glob("eval_*.json")) or (self.path / "stages").exists())
        return not computed

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
        """Merge ``fields`` into ``run.json`` (atomically; in place when the disk is full)."""
        text = to_json({**self.info(), **fields}, indent=2) + "\n"
        try:
            atomic_write_text(self.path / "run.json", text)
        except OSError as e:
            if e.errno not in DISK_FULL:
                raise
            with open(self.path / "run.json", "r+") as f:  # no new blocks needed for a file this small
                f.write(text)
                f.truncate()
                f.flush()
                os.fsync(f.fileno())

    def log_metrics(self, record: dict) -> None:
        append_jsonl(self.metrics_path, record)
        for listener in self.listeners:
            listener(record)

    def log_seed(self, record: dict) -> None:
        append_jsonl(self.seed_log_path, record)

    def metrics(self) -> list[dict]:
        return read_jsonl(self.metrics_path)

    def seed_log(self) -> list[dict]:
        return read_jsonl(self.seed_log_path)

    # -- reading -----------------------------------------------------------------------------------
    def state(self) -> str:
        """``absent`` (no ``run.json`` or ``config.toml``: nothing to resume), ``finished`` (``run.json``
        says finished and ``final/`` is complete, or the run saved no weights: ``weights = "none"``) or
        ``started`` (anything in between: resumable)."""
        if not self.config_path.exists() or not (self.path / "run.json").exists():
            return "absent"
        try:
            info = self.info()
        except ValueError:  # a torn run.json cannot happen (atomic writes) but must not crash a sweep
            return "started"
        weights = (self.path / "final" / "config.json").exists() or info.get("weights") == "none"
        return "finished" if info.get("status") == "finished" and weights else "started"

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

    # -- resume ------------------------------------------------------------------------------------
    @property
    def config_history_path(self) -> Path:
        return self.path / "config_history.jsonl"

    def config_history(self) -> list[dict]:
        """The config at creation and at every resume (``event``, ``step``, ``changes``, ``config``)."""
        return read_jsonl(self.config_history_path)

    def log_config(self, event: str, step: int, config: dict, changes: dict | None = None, **extra: Any) -> None:
        """Record the resolved ``config`` used from ``step`` on (``event``: create or resume) and the fields
        that differ from the config before (``changes``: dotted name -> {"old", "new"})."""
        append_jsonl(self.config_history_path, {"event": event, "step": int(step), "time": time.time(),
                                                "changes": changes or {}, **extra, "config": config})

    def final_state(self) -> dict | None:
        """``final/state.json`` (the step and running totals of the final weights), or None without ``final/``."""
        final = self.path / "final"
        if not ((final / "config.json").exists() and (final / "state.json").exists()):
            return None
        return json.loads((final / "state.json").read_text())

    def clean_temporaries(self) -> list[str]:
        """Undo what a kill left half-done; returns what it did, one line each.

        A ``final/`` or checkpoint directory missing while its ``.<name>.old`` copy exists was caught
        between the two renames of a swap: the copy is renamed back. Every other temporary (``.X.abcd1234``
        files and directories of atomic writes, ``.X.old`` copies) is removed. Looks in the run
        directory, ``checkpoints/``, ``plots/`` and every pipeline stage directory."""
        touched = []
        places = [self.path, self.checkpoint_dir, self.path / "plots"]
        places += sorted(p for p in (self.path / "stages").glob("*") if p.is_dir())
        places += sorted(p / "checkpoints" for p in (self.path / "stages").glob("*") if p.is_dir())
        for place in places:
            if not place.is_dir():
                continue
            for entry in sorted(place.iterdir()):
                m = TEMPORARY.match(entry.name)
                if not m:
                    continue
                original = place / m["name"]
                where = entry.relative_to(self.path)
                if m["tag"] == "old" and entry.is_dir() and not original.exists():
                    os.replace(entry, original)
                    touched.append(f"put back {original.relative_to(self.path)}/ from {where}")
                    continue
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
                touched.append(f"removed {where}")
        return touched

    def truncate_after(self, step: int) -> None:
        """Drop metrics and seed-log records with ``step`` > ``step`` (records without a step are kept)."""
        for p in (self.metrics_path, self.seed_log_path):
            if p.exists():
                keep = [r for r in read_jsonl(p) if r.get("step", 0) <= step]
                atomic_write_jsonl(p, keep)

    def retire_eval_after(self) -> Path | None:
        """Move ``eval_after.json`` to ``eval_after_step<N>.json`` (N: the update it measured) when a resume is
        about to train further: ``eval_after.json`` must always describe the run's final weights, and a run
        extended and then stopped before its new end would otherwise show the old evaluation as its result.
        The old measurement is kept, not deleted. Returns the new path, or None when there was none."""
        path = self.path / "eval_after.json"
        if not path.exists():
            return None
        try:
            step = json.loads(path.read_text()).get("step")
        except (json.JSONDecodeError, AttributeError):
            step = None
        target = self.path / f"eval_after_step{step if isinstance(step, int) else 'unknown'}.json"
        os.replace(path, target)
        return target

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

    def save_final(self, model, tokenizer=None, state: dict | None = None, dtype: str = "float32") -> Path:
        """Write ``final/`` (weights in ``dtype``: float32, or bfloat16 to halve the disk)."""
        save_model_dir(self.path / "final", model, tokenizer, extra={"state.json": state or {}}, dtype=dtype)
        return self.path / "final"

    def finish(self, **fields: Any) -> None:
        self.update_info(status="finished", finished=time.time(), **fields)


def check_finite(model) -> None:
    """Refuse (RuntimeError) to save weights holding inf or NaN: they would replace good weights on disk."""
    import torch

    from evolm.streamsave import ModelWeights

    if isinstance(model, ModelWeights) and model.fetch is not None:  # remote weights: checked as they arrive
        return
    named = model.named_tensors() if isinstance(model, ModelWeights) else model.named_parameters()
    def finite(t, chunk=1 << 20):  # in chunks: isfinite of a whole tensor makes float and bool copies of it
        flat = t.detach().reshape(-1)
        return all(bool(torch.isfinite(flat[a:a + chunk]).all()) for a in range(0, flat.numel(), chunk))

    for name, p in named:
        if p.is_floating_point() and not finite(p):
            raise RuntimeError(f"refusing to save non-finite weights ({name} holds inf or NaN)")


def save_model_dir(target: Path, model, tokenizer, extra: dict[str, Any],
                   write_extra: Callable[[Path], None] | None = None, dtype: str | None = None) -> None:
    """Write a model directory (``save_pretrained`` safetensors in Hugging Face names, the tokenizer,
    JSON files ``extra``, and whatever ``write_extra(tmp)`` adds) and rename it into place atomically.

    ``dtype`` (``"bfloat16"`` ...): store the floating-point weights in that dtype (the model itself is
    not changed). Files and directories get the usual permissions under the umask (``mkdtemp`` creates
    the directory 0700, safetensors its file 0600), so a colleague can read a model.
    Weights with inf or NaN are refused before anything is written."""
    quiet_transformers()
    check_finite(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        os.chmod(tmp, 0o777 & ~_UMASK)
        write_model_weights(tmp, model, dtype)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        for fname, obj in extra.items():
            atomic_write_json(tmp / fname, obj)
        if write_extra is not None:
            write_extra(tmp)
        for path in tmp.rglob("*"):  # safetensors writes 0600 files: give everything the usual permissions
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~_UMASK)
    except Exception as e:  # safetensors (Rust) and torch.save report a full disk as their own errors
        if not isinstance(e, OSError) and (os.strerror(errno.ENOSPC) in str(e) or disk_full(target.parent)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target)) from e
        raise
    else:
        with signals_blocked():  # never leave the swap half done on Ctrl-C / SIGTERM
            if target.exists():
                old = target.with_name(f".{target.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                os.replace(target, old)
                os.replace(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, target)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def disk_full(path: str | Path, below: int = 1 << 20) -> bool:
    """Whether the file system holding ``path`` has less than ``below`` bytes left for this user."""
    try:
        st = os.statvfs(path)
    except (OSError, AttributeError):
        return False
    return st.f_bavail * st.f_frsize < below


class signals_blocked:
    """Defer SIGINT and SIGTERM for the duration of a ``with`` block (main thread, POSIX; else a no-op)."""

    SIGNALS = {signal.SIGINT, signal.SIGTERM}

    def __enter__(self):
        self.old = None
        if hasattr(signal, "pthread_sigmask"):
            try:
                self.old = signal.pthread_sigmask(signal.SIG_BLOCK, self.SIGNALS)
            except (OSError, ValueError):
                self.old = None
        return self

    def __exit__(self, *exc):
        if self.old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, self.old)
        return False


def write_model_weights(directory: Path, model, dtype: str | None = None) -> None:
    """The weights and config of ``model`` (a model, or ``streamsave.ModelWeights``: a model with its float32
    masters in place of its tensors) written tensor by tensor (``evolm.streamsave``: no model-sized copy);
    ``dtype`` (``"bfloat16"`` ...) overrides the stored floating dtype, and ``config.json`` records it, so
    ``model.dtype = "auto"`` loads the weights as stored."""
    import torch  # local: the read side of this module (reports) does not need torch

    from evolm.streamsave import ModelWeights, write_weights

    weights = model if isinstance(model, ModelWeights) else ModelWeights(model)
    target = getattr(torch, dtype) if dtype else weights.dtype
    write_weights(directory, weights.model, weights.replace, target, fetch=weights.fetch, layout=weights.layout)


def load_weights(model, directory: Path) -> None:
    """Load safetensors weights saved by ``save_pretrained`` into ``model`` (tied weights allowed missing)."""
    from safetensors.torch import load_file

    files = sorted(Path(directory).glob("*.safetensors"))
    files = [f for f in files if f.name != "masters.safetensors"]
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {directory}")
    state = {}
    with unreadable_as_user_error(str(directory)):  # a damaged file: one line naming it, not a traceback
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


def _mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and population standard deviation; values beyond 1e100 are scaled down first so squares and
    sums cannot overflow (ordinary rewards take the plain formula, bit for bit)."""
    peak = max(abs(v) for v in values)
    scale = peak if peak > 1e100 else 1.0
    scaled = [v / scale for v in values] if scale != 1.0 else values
    mean = sum(scaled) / len(scaled)
    return mean * scale, math.sqrt(sum((v - mean) ** 2 for v in scaled) / len(scaled)) * scale


def train_record(step: int, method: str, rewards: Sequence[float], *, seconds: float, gen_sequences: int,
                 gen_tokens: int, totals: dict, **extra: Any) -> dict:
    """One ``kind="train"`` metrics record, the same schema for every method.

    ``rewards``: the values whose statistics the record carries (ES: the members' fitness; GRPO: the
    update's rollout rewards); non-finite values are left out and the statistics are None when none is
    finite. ``totals``: running totals after this update (``seconds_total``, ``gen_sequences_total``,
    ``gen_tokens_total``). ``extra``: method-specific fields, appended after the common ones.
    """
    finite = [float(r) for r in rewards if r is not None and math.isfinite(float(r))]
    mean, std = _mean_std(finite) if finite else (None, None)
    record = {
        "step": int(step), "method": method, "kind": "train",
        "reward_mean": mean,
        "reward_std": std,
        "reward_min": min(finite) if finite else None,
        "reward_max": max(finite) if finite else None,
        "seconds": float(seconds), "gen_sequences": int(gen_sequences), "gen_tokens": int(gen_tokens),
    }
    record.update({f"{k}_total": totals[f"{k}_total"] for k in TOTALS if f"{k}_total" in totals})
    record.update(extra)
    record["peak_rss_mb"] = peak_rss_mb()
    return record
