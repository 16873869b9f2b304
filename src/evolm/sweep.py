"""``evolm sweep``: a grid of ES, GRPO or pipeline runs from one base config, resumable, with a summary.

    evolm sweep --config configs/es-arithmetic.toml --grid es.population=8,16,32 --grid es.sigma=0.0005,0.001

Design decisions:

- A grid value is a TOML literal, exactly as ``--set`` takes it (``config.parse_value``); values
  are split at commas outside brackets and quotes, so ``--grid 'es.params=["norm"],["all"]'`` works.
  The points are the Cartesian product of the ``--grid`` options in the order given.
- Each point is an ordinary run directory ``<sweep>/<key=value,...>/`` (name sanitised to
  ``[A-Za-z0-9._=,+-]``), created by the job's own runner with its resolved config, so every tool
  that reads a run directory (eval, analyze, report) reads a sweep point. The point's assignments
  are applied after the base config and ``--set``, together with ``run.out_dir`` and ``run.name``.
- ``sweep.json`` is the manifest: base config (the file's TOML and the ``--set`` overrides), the
  grid, the job kind, and per point its assignments, directory, status (pending / running /
  finished / failed), error and seconds. It is rewritten atomically after every status change.
- Resumable: re-running the same command skips points whose ``run.json`` says finished, resumes
  the others from their newest checkpoint (the runner's own resume), and starts the rest fresh. A
  point that raises is recorded as failed (message and traceback in ``<point>/sweep_error.txt``) and
  the sweep carries on; a re-run retries it. The base config must match the manifest's (otherwise
  choose another ``--out``); the grid may grow, the manifest keeps every point it has seen.
- All points are validated before any runs, so a typo in the grid fails at once, not after hours.
- Points may also be given as a list of named assignments (``points``): ``split_points`` generates
  the GRPO-share x stage-order grid of ``evolm pipeline --sweep-splits`` that way, so a split sweep
  is an ordinary sweep of pipelines.
- One before-evaluation per sweep: points whose starting model, task, generation, held-out settings
  and seed are the same (``before_key``) reuse the first point's ``eval_before.json`` instead of
  measuring the same weights again.
- ``collect_sweep`` reads the run directories only (``RunDir``'s read side) and writes
  ``sweep_summary.json`` and ``sweep.md``: per point the training-reward curve and final value,
  held-out before/after summaries, seconds, peak RSS, generated tokens and the evaluation budget; for
  an ES point that scored its centre on each update's prompts (``es.eval_center_every = 1``), how many
  member evaluations scored above, equal to and below the centre (``members_vs_centre``: the density of
  task-changing perturbations at that σ, with its mirror image as the baseline).
  The ablation analyses (population scaling, σ, estimator, shaping) are results, not jobs: the CLI
  passes ``evolm.analysis.ablations.ablations_for`` as ``analyze`` and its output is stored beside.
- Job kinds come from ``evolm.registry`` (es, grpo, pipeline). Tests inject their own
  ``runner(cfg, resume) -> RunDir`` and ``config_class``.
"""


from __future__ import annotations

import itertools
import json
import re
import shutil
import time
import traceback
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Sequence

from evolm import config as config_mod
from evolm.config import parse_value, toml_inline
from evolm.errors import ConfigError, UserError
from evolm.markdown import table
from evolm.runs import RunDir, atomic_write_json, atomic_write_text

# -- grid ----------------------------------------------------------------------------------------------


def split_values(text: str) -> list[str]:
    """Split ``v1,v2,...`` at commas that are not inside brackets, braces or quotes."""
    parts, depth, quote, current = [], 0, None, []
    for ch in text:
        if quote:
            current.append(ch)
            if ch == quote:
                quote = None
            continue
        if ch in "\"'":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
            continue
        current.append(ch)
    parts.append("".join(current).strip())
    if quote or depth:
        raise UserError(f"unbalanced quotes or brackets in grid values '{text}'")
    return parts


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["es.population=8,16", "es.sigma=1e-3"]`` -> ``{"es.population": [8, 16], "es.sigma": [0.001]}``."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise UserError(f"--grid expects KEY=V1,V2,... e.g. es.population=8,16,32 (got '{item}')")
        if key in grid:
            raise UserError(f"--grid {key} is given twice; list all its values in one option")
        parsed = [parse_value(v) for v in split_values(values)]
        if any(v == "" for v in parsed):
            raise UserError(f"--grid {key} has an empty value (got '{values}')")
        grid[key] = parsed
    return grid


def value_label(value: Any) -> str:
    """A value as it appears in a point name: strings unquoted, lists ``[a,b]``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(value_label(v) for v in value) + "]"
    return toml_inline(value)


def point_name(assignments: dict[str, Any]) -> str:
    """``key=value,key=value`` with characters outside ``[A-Za-z0-9._=,+-]`` replaced by ``_``."""
    text = ",".join(f"{k}={value_label(v)}" for k, v in assignments.items())
    return re.sub(r"[^A-Za-z0-9._=,+\-]", "_", text)[:200]


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The Cartesian product of the grid as a list of assignment dicts (first key varies slowest)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


ORDERS = ("grpo-es", "es-grpo")
"""Stage orders of a split sweep."""


def _fraction_text(f: Fraction) -> str:
    """Exact text of a fraction: a decimal when it has one (0.25), else p/q (1/3)."""
    d = f.denominator
    for prime in (2, 5):
        while d % prime == 0:
            d //= prime
    if d != 1:
        return f"{f.numerator}/{f.denominator}"
    digits = 0
    while (f * 10**digits).denominator != 1:
        digits += 1
    return f"{float(f):.{max(digits, 1)}f}"


def split_points(splits: Sequence[str | float], orders: Sequence[str] = ORDERS) -> list[tuple[str, dict[str, Any]]]:
    """Named points of a split sweep: for every (order, GRPO share) the assignments of
    ``pipeline.stages`` (and ``pipeline.interleave = false``) (pure).

    A share of 0 or 1 is a single-method run, the same for every order, and appears once
    (``es-only`` / ``grpo-only``). Names look like ``grpo-es-0.25``.
    """
    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders:
        raise UserError(f"--orders must be a comma-separated list of {', '.join(ORDERS)} (got {', '.join(orders) or 'nothing'})")
    points: list[tuple[str, dict[str, Any]]] = []
    for text in splits:
        try:
            share = Fraction(str(text))
        except (ValueError, ZeroDivisionError):
            raise UserError(f"--sweep-splits: '{text}' is not a number") from None
        if not 0 <= share <= 1:
            raise UserError(f"--sweep-splits values are GRPO's share of the budget and must lie in [0, 1] (got {text})")
        if share in (0, 1):
            candidates = [("grpo-only", ["grpo:1.0"]) if share == 1 else ("es-only", ["es:1.0"])]
        else:
            g, e = f"grpo:{_fraction_text(share)}", f"es:{_fraction_text(1 - share)}"
            label = _fraction_text(share).replace("/", "_")
            candidates = [(f"{o}-{label}", [g, e] if o == "grpo-es" else [e, g]) for o in orders]
        for name, stages in candidates:
            if name not in {n for n, _ in points}:
                points.append((name, {"pipeline.stages": stages, "pipeline.interleave": False}))
    return points


# -- running -------------------------------------------------------------------------------------------


@dataclass
class Sweep:
    """A sweep directory and its manifest (``sweep.json``)."""

    path: Path
    manifest: dict = field(default_factory=dict)

    @property
    def manifest_path(self) -> Path:
        return self.path / "sweep.json"

    def save(self) -> None:
        self.manifest["updated"] = time.time()
        atomic_write_json(self.manifest_path, self.manifest)

    def point(self, name: str) -> dict:
        return next(p for p in self.manifest["points"] if p["name"] == name)

    @classmethod
    def open(cls, path: str | Path) -> "Sweep":
        path = Path(path)
        if not (path / "sweep.json").exists():
            raise UserError(f"{path} is not an evolm sweep directory (no sweep.json)")
        return cls(path, json.loads((path / "sweep.json").read_text()))


def default_out(config_path: str | None, base: dict) -> Path:
    stem = Path(config_path).stem if config_path else "default"
    return Path(base.get("run", {}).get("out_dir", "runs")) / f"sweep-{stem}"


def before_key(cfg) -> str:
    """What a held-out evaluation before training depends on: two points with the same key measure
    the same weights on the same problems with the same settings."""
    d = config_mod.to_dict(cfg)
    return json.dumps({k: d.get(k) for k in ("model", "task", "generation", "eval")} | {"seed": d["run"]["seed"]},
                      sort_keys=True, default=str)


def run_sweep(base: dict, grid: dict[str, list[Any]], out: str | Path, *, kind: str = "es", overrides=(),
              config_path: str | None = None, runner: Callable | None = None, config_class: type | None = None,
              points: Sequence[tuple[str, dict[str, Any]]] | None = None, analyze: Callable | None = None,
              say: Callable = lambda *a: print(*a, flush=True)) -> Sweep:
    """Run (or resume) every point of ``grid`` (or the named ``points``) on top of ``base`` (a parsed
    TOML dict) + ``overrides``.

    ``runner(cfg, resume, eval_before=None)`` and ``config_class`` replace the job kind's (tests);
    ``analyze(points, grid_keys)`` adds its result to the summary as ``ablations``. Returns the sweep;
    its manifest holds each point's status. Raises ``UserError`` on an invalid grid before any run.
    """
    if not grid and not points:
        raise UserError("evolm sweep needs at least one --grid KEY=V1,V2,...")
    if runner is None or config_class is None:
        from evolm.registry import job_kind  # the job modules import torch: only when a sweep runs

        job = job_kind(kind)
        runner = runner or job.run
        config_class = config_class or job.config_class
    sweep = Sweep(Path(out))
    identity = {"kind": kind, "base": base, "overrides": list(overrides)}
    if sweep.manifest_path.exists():
        sweep = Sweep.open(sweep.path)
        old = {k: sweep.manifest.get(k) for k in identity}
        if old != identity:
            raise UserError(f"{sweep.path} holds a sweep with a different base config, --set or --kind; "
                            "re-run it with the same ones or choose another --out")
    else:
        sweep.manifest = {"format": 1, "created": time.time(), "config_path": config_path, **identity,
                          "grid": {}, "points": []}
    named = list(points) if points is not None else [(point_name(a), a) for a in grid_points(grid)]
    # merge the grid (values keep their first-seen order) and validate every point before running any
    merged = sweep.manifest["grid"]
    for _, assignments in named:
        for key, value in assignments.items():
            merged.setdefault(key, [])
            if value not in merged[key]:
                merged[key].append(value)
    plan = []
    for name, assignments in named:
        sets = list(overrides) + [f"{k}={toml_inline(v)}" for k, v in assignments.items()] + [
            f"run.out_dir={toml_inline(str(sweep.path))}", f"run.name={toml_inline(name)}"]
        try:
            cfg = config_mod.from_dict(config_class, base, sets)
        except ConfigError as e:
            raise UserError(f"grid point {name}: {e}") from None
        plan.append((name, assignments, cfg))
    names = [n for n, _, _ in plan]
    if len(set(names)) != len(names):
        raise UserError("two grid points map to the same directory name; use distinguishable values")
    sweep.path.mkdir(parents=True, exist_ok=True)
    known = {p["name"] for p in sweep.manifest["points"]}
    for name, assignments, _ in plan:
        if name not in known:
            sweep.manifest["points"].append({"name": name, "assignments": assignments, "dir": name, "status": "pending"})
    sweep.save()

    befores: dict[str, dict] = {}  # before_key -> a finished point's eval_before.json
    for name, _, cfg in plan:
        report = RunDir(sweep.path / name).evaluation("before")
        if report is not None:
            befores.setdefault(before_key(cfg), report)
    for i, (name, assignments, cfg) in enumerate(plan, 1):
        run = RunDir(sweep.path / name)
        record = sweep.point(name)
        state = run.state()
        if state == "finished":
            if record["status"] != "finished":
                record["status"] = "finished"
                sweep.save()
            say(f"[sweep] {i}/{len(plan)} {name}: finished, skipped")
            continue
        say(f"[sweep] {i}/{len(plan)} {name}: {'resuming' if state == 'started' else 'starting'}")
        record.update(status="running", started=time.time())
        record.pop("error", None)
        sweep.save()
        if state == "absent":
            shutil.rmtree(run.path, ignore_errors=True)  # leftovers of a point that failed before its run began
        shared = befores.get(before_key(cfg)) if state == "absent" else None
        t0 = time.perf_counter()
        try:
            resume = RunDir.open(run.path) if state == "started" else None
            runner(cfg, resume, **({"eval_before": shared} if shared is not None else {}))
        except KeyboardInterrupt:
            record.update(status="interrupted", seconds=time.perf_counter() - t0)
            sweep.save()
            raise
        except Exception as e:  # one failed point must not stop the sweep
            message = f"{type(e).__name__}: {e}"
            run.path.mkdir(parents=True, exist_ok=True)
            (run.path / "sweep_error.txt").write_text(traceback.format_exc())
            record.update(status="failed", error=message, seconds=time.perf_counter() - t0)
            sweep.save()
            say(f"[sweep] {name}: failed ({message}); continuing")
            continue
        (run.path / "sweep_error.txt").unlink(missing_ok=True)
        record.update(status="finished" if run.state() == "finished" else "unfinished", seconds=time.perf_counter() - t0)
        sweep.save()
        report = run.evaluation("before")
        if report is not None:
            befores.setdefault(before_key(cfg), report)
    collect_sweep(sweep.path, analyze)
    return sweep


# -- collecting --------------------------------------------------------------------------------------


def members_vs_centre(scored, tolerance: float = 1e-12) -> dict:
    """Counts of member evaluations scoring above, equal to (within ``tolerance``) and below the unperturbed
    centre on the same prompts, from ``(fitness list, centre reward)`` per update (pure)."""
    above = tied = below = 0
    for fitness, centre in scored:
        for f in fitness:
            if f > centre + tolerance:
                above += 1
            elif f < centre - tolerance:
                below += 1
            else:
                tied += 1
    return {"above": above, "tied": tied, "below": below, "members": above + tied + below, "updates": len(scored)}


def point_metrics(path: str | Path) -> dict:
    """The numbers of one run directory a sweep summary and the ablations need (reads files only)."""
    run = RunDir(path)
    info = run.info() if (run.path / "run.json").exists() else {}
    train = run.train_records()
    curve = [[r["step"], r.get("reward_mean")] for r in train]
    finite = [r for _, r in curve if r is not None]
    status_counts: dict[str, int] = {}
    for r in train:
        if "update_status" in r:
            status_counts[r["update_status"]] = status_counts.get(r["update_status"], 0) + 1
    seconds = [r["seconds"] for r in train if r.get("seconds") is not None]
    tokens = [r["gen_tokens"] for r in train if r.get("gen_tokens") is not None]
    rss = [r["peak_rss_mb"] for r in train if r.get("peak_rss_mb") is not None] + (
        [info["peak_rss_mb"]] if info.get("peak_rss_mb") else [])
    cfg = run.config()
    members = len(train[-1]["fitness"]) if train and isinstance(train[-1].get("fitness"), list) else \
        cfg.get("es", {}).get("population")
    summary = lambda label: (run.evaluation(label) or {}).get("summary")  # noqa: E731
    out = {
        "kind": info.get("kind"), "status": info.get("status", "missing"), "updates": len(train),
        "curve": curve, "final_reward": finite[-1] if finite else None,
        "final_reward_mean3": sum(finite[-3:]) / len(finite[-3:]) if finite else None,
        "start_reward": finite[0] if finite else None,
        "update_status": status_counts,
        "eval_before": summary("before"), "eval_after": summary("after"),
        "seconds_total": sum(seconds) if seconds else info.get("seconds_total"),
        "seconds_per_update": sum(seconds) / len(seconds) if seconds else None,
        "gen_tokens_total": sum(tokens) if tokens else None,
        "gen_tokens_per_update": sum(tokens) / len(tokens) if tokens else None,
        "peak_rss_mb": max(rss) if rss else None,
        "evaluations": members * len(train) if members and info.get("kind", "es") == "es" else None,
    }
    scored = [(r["fitness"], r["center_reward"]) for r in train
              if isinstance(r.get("fitness"), list) and r.get("center_reward") is not None]
    if scored:
        out["members_vs_centre"] = members_vs_centre(scored)
    if info.get("plan"):  # a pipeline: its stages as run
        out["stages"] = " ".join(f"{s['method']}:{s['updates']}" for s in info["plan"])
    return out


def summarize_sweep(path: str | Path, analyze: Callable | None = None) -> dict:
    """The sweep summary from the manifest and the points' run directories (reads files only).

    ``sources`` lists every file read; ``ablations`` holds ``analyze(points, grid keys)`` when given
    (``evolm report`` recomputes the ablations with its own settings).
    """
    sweep = Sweep.open(path)
    sources = [str(sweep.manifest_path)]
    points = []
    for p in sweep.manifest["points"]:
        run = sweep.path / p["dir"]
        if (run / "config.toml").exists():
            metrics = point_metrics(run)
            sources += [str(run / f) for f in ("run.json", "config.toml", "metrics.jsonl", "eval_before.json",
                                               "eval_after.json") if (run / f).exists()]
        else:
            metrics = {"status": "missing", "curve": []}
        status = p["status"] if p["status"] in ("failed", "interrupted") else metrics["status"]
        points.append({"name": p["name"], "assignments": p["assignments"], "dir": p["dir"], **metrics,
                       "status": status, "error": p.get("error")})
    summary = {"kind": "sweep_summary", "sweep": str(sweep.path), "job_kind": sweep.manifest["kind"],
               "grid": sweep.manifest["grid"], "points": points, "sources": sources}
    if analyze is not None:
        summary["ablations"] = analyze([p for p in points if p.get("curve")], list(sweep.manifest["grid"]))
    return summary


def collect_sweep(path: str | Path, analyze: Callable | None = None) -> dict:
    """Write ``sweep_summary.json`` and ``sweep.md`` (``summarize_sweep``); return the summary."""
    summary = summarize_sweep(path, analyze)
    atomic_write_json(Path(path) / "sweep_summary.json", summary)
    atomic_write_text(Path(path) / "sweep.md", sweep_markdown(summary))
    return summary


def _fmt(v, spec: str = ".3f") -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def sweep_markdown(summary: dict) -> str:
    """The sweep summary as a Markdown table, one row per point."""
    keys = list(summary["grid"])
    with_stages = any(p.get("stages") for p in summary["points"])
    cols = keys + (["stages"] if with_stages else []) + ["status", "updates", "start reward", "final reward",
                                                         "held-out before", "held-out after", "s/update", "total s",
                                                         "gen tokens", "peak RSS MB"]
    rows = []
    for p in summary["points"]:
        before = (p.get("eval_before") or {}).get("greedy")
        after = (p.get("eval_after") or {}).get("greedy")
        row = [value_label(p["assignments"].get(k)) if k in p["assignments"] else "" for k in keys]
        row += [p.get("stages") or ""] if with_stages else []
        row += [p["status"] + (f" ({p['error']})" if p.get("error") else ""), _fmt(p.get("updates")),
                _fmt(p.get("start_reward")), _fmt(p.get("final_reward")), _fmt(before), _fmt(after),
                _fmt(p.get("seconds_per_update"), ".1f"), _fmt(p.get("seconds_total"), ".0f"),
                _fmt(p.get("gen_tokens_total")), _fmt(p.get("peak_rss_mb"), ".0f")]
        rows.append(row)
    return (f"# Sweep {summary['sweep']} ({summary['job_kind']})\n\n"
            "Rewards are training-reward population means per update; held-out = greedy accuracy from "
            "eval_before.json / eval_after.json.\n\n" + table(cols, rows))
