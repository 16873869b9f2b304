"""Experiment trackers: every metrics record a run writes, streamed to TensorBoard and wandb.

``run.report_to = ["tensorboard", "wandb"]`` opens one tracker run per evolm run, named after the run
directory, with the resolved config; every record appended to ``metrics.jsonl`` (training updates,
probes, before/after evaluations) is sent to it at once.

Design decisions:

- One place feeds them: ``RunDir.log_metrics`` calls the run's listeners after a record is on disk,
  and ``jobs.tracking`` attaches a ``Trackers`` object there for the run's lifetime (ES, GRPO). A
  pipeline rebuilds its stream from its stages (``pipeline.write_combined``) and hands every record
  to the same listener, which sends each record once (``once=True``: keyed by kind, step, label and
  stage), so a pipeline is one tracker run on the global update axis; its stages open none. Sweep
  points are ordinary runs, grouped under the sweep's directory name (wandb ``group``;
  ``tensorboard --logdir SWEEP_DIR`` shows every point).
- ``metrics.jsonl`` stays the source of truth and trackers are a view of it: a tracker that raises is
  closed with one warning line and the run goes on; nothing a run computes depends on them.
- What is sent: the finite numeric fields of each record (not ``step``; booleans, strings, lists and
  None are skipped) as ``<kind>/<field>`` (``train/reward_mean``, ``probe/pass@8``, ``eval/greedy``)
  at x = the record's ``step`` (updates done). GRPO's TRL metrics arrive in evolm's GRPO records
  (loss, grad_norm, kl, ...); TRL's own ``report_to`` stays "none", so nothing is logged twice.
- Names and configs: the tracker run is named after the run directory (a sweep point
  ``<sweep>/<point>``), tagged with the job kind, and carries the resolved config (TensorBoard: the
  TOML as text ``config``; wandb: ``config``).
- Resume: TensorBoard purges events after the resume point (``SummaryWriter(purge_step=...)``), so
  re-run updates replace the lost ones; wandb resumes the same run id (kept in ``run.json``) and
  plots against its own ``update`` axis (``define_metric``), so a re-logged step never trips wandb's
  monotonic step counter.
- Where: TensorBoard ``RUN_DIR/tensorboard/``; wandb ``RUN_DIR/wandb/`` (offline by default: no
  network; ``wandb sync RUN_DIR/wandb/offline-run-*`` uploads later).
- Not MLflow or trackio (yet): MLflow 3 keeps its file store in maintenance mode (it refuses to open
  one unless told to) and its SQLite store needs SQLAlchemy and Alembic; trackio was not tried. A
  tracker is one small class here (``log``, ``close``, ``info``).
- The packages are optional (``pip install 'evolm[trackers]'``) and imported only when a tracker
  opens; ``check`` names a missing one in one line before the run directory is created.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Iterable

from evolm.errors import UserError

PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}
"""The Python package each tracker needs (all in the ``trackers`` extra)."""


def check(names: Iterable[str]) -> None:
    """A one-line ``UserError`` naming the install command when a tracker's package is missing."""
    missing = [PACKAGES[n] for n in names if importlib.util.find_spec(PACKAGES[n]) is None]
    if missing:
        raise UserError(f"run.report_to needs {', '.join(missing)}, which is not installed: pip install 'evolm[trackers]' "
                        f"(or pip install {' '.join(missing)}), or drop it from run.report_to")


def scalars(record: dict) -> dict[str, float]:
    """The record's finite numeric fields as ``{"<kind>/<field>": value}`` (pure; ``step`` left out)."""
    kind = record.get("kind", "train")
    out = {}
    for key, value in record.items():
        if key in ("step", "kind") or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(float(value)):
            out[f"{kind}/{key}"] = float(value)
    return out


def record_key(record: dict) -> str:
    """What makes a record unique in a stream: kind, step, label and stage."""
    return json.dumps([record.get("kind", "train"), record.get("step"), record.get("label"), record.get("stage")])


# -- the trackers --------------------------------------------------------------------------------------


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, run_path: Path, title: str, kind: str, config_toml: str, resume_step: int | None, **_):
        from torch.utils.tensorboard import SummaryWriter  # optional: the `trackers` extra (tensorboard)

        self.dir = run_path / "tensorboard"
        self.writer = SummaryWriter(str(self.dir), purge_step=resume_step + 1 if resume_step is not None else None)
        if resume_step is None:
            self.writer.add_text("config", "    " + config_toml.replace("\n", "\n    "), 0)
            self.writer.add_text("run", f"{title} ({kind} run, `{run_path}`)", 0)
            self.writer.flush()

    def log(self, step: int, values: dict[str, float]) -> None:
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self, status: str) -> None:
        self.writer.close()

    def info(self) -> dict:
        return {"dir": str(self.dir)}


class _Wandb:
    name = "wandb"

    def __init__(self, run_path: Path, title: str, kind: str, config: dict, group: str | None, project: str,
                 mode: str, previous: dict, **_):
        import wandb  # optional: the `trackers` extra

        settings = wandb.Settings(console="off", silent=True, x_disable_stats=True)
        self.run = wandb.init(project=project, name=title, group=group, job_type=kind, config=config, dir=str(run_path),
                              mode=mode, id=previous.get("id"), resume="allow" if previous.get("id") else None,
                              reinit="create_new", settings=settings)
        self.run.define_metric("update")
        self.run.define_metric("*", step_metric="update")

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log({"update": step, **values})

    def close(self, status: str) -> None:
        self.run.finish(exit_code=0 if status == "finished" else 1)

    def info(self) -> dict:
        return {"id": self.run.id, "dir": str(Path(self.run.dir).parent)}


_CLASSES = {"tensorboard": _TensorBoard, "wandb": _Wandb}


class Trackers:
    """The open trackers of one run; call it with a record (``RunDir.listeners``) to send it."""

    def __init__(self, trackers: list, once: bool = False, sent: Iterable[str] = ()):
        self.trackers = trackers
        self.once = once
        self.sent = set(sent)

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def __call__(self, record: dict) -> None:
        if not self.trackers:
            return
        if self.once:
            key = record_key(record)
            if key in self.sent:
                return
            self.sent.add(key)
        values = scalars(record)
        if not values or record.get("step") is None:
            return
        for tracker in list(self.trackers):
            try:
                tracker.log(int(record["step"]), values)
            except Exception as e:  # a tracker is a view: it must not stop the run
                self._drop(tracker, e)

    def _drop(self, tracker, error: Exception) -> None:
        print(f"evolm: warning: the {tracker.name} tracker failed ({type(error).__name__}: {error}); it is closed and "
              "the run goes on (metrics.jsonl keeps every record)", file=sys.stderr)
        self.trackers.remove(tracker)
        try:
            tracker.close("failed")
        except Exception:
            pass

    def info(self) -> dict:
        return {t.name: t.info() for t in self.trackers}

    def close(self, status: str = "finished") -> None:
        for tracker in list(self.trackers):
            try:
                tracker.close(status)
            except Exception as e:
                print(f"evolm: warning: closing the {tracker.name} tracker failed ({type(e).__name__}: {e})", file=sys.stderr)
        self.trackers = []


def open_trackers(names: Iterable[str], run_path: str | Path, *, kind: str, config: dict, config_toml: str,
                  project: str = "evolm", wandb_mode: str = "offline", previous: dict | None = None,
                  resume_step: int | None = None, once: bool = False, sent: Iterable[str] = ()) -> Trackers:
    """Open the trackers ``names`` for the run directory ``run_path``.

    ``previous``: what ``Trackers.info()`` returned when the run was first opened (``run.json``), to
    resume the same tracker runs; ``resume_step``: the step a resumed run continues from (TensorBoard
    purges later events); ``once``/``sent``: send each record key once, ``sent`` already sent
    (pipelines).
    """
    names = list(names)
    check(names)
    run_path = Path(run_path)
    group = run_path.parent.name if (run_path.parent / "sweep.json").exists() else None
    title = f"{group}/{run_path.name}" if group else run_path.name
    previous = previous or {}
    opened = []
    try:
        for name in names:
            opened.append(_CLASSES[name](run_path=run_path, title=title, kind=kind, config=config, config_toml=config_toml,
                                         group=group, project=project, mode=wandb_mode, previous=previous.get(name) or {},
                                         resume_step=resume_step))
    except Exception as e:
        Trackers(opened).close("failed")
        raise UserError(f"could not open the {name} tracker ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}); "
                        f"fix it or drop '{name}' from run.report_to (e.g. --set run.report_to=[])") from e
    return Trackers(opened, once=once, sent=sent)


__all__ = ["Trackers", "open_trackers", "check", "scalars", "record_key", "PACKAGES"]
