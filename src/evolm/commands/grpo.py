"""``evolm grpo``: the GRPO baseline through TRL (``jobs.run_grpo``)."""

from __future__ import annotations

import argparse

from evolm.commands.common import add_config_args, job_config, outcome


def register(sub) -> None:
    p = sub.add_parser(
        "grpo", help="GRPO post-training (TRL GRPOTrainer) from a TOML config",
        description="Train with Hugging Face TRL's GRPOTrainer on the same model, task and reward as ES. Writes "
                    "runs/<name>/ (config.toml, run.json, metrics.jsonl with per-update cost, checkpoints/, final/) "
                    "in the same format as `evolm es`; prints the run directory first and the held-out before/after "
                    "table last. `evolm config grpo` lists every field.",
        epilog="example: evolm grpo --config configs/grpo-arithmetic.toml --set grpo.steps=5",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p, "grpo.lr=2e-5")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a stopped GRPO run from its newest checkpoint (weights, AdamW state, RNG and data "
                        "position are restored); --set grpo.steps=N extends the budget (from a checkpoint of the last "
                        "update); only the budget and how the run executes may change (docs/reliability.md)")
    p.set_defaults(func=run)


def run(args) -> int:
    from evolm.jobs import run_grpo  # torch and TRL: imported when the verb runs

    cfg, resume = job_config("grpo", args)
    run = run_grpo(cfg, resume=resume)
    print()
    print(outcome(run, cfg.eval.k))
    return 0
