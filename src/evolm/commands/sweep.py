"""``evolm sweep``: a grid of ES / GRPO / pipeline runs from one config (``evolm.sweep.run_sweep``)."""

from __future__ import annotations

import argparse
from pathlib import Path

from evolm.analysis.ablations import ablations_for
from evolm.config import read_toml
from evolm.sweep import default_out, parse_grid, run_sweep

KINDS = ("es", "grpo", "pipeline")


def register(sub) -> None:
    p = sub.add_parser(
        "sweep", help="run a grid of ES / GRPO / pipeline runs from one config (resumable) and summarise them",
        description="Run every point of the Cartesian product of the --grid options, each as an ordinary run "
                    "directory <out>/<key=value,...>/. Re-running the same command skips finished points and resumes "
                    "unfinished ones from their checkpoints; a point that fails is recorded and the sweep goes on. "
                    "Points with the same starting model and held-out settings share one before-evaluation. "
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
    p.set_defaults(func=run)


def run(args) -> int:
    base = read_toml(args.config, paths_from_file=True) if args.config else {}
    grid = parse_grid(args.grid)
    out = Path(args.out) if args.out else default_out(args.config, base)
    sweep = run_sweep(base, grid, out, kind=args.kind, overrides=args.overrides, config_path=args.config,
                      analyze=ablations_for)
    counts: dict[str, int] = {}
    for p in sweep.manifest["points"]:
        counts[p["status"]] = counts.get(p["status"], 0) + 1
    print(f"[sweep] {sweep.path}: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    print(f"wrote {sweep.path / 'sweep_summary.json'} and {sweep.path / 'sweep.md'}; "
          f"`evolm report {sweep.path} --out {sweep.path / 'report'}` draws it")
    return 1 if counts.get("failed") else 0
