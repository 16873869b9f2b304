"""``evolm sweep``: a grid of ES, GRPO or pipeline runs from one base config, resumable, with a summary.

    evolm sweep --config configs/es-arithmetic.toml --grid es.population=8,16,32 --grid es.sigma=0.0005,0.001

Design decisions:

- A grid value is a TOML literal, exactly as ``--set`` takes it (``config._parse_value``); values
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
- ``collect_sweep`` reads the run directories only and writes ``sweep_summary.json`` and
  ``sweep.md``: per point the training-reward curve and final value, held-out before/after
  summaries, seconds, peak RSS, generated tokens and the evaluation budget. The ablation analyses
  (population scaling, σ, estimator, shaping: ``evolm.analysis.ablations``) run on that summary.
- Job kinds: ``es`` (``evolm.es.engine.run_es``, ``config.ESJob``), ``grpo`` (``evolm.grpo.run_grpo``,
  ``GRPOJob``), ``pipeline`` (``evolm.pipeline.run_pipeline``, ``PipelineJob``), looked up when used.
  Tests inject their own ``runner(cfg, resume) -> RunDir``.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from evolm.errors import UserError

KINDS = ("es", "grpo", "pipeline")


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
    from evolm.config import _parse_value

    grid: dict[str, list[Any]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip()
        if not sep or not key or not values.strip():
            raise UserError(f"--grid expects KEY=V1,V2,... e.g. es.population=8,16,32 (got '{item}')")
        if key in grid:
            raise UserError(f"--grid {key} is given twice; list all its values in one option")
        parsed = [_parse_value(v) for v in split_values(values)]
        if any(v == "" for v in parsed):
            raise UserError(f"--grid {key} has an empty value (got '{values}')")
        grid[key] = parsed
    return grid


def toml_literal(value: Any) -> str:
    """One value as a single-line TOML literal (what ``--set key=...`` takes): ``8``, ``0.001``, ``"a"``,
    ``["norm", "mlp"]``, ``{digits = 2}``."""
    import json
    import math

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return ("inf" if value > 0 else "-inf") if math.isinf(value) else "nan" if math.isnan(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_literal(v)}" for k, v in value.items()) + "}"
    raise UserError(f"grid value {value!r} has no TOML form")


def value_label(value: Any) -> str:
    """A value as it appears in a point name: strings unquoted, lists ``[a,b]``."""
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(value_label(v) for v in value) + "]"
    return toml_literal(value)


def point_name(assignments: dict[str, Any]) -> str:
    """``key=value,key=value`` with characters outside ``[A-Za-z0-9._=,+-]`` replaced by ``_``."""
    text = ",".join(f"{k}={value_label(v)}" for k, v in assignments.items())
    return re.sub(r"[^A-Za-z0-9._=,+\-]", "_", text)[:200]


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The Cartesian product of the grid as a list of assignment dicts (first key varies slowest)."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


# -- job kinds ---------------------------------------------------------------------------------------


@dataclass
class JobKind:
    name: str
    config_class: type
    run: Callable  # run(cfg, resume=RunDir | None) -> RunDir


def job_kind(name: str) -> JobKind:
    """The config class and runner of ``es``, ``grpo`` or ``pipeline`` (imported only when used)."""
    if name == "es":
        from evolm.config import ESJob
        from evolm.es.engine import run_es

        return JobKind("es", ESJob, lambda cfg, resume=None: run_es(cfg, resume=resume))
    if name == "grpo":
        from evolm.grpo import GRPOJob, run_grpo

        return JobKind("grpo", GRPOJob, lambda cfg, resume=None: run_grpo(cfg, resume=resume))
    if name == "pipeline":
        try:
            from evolm.pipeline import PipelineJob, run_pipeline
        except ImportError as e:
            raise UserError(f"--kind pipeline needs evolm.pipeline (PipelineJob, run_pipeline), which this install lacks ({e})") from None
        return JobKind("pipeline", PipelineJob, lambda cfg, resume=None: run_pipeline(cfg, resume))
    raise UserError(f"--kind must be one of {', '.join(KINDS)} (got '{name}')")


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
        from evolm.runs import atomic_write_json

        self.manifest["updated"] = time.time()
        atomic_write_json(self.manifest_path, self.manifest)

    def point(self, name: str) -> dict:
        return next(p for p in self.manifest["points"] if p["name"] == name)

    @classmethod
    def open(cls, path: str | Path) -> "Sweep":
        import json

        path = Path(path)
        if not (path / "sweep.json").exists():
            raise UserError(f"{path} is not an evolm sweep directory (no sweep.json)")
        return cls(path, json.loads((path / "sweep.json").read_text()))


def _point_status(path: Path) -> str:
    """finished / unfinished (a run directory exists) / new."""
    import json

    info = path / "run.json"
    if info.exists():
        try:
            return "finished" if json.loads(info.read_text()).get("status") == "finished" else "unfinished"
        except ValueError:
            return "unfinished"
    return "unfinished" if (path / "config.toml").exists() else "new"


def default_out(config_path: str | None, base: dict) -> Path:
    stem = Path(config_path).stem if config_path else "default"
    return Path(base.get("run", {}).get("out_dir", "runs")) / f"sweep-{stem}"


def run_sweep(base: dict, grid: dict[str, list[Any]], out: str | Path, *, kind: str = "es", overrides=(),
              config_path: str | None = None, runner: Callable | None = None, config_class: type | None = None,
              say: Callable = lambda *a: print(*a, flush=True)) -> Sweep:
    """Run (or resume) every point of ``grid`` on top of ``base`` (a parsed TOML dict) + ``overrides``.

    ``runner(cfg, resume)`` and ``config_class`` replace the job kind's (tests). Returns the sweep;
    its manifest holds each point's status. Raises ``UserError`` on an invalid grid before any run.
    """
    from evolm import config as config_mod
    from evolm.errors import ConfigError
    from evolm.runs import RunDir

    if not grid:
        raise UserError("evolm sweep needs at least one --grid KEY=V1,V2,...")
    if runner is None or config_class is None:
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
    # merge the grid (values keep their first-seen order) and validate every point before running any
    merged = sweep.manifest["grid"]
    for key, values in grid.items():
        merged.setdefault(key, [])
        merged[key] += [v for v in values if v not in merged[key]]
    plan = []
    for assignments in grid_points(grid):
        name = point_name(assignments)
        sets = list(overrides) + [f"{k}={toml_literal(v)}" for k, v in assignments.items()] + [
            f"run.out_dir={toml_literal(str(sweep.path))}", f"run.name={toml_literal(name)}"]
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

    for i, (name, assignments, cfg) in enumerate(plan, 1):
        path = sweep.path / name
        record = sweep.point(name)
        state = _point_status(path)
        if state == "finished":
            if record["status"] != "finished":
                record["status"] = "finished"
                sweep.save()
            say(f"[sweep] {i}/{len(plan)} {name}: finished, skipped")
            continue
        say(f"[sweep] {i}/{len(plan)} {name}: {'resuming' if state == 'unfinished' else 'starting'}")
        record.update(status="running", started=time.time())
        record.pop("error", None)
        sweep.save()
        (path / "sweep_error.txt").unlink(missing_ok=True)  # a fresh point needs an empty directory
        t0 = time.perf_counter()
        try:
            resume = RunDir.open(path) if state == "unfinished" else None
            runner(cfg, resume)
        except KeyboardInterrupt:
            record.update(status="interrupted", seconds=time.perf_counter() - t0)
            sweep.save()
            raise
        except Exception as e:  # one failed point must not stop the sweep
            message = f"{type(e).__name__}: {e}"
            path.mkdir(parents=True, exist_ok=True)
            (path / "sweep_error.txt").write_text(traceback.format_exc())
            record.update(status="failed", error=message, seconds=time.perf_counter() - t0)
            sweep.save()
            say(f"[sweep] {name}: failed ({message}); continuing")
            continue
        record.update(status="finished" if _point_status(path) == "finished" else "unfinished",
                      seconds=time.perf_counter() - t0)
        sweep.save()
    collect_sweep(sweep.path)
    return sweep


# -- collecting --------------------------------------------------------------------------------------


def _summary_of(path: Path, name: str) -> dict | None:
    import json

    f = path / name
    if not f.exists():
        return None
    try:
        return json.loads(f.read_text()).get("summary")
    except ValueError:
        return None


def point_metrics(path: str | Path) -> dict:
    """The numbers of one run directory a sweep summary and the ablations need (reads files only)."""
    import json

    from evolm.config import read_toml
    from evolm.runs import read_jsonl

    path = Path(path)
    info = json.loads((path / "run.json").read_text()) if (path / "run.json").exists() else {}
    records = read_jsonl(path / "metrics.jsonl")
    train = {}
    for r in records:  # last record of a step wins (a resumed run may have re-logged it)
        if r.get("kind", "train") == "train" and "step" in r:
            train[int(r["step"])] = r
    train = [train[s] for s in sorted(train)]
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
    cfg = read_toml(path / "config.toml") if (path / "config.toml").exists() else {}
    members = len(train[-1]["fitness"]) if train and isinstance(train[-1].get("fitness"), list) else \
        cfg.get("es", {}).get("population")
    return {
        "kind": info.get("kind"), "status": info.get("status", "missing"), "updates": len(train),
        "curve": curve, "final_reward": finite[-1] if finite else None,
        "final_reward_mean3": sum(finite[-3:]) / len(finite[-3:]) if finite else None,
        "start_reward": finite[0] if finite else None,
        "update_status": status_counts,
        "eval_before": _summary_of(path, "eval_before.json"), "eval_after": _summary_of(path, "eval_after.json"),
        "seconds_total": sum(seconds) if seconds else info.get("seconds_total"),
        "seconds_per_update": sum(seconds) / len(seconds) if seconds else None,
        "gen_tokens_total": sum(tokens) if tokens else None,
        "gen_tokens_per_update": sum(tokens) / len(tokens) if tokens else None,
        "peak_rss_mb": max(rss) if rss else None,
        "evaluations": members * len(train) if members and info.get("kind", "es") == "es" else None,
    }


def summarize_sweep(path: str | Path) -> dict:
    """The sweep summary from the manifest and the points' run directories (reads files only).

    ``sources`` lists every file read; ``ablations`` holds the analyses the grid supports, with
    default settings (``evolm report`` recomputes them with its own).
    """
    from evolm.analysis.ablations import ablations_for

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
    return {"kind": "sweep_summary", "sweep": str(sweep.path), "job_kind": sweep.manifest["kind"],
            "grid": sweep.manifest["grid"], "points": points, "sources": sources,
            "ablations": ablations_for([p for p in points if p.get("curve")], list(sweep.manifest["grid"]))}


def collect_sweep(path: str | Path) -> dict:
    """Write ``sweep_summary.json`` and ``sweep.md`` (``summarize_sweep``); return the summary."""
    from evolm.runs import atomic_write_json, atomic_write_text

    summary = summarize_sweep(path)
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
    cols = keys + ["status", "updates", "start reward", "final reward", "held-out before", "held-out after",
                   "s/update", "total s", "gen tokens", "peak RSS MB"]
    lines = [f"# Sweep {summary['sweep']} ({summary['job_kind']})", "",
             "Rewards are training-reward population means per update; held-out = greedy accuracy from "
             "eval_before.json / eval_after.json.", "",
             "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for p in summary["points"]:
        before = (p.get("eval_before") or {}).get("greedy")
        after = (p.get("eval_after") or {}).get("greedy")
        row = [value_label(p["assignments"].get(k)) if k in p["assignments"] else "" for k in keys]
        row += [p["status"] + (f" ({p['error']})" if p.get("error") else ""), _fmt(p.get("updates")),
                _fmt(p.get("start_reward")), _fmt(p.get("final_reward")), _fmt(before), _fmt(after),
                _fmt(p.get("seconds_per_update"), ".1f"), _fmt(p.get("seconds_total"), ".0f"),
                _fmt(p.get("gen_tokens_total")), _fmt(p.get("peak_rss_mb"), ".0f")]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in row) + " |")
    return "\n".join(lines) + "\n"


# -- command line ----------------------------------------------------------------------------------


def _cmd_sweep(args) -> int:
    from evolm.config import read_toml

    base = read_toml(args.config) if args.config else {}
    grid = parse_grid(args.grid)
    out = Path(args.out) if args.out else default_out(args.config, base)
    sweep = run_sweep(base, grid, out, kind=args.kind, overrides=args.overrides, config_path=args.config)
    counts: dict[str, int] = {}
    for p in sweep.manifest["points"]:
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    print(f"[sweep] {sweep.path}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    print(f"wrote {sweep.path / 'sweep_summary.json'} and {sweep.path / 'sweep.md'}; "
          f"`evolm report {sweep.path} --out {sweep.path / 'report'}` draws it")
    return 1 if counts.get("failed") else 0


def add_cli(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="run a grid of ES / GRPO / pipeline runs from one config (resumable) and summarise them",
        description="Run every point of the Cartesian product of the --grid options, each as an ordinary run "
                    "directory <out>/<key=value,...>/. Re-running the same command skips finished points and resumes "
                    "unfinished ones from their checkpoints; a point that fails is recorded and the sweep goes on. "
                    "Writes sweep.json (manifest), sweep_summary.json and sweep.md; `evolm report SWEEP_DIR` plots "
                    "it, including population-scaling, sigma, estimator and shaping ablations.",
        epilog="examples:\n"
               "  evolm sweep -c configs/es-arithmetic.toml --grid es.population=8,16,32 --set es.iterations=50\n"
               "  evolm sweep -c configs/es-arithmetic.toml --grid es.sigma=0.0001,0.001,0.01 --out runs/sigma\n"
               "  evolm sweep -c configs/es-arithmetic.toml --grid es.estimator=one_point,antithetic --grid es.shaping=zscore,none",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", metavar="FILE", help="base TOML config of every point (default: the job's defaults)")
    p.add_argument("--grid", "-g", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="a grid axis: config key and comma-separated TOML values (repeatable; product of all axes)")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a base config field for every point (repeatable; TOML literal)")
    p.add_argument("--kind", "-k", default="es", choices=KINDS, help="job kind of every point (default: es)")
    p.add_argument("--out", "-o", metavar="DIR", help="sweep directory (default: <run.out_dir>/sweep-<config name>)")
    p.set_defaults(func=_cmd_sweep)


if __name__ == "__main__":  # pragma: no cover
    from evolm.cli import main

    sys.exit(main(["sweep", *sys.argv[1:]]))
