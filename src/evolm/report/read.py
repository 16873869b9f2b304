"""What ``evolm report`` reads: its inputs classified (runs, sweeps, eval outputs, analysis outputs)
and read, with every file it read recorded.

Design decisions:

- An input path is recognised by its files: ``sweep.json`` -> an ``evolm sweep`` directory (its
  points are run directories, summarised by ``evolm.sweep.summarize_sweep``); ``run.json`` -> a run
  (``kind`` es, grpo, pipeline; a directory of runs, e.g. a pipeline sweep, is taken run by run);
  ``eval.json`` -> an ``evolm eval`` output; ``<kind>.json`` for a kind in ``ANALYSIS_KINDS`` -> an
  ``evolm analyze`` output. A run directory's ``eval/`` (one directory per ``evolm eval`` invocation,
  ``eval/<time>-<tasks>/``, and an older ``eval/eval.json``) and ``analysis/`` are read too.
- Run directories are read only through the ``RunDir`` read side (``info()``, ``config()``,
  ``train_records()``, ``probes()``, ``evaluation(label)``), so the report keeps the same record per
  step as every other reader (the last one logged) and treats a record without ``kind`` the same.
- One ``Reader`` records each file read (in order, once); the report ends with that list. A file
  that does not parse is one ``evolm: error:`` line naming it.
- Inputs are read once by resolved path: a run's ``eval/`` or ``analysis/`` given beside the run (or
  the same directory twice under two spellings) adds nothing twice.
- Labels are short and stable: ``--label NAME=PATH`` names an input; otherwise a run is named by its
  method (es, grpo, pipeline), with the directory name added when two runs share a method; a run's
  evaluations are "<run> eval" (plus the model's name when it is not the run's own weights) and its
  analyses carry the run's label; an eval or analysis directory given on its own is named by its
  directory.
- Colours: one per run, in input order, used for everything of that run in every figure
  (``assign_colors``): trained curve solid, its base dashed, its evaluations dash-dotted.
"""

from __future__ import annotations

import json
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from evolm.document import COLORS
from evolm.errors import ConfigError, UserError
from evolm.markdown import shown_path
from evolm.runs import RunDir
from evolm.sweep import summarize_sweep

ANALYSIS_KINDS = ("drift", "sparsity", "localisation", "compression", "diversity", "update_variance")
"""The ``evolm analyze`` outputs a report reads (``<kind>.json``), in the order their sections appear."""

RUN_KINDS = ("es", "grpo", "pipeline")

T = TypeVar("T")


class Reader:
    """Reads input files and remembers every file it read (in order, once)."""

    def __init__(self):
        self.files: list[str] = []

    def note(self, paths) -> None:
        for p in paths:
            shown = shown_path(p)  # relative to the working directory when inside it
            if shown not in self.files:
                self.files.append(shown)

    def read(self, path: Path, read: Callable[[], T]) -> T:
        """``read()`` (e.g. a ``RunDir`` reader of ``path``); ``path`` is noted when it exists, and a file
        that does not parse is a ``UserError`` naming it."""
        try:
            value = read()
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"{path} is not valid JSON: {e}") from None
        if path.exists():
            self.note([path])
        return value

    def json(self, path: Path) -> Any:
        return self.read(path, lambda: json.loads(path.read_text()))


@dataclass
class Run:
    label: str
    path: Path
    kind: str
    info: dict
    config: dict
    train: list[dict]
    """Training records, one per step (``RunDir.train_records``)."""
    probes: list[dict]
    """Probe records, one per step (``RunDir.probes``)."""
    eval_before: dict | None = None
    eval_after: dict | None = None

    @property
    def method(self) -> str:
        return self.kind if self.kind in RUN_KINDS else self.info.get("method", self.kind)


@dataclass
class Sources:
    runs: list[Run] = field(default_factory=list)
    sweeps: list[tuple[str, Path, dict]] = field(default_factory=list)
    evals: list[tuple[str, Path, dict]] = field(default_factory=list)
    analyses: dict[str, list[tuple[str, Path, dict]]] = field(default_factory=dict)
    """``{kind: [(label, directory, result), ...]}``."""
    colors: dict[str, str] = field(default_factory=dict)
    """Label -> colour: one per run, the same in every figure (``assign_colors``)."""

    def color(self, label: str) -> str:
        return self.colors.get(label) or COLORS[zlib.crc32(label.encode()) % len(COLORS)]


def read_run(path: Path, label: str | None, reader: Reader) -> Run:
    run = RunDir(path)
    info = reader.read(path / "run.json", run.info)
    config = reader.read(run.config_path, run.config)
    train = reader.read(run.metrics_path, run.train_records)
    probes = reader.read(run.metrics_path, run.probes)
    before = reader.read(path / "eval_before.json", lambda: run.evaluation("before"))
    after = reader.read(path / "eval_after.json", lambda: run.evaluation("after"))
    return Run(label or "", path, str(info.get("kind", "run")), info, config, train, probes, before, after)


def read_sweep(path: Path, reader: Reader) -> dict:
    """The sweep summary recomputed from the points' run directories (``evolm.sweep.summarize_sweep``)."""
    summary = summarize_sweep(path)
    reader.note(summary.pop("sources"))
    return summary


def _eval_dirs(path: Path) -> list[Path]:
    """A run's ``evolm eval`` outputs: one directory per invocation under ``RUN_DIR/eval/`` (in name, i.e.
    time, order)."""
    return sorted(p for p in path.iterdir() if (p / "eval.json").exists()) if path.is_dir() else []


def _analysis_files(path: Path) -> list[Path]:
    return [path / f"{k}.json" for k in ANALYSIS_KINDS if (path / f"{k}.json").exists()]


def gather(paths: list[str], labels: dict[str, str], reader: Reader) -> Sources:
    """Classify and read every input path (see the module docstring). Directories are read once, by
    resolved path: a run's ``eval/`` and ``analysis/`` given again (or before the run) are not read twice."""
    src = Sources()
    given = {str(Path(p).resolve()): labels.get(str(Path(p).resolve())) for p in paths}
    seen: set[Path] = set()  # directories whose eval.json / <kind>.json were read
    pending: list[tuple[str, Run | None, str | None, Path, Any]] = []  # (what, owner run, label, dir, data)
    for resolved, label in given.items():
        path = Path(resolved)
        if not path.is_dir():
            raise UserError(f"{path} is not a directory; pass run, sweep, eval or analysis directories")
        shown = Path(next(p for p in paths if str(Path(p).resolve()) == resolved))
        found, owner = False, None
        if (path / "sweep.json").exists():
            src.sweeps.append((label or shown.name, shown, read_sweep(path, reader)))
            continue
        if (path / "run.json").exists():
            info = reader.read(path / "run.json", RunDir(path).info)
            if info.get("kind") in RUN_KINDS or (path / "metrics.jsonl").exists():
                owner = read_run(path, label, reader)
                src.runs.append(owner)
                found = True
            else:  # a directory of runs (e.g. a pipeline sweep): each child run is an input
                for child in sorted(p for p in path.iterdir() if (p / "run.json").exists()):
                    src.runs.append(read_run(child, f"{label or path.name}/{child.name}", reader))
                    found = True
        subdirs = [path] + ([path / "eval", *_eval_dirs(path / "eval"), path / "analysis"] if owner else [])
        for d in subdirs:
            if d.resolve() in seen:
                found = True
                continue
            own = label if d == path else None  # a run's eval/ and analysis/ are named after the run
            if (d / "eval.json").exists():
                pending.append(("eval", owner, own, d, reader.json(d / "eval.json")))
                seen.add(d.resolve())
                found = True
            for f in _analysis_files(d):
                pending.append((f.stem, owner, own, d, reader.json(f)))
                seen.add(d.resolve())
                found = True
        if not found:
            raise UserError(f"{shown} is not a run, sweep, eval or analysis directory (no run.json, sweep.json, "
                            f"eval.json or {'/'.join(k + '.json' for k in ANALYSIS_KINDS[:2])}...)")
    name_runs(src.runs)
    runs_at = {r.path.resolve(): r for r in src.runs}
    pending = [(what, owner or runs_at.get(d.resolve().parent) or runs_at.get(d.resolve().parent.parent), label, d, data)
               for what, owner, label, d, data in pending]  # RUN/analysis given on its own still belongs to RUN
    evals_of: dict[int, list] = {}
    for what, owner, label, d, data in pending:
        if what == "eval" and owner is not None:
            evals_of.setdefault(id(owner), []).append(d)
    for what, owner, label, d, data in pending:
        if what == "eval":
            src.evals.append((eval_label(owner, label, d, data, len(evals_of.get(id(owner), []))), d, data))
        else:
            src.analyses.setdefault(what, []).append((label or (owner.label if owner else d.name), d, data))
    src.colors = assign_colors(src)
    return src


def eval_label(owner: Run | None, label: str | None, directory: Path, report: dict, siblings: int) -> str:
    """A short label for an ``evolm eval`` output: its run's label + "eval" (+ the model's name when it is
    not the run's own weights), or ``--label`` / the directory name for an eval given on its own."""
    if label or owner is None:
        return label or directory.name
    spec = str((report.get("model") or {}).get("spec") or "")
    own = not spec or Path(spec).expanduser().resolve() in (owner.path.resolve(), (owner.path / "final").resolve())
    name = f"{owner.label} eval" + ("" if own else f" ({Path(spec).name or spec})")
    like = (report.get("settings") or {}).get("like")
    return name + (" --like" if like and siblings > 1 else "")


def assign_colors(src: Sources) -> dict[str, str]:
    """One colour per run (in input order), shared by everything of that run in every figure: its trained
    curve, its base (dashed), its evaluations and probes; then one per eval given on its own."""
    colors: dict[str, str] = {}
    for run in src.runs:
        colors.setdefault(run.label, COLORS[len(colors) % len(COLORS)])
    for label, _, _ in src.evals:
        owner = next((r for r in src.runs if label.startswith(f"{r.label} eval")), None)
        colors.setdefault(label, colors[owner.label] if owner else COLORS[len(colors) % len(COLORS)])
    return colors


def name_runs(runs: list[Run]) -> None:
    """Label the runs without a ``--label``: their method, plus the directory name when two share one."""
    counts: dict[str, int] = {}
    for r in runs:
        counts[r.method] = counts.get(r.method, 0) + 1
    for r in runs:
        if not r.label:
            r.label = r.method if counts[r.method] == 1 else f"{r.method} ({r.path.name})"
