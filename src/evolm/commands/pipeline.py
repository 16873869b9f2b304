"""``evolm pipeline``: GRPO and ES stages over one update budget, and split sweeps of them."""

from __future__ import annotations

import argparse

from evolm.analysis.ablations import ablations_for
from evolm.commands.common import add_config_args, job_config, outcome


def register(sub) -> None:
    p = sub.add_parser(
        "pipeline", help="GRPO and ES stages sharing one update budget (sequential, interleaved, split sweeps)",
        description="Run stages such as grpo:0.5, es:0.5 of one update budget on the same weights (each stage starts "
                    "from the previous stage's final weights). Writes runs/<name>/ with stages/NN-<method>/ (ordinary "
                    "ES and GRPO run directories), one metrics.jsonl with stage, stage_method, stage_step and global "
                    "step columns, held-out eval_before/after.json, and final/. With --sweep-splits, runs one "
                    "pipeline per GRPO share and order as an `evolm sweep` (sweep.json, sweep_summary.json, "
                    "sweep.md). `evolm config pipeline` lists every field.",
        epilog="examples:\n"
               "  evolm pipeline --config configs/pipeline-grpo-es.toml\n"
               "  evolm pipeline --config configs/pipeline-interleaved.toml --set pipeline.budget=12\n"
               "  evolm pipeline --config configs/pipeline-grpo-es.toml --sweep-splits 0.25,0.5,0.75 --orders grpo-es,es-grpo\n"
               "  evolm pipeline --resume runs/pipeline-grpo-es-20261130-010000",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p, "pipeline.stages=['es:0.5','grpo:0.5']")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a killed pipeline (finished stages are skipped, the interrupted one resumes from its "
                        "newest checkpoint), or a split sweep directory")
    p.add_argument("--sweep-splits", metavar="S1,S2,...",
                   help="run one pipeline per GRPO share of the budget (values in [0, 1]; 0 and 1 are the pure "
                        "methods) and order, as points of one sweep directory (re-run the same command to resume it)")
    p.add_argument("--orders", metavar="O1,O2",
                   help="stage orders for --sweep-splits: grpo-es, es-grpo or both (default: both)")
    p.add_argument("--out", "-o", metavar="DIR",
                   help="sweep directory for --sweep-splits (default: <run.out_dir>/<run.name>)")
    p.set_defaults(func=run)


def _split_list(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def run(args) -> int:
    from evolm.pipeline import run_pipeline  # torch and TRL: imported when the verb runs

    from pathlib import Path

    splits = _split_list(args.sweep_splits)
    if splits or (args.resume and (Path(args.resume) / "sweep.json").exists()):
        return _split_sweep(args, splits)
    cfg, resume = job_config("pipeline", args)
    run = run_pipeline(cfg, resume=resume)
    print()
    print(outcome(run, cfg.eval.k))
    return 0


def _split_sweep(args, splits: list[str]) -> int:
    from pathlib import Path

    from evolm import config
    from evolm.errors import UserError
    from evolm.pipeline import PipelineJob
    from evolm.sweep import ORDERS, Sweep, run_sweep, split_points

    if args.resume:  # the manifest holds the base config, overrides and points
        sweep = Sweep.open(args.resume)
        m = sweep.manifest
        if m.get("kind") != "pipeline" or splits:
            raise UserError(f"{sweep.path} is a sweep of {m.get('kind')} runs; resume a split sweep with `evolm pipeline "
                            "--resume SWEEP_DIR` alone, any other sweep by running its `evolm sweep` command again")
        points = [(p["name"], p["assignments"]) for p in m["points"]]
        sweep = run_sweep(m["base"], {}, sweep.path, kind="pipeline", overrides=m["overrides"],
                          config_path=m.get("config_path"), points=points, analyze=ablations_for)
        return _summary(sweep)
    if not args.config:
        raise UserError("evolm pipeline needs --config FILE; `evolm config pipeline` prints every field")
    points = split_points(splits, _split_list(args.orders) or list(ORDERS))
    base = config.read_toml(args.config, paths_from_file=True)
    name = config.load(PipelineJob, args.config, args.overrides, paths_from_file=True).run.name  # validates the base config
    out = Path(args.out) if args.out else Path(base.get("run", {}).get("out_dir", "runs")) / name
    sweep = run_sweep(base, {}, out, kind="pipeline", overrides=args.overrides, config_path=args.config, points=points,
                      analyze=ablations_for)
    return _summary(sweep)


def _summary(sweep) -> int:
    print((sweep.path / "sweep.md").read_text(), end="")
    print(sweep.path)
    return 1 if any(p["status"] == "failed" for p in sweep.manifest["points"]) else 0
