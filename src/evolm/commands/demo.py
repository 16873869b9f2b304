"""``evolm demo``: a short ES run on the embedded default model with before/after pass@k.

It runs ``evolm es`` with the packaged ``configs/demo.toml`` (SmolLM2-135M-Instruct, 2-digit addition
with a one-shot prompt, N=8, sigma=1e-3, lr=5e-4, 12 updates of 32 prompts each; about 8.5 minutes on
one thread of an otherwise idle 2-core CPU, about twice that when another job shares the cores), then
prints held-out greedy accuracy and pass@k (unbiased estimator, k <= 8) before and after, and where
the run directory is.

What to expect: the demo shows the machinery end to end (perturb, score, restore bit-exactly, update,
evaluate, checkpoint), not a large gain. Twelve updates move the 135M model little; on 32 held-out
problems one problem is 0.031 of greedy accuracy, and the changes measured on this machine were
within a couple of problems either way (docs/results.md). Longer runs: ``configs/es-arithmetic.toml``.
"""

from __future__ import annotations

import tomllib
from importlib import resources

from evolm import config
from evolm.commands.common import before_after_table
from evolm.runs import RunDir


def demo_config_text() -> str:
    return resources.files("evolm").joinpath("configs/demo.toml").read_text()


def register(sub) -> None:
    p = sub.add_parser("demo", help="short ES run on the embedded SmolLM2-135M with before/after pass@k",
                       description="ES on the embedded SmolLM2-135M-Instruct on 2-digit arithmetic (about ten minutes "
                                   "on 2 CPU cores): held-out greedy accuracy and pass@k before and after, and the run directory.")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the packaged demo config (evolm/configs/demo.toml), e.g. --set es.iterations=5")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted demo run")
    p.set_defaults(func=run)


def run(args) -> int:
    from evolm.jobs import check_kind, run_es  # torch: imported when the verb runs

    if args.resume:
        resume = RunDir.open(args.resume)
        check_kind(resume, "es")
        cfg = config.load(config.ESJob, resume.config_path, args.overrides)
    else:
        resume = None
        cfg = config.from_dict(config.ESJob, tomllib.loads(demo_config_text()), args.overrides)
    run = run_es(cfg, resume=resume)
    before, after = run.evaluation("before"), run.evaluation("after")
    print()
    print(f"ES on {cfg.model.spec}, task {cfg.task.name}: {cfg.es.iterations} updates, population {cfg.es.population}")
    if before and after:
        print(before_after_table(before["summary"], after["summary"], cfg.eval.k))
    train = run.train_records()
    if train and train[0].get("reward_mean") is not None and train[-1].get("reward_mean") is not None:
        print(f"training reward (population mean): {train[0]['reward_mean']:.3f} -> {train[-1]['reward_mean']:.3f}")
    print(f"run directory: {run.path}  (metrics.jsonl, seed_log.jsonl, plots/, final/)")
    return 0
