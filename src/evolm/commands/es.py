"""``evolm es``: ES post-training from a TOML config (``jobs.run_es``)."""

from __future__ import annotations

from evolm.commands.common import add_config_args, job_config, outcome


def register(sub) -> None:
    p = sub.add_parser("es", help="ES post-training from a TOML config",
                       description="Run ES post-training; prints the run directory first and the held-out before/after table "
                                   "last. Writes runs/<name>/ with the resolved config, metrics.jsonl, "
                                   "seed_log.jsonl, checkpoints/ and final/ (run.save: all, final or none; an ES run's "
                                   "weights at any update can be rebuilt with `evolm replay`). --set distributed.workers=2 "
                                   "scores the population on 2 Ray actors (same result; docs/distributed.md).")
    add_config_args(p)
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped run from its newest checkpoint (bit-identical result), or a finished one "
                        "from final/ with a larger --set es.iterations=N; only the budget and how the run executes "
                        "may change (docs/reliability.md)")
    p.set_defaults(func=run)


def run(args) -> int:
    from evolm.jobs import run_es  # torch: imported when a verb runs, not for `evolm --help`

    cfg, resume = job_config("es", args)
    run = run_es(cfg, resume=resume)
    print()
    print(outcome(run, cfg.eval.k))
    return 0
