"""``evolm demo``: a short ES run on the embedded default model with before/after pass@k.

It runs ``evolm es`` with the packaged ``configs/demo.toml`` (SmolLM2-135M-Instruct, 2-digit addition
with a one-shot prompt, N=8, sigma=1e-3, lr=5e-4, 12 updates of 32 prompts each; about 8.5 minutes on
one thread of an otherwise idle 2-core CPU, about twice that when another job shares the cores). Where
it runs is the config's "auto" default (``config.resolve_auto``): on a CPU with 2+ usable cores and Ray
installed the members are scored by one Ray actor per core at 1 thread each, bit-identical to
``--set distributed.workers=0 --set model.threads=1`` (one process, one thread;
``benchmarks/demo_parallel.py`` times the two); on CUDA, and on a CPU with AMX bf16 matrix units, the model
generates in bfloat16 with float32 masters (about 1.8x float32's speed on an AMX CPU, different numbers:
``EVOLM_CPU_BF16=0`` keeps float32). The choice is printed as ``[evolm] parallelism: ...`` (and
``[evolm] model.dtype = bfloat16 ...``) after the run directory. It
prints the run directory first, then held-out greedy accuracy and pass@k (unbiased estimator, k <= 8)
before and after, and last what the numbers mean: the table is measured on held-out problems, the same
before and after; the training reward is each update's own minibatch (a different one every update),
so its first and last values are labelled as such, not shown as a gain.

What to expect: the demo shows the machinery end to end (perturb, score, restore bit-exactly, update,
evaluate, checkpoint), not a large gain. Twelve updates move the 135M model little; on 32 held-out
problems one problem is 0.031 of greedy accuracy, and the changes measured on this machine were
within a couple of problems either way (docs/results.md). Longer runs: ``configs/es-arithmetic.toml``.
"""

from __future__ import annotations

import tomllib
from importlib import resources

from evolm import config
from evolm.commands.common import outcome
from evolm.runs import RunDir


def demo_config_text() -> str:
    return resources.files("evolm").joinpath("configs/demo.toml").read_text()


def register(sub) -> None:
    p = sub.add_parser("demo", help="short ES run on the embedded SmolLM2-135M with before/after pass@k",
                       description="ES on the embedded SmolLM2-135M-Instruct on 2-digit arithmetic (about 5 minutes on "
                                   "2 CPU cores, 8 on one): held-out greedy accuracy and pass@k before and after, and the run directory. "
                                   "Device, dtype, threads and Ray actors are chosen for this machine (printed at the start as "
                                   "'[evolm] parallelism: ...'); --set distributed.workers=0 --set model.threads=1 runs one "
                                   "process on one thread (same training result). On a CPU with AMX bf16 units ES generates in bfloat16 over "
                                   "float32 masters (~1.8x faster; EVOLM_CPU_BF16=0 keeps float32).")
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
    print()
    print(f"ES on {cfg.model.spec}, task {cfg.task.name}: {cfg.es.iterations} updates, population {cfg.es.population}")
    print(outcome(run, cfg.eval.k))
    print()
    print("\n".join(meaning_lines(run, cfg)))
    return 0


def meaning_lines(run: RunDir, cfg) -> list[str]:
    """The demo's closing lines: what the held-out table and the training reward measure (and what not)."""
    lines = ["What these numbers mean:"]
    after = run.evaluation("after")
    if after:
        problems = after.get("summary", {}).get("problems") or cfg.eval.count
        lines.append(f"- held-out (the table): {problems} test problems the run never trained on, the same problems "
                     f"before and after, so the change comes from the weights alone; one problem is "
                     f"{1 / problems:.3f} of greedy accuracy, and a change of a problem or two is noise at this size.")
    train = [r for r in run.train_records() if r.get("reward_mean") is not None]
    if train:
        first, last = train[0], train[-1]
        mean = sum(r["reward_mean"] for r in train) / len(train)
        lines.append(f"- training reward: the population's mean reward on each update's own minibatch of "
                     f"{cfg.es.prompts_per_iteration} training prompts. Every update draws a different minibatch, so "
                     f"these are not a before/after comparison: update {first['step']} {first['reward_mean']:.3f}, "
                     f"update {last['step']} {last['reward_mean']:.3f}, mean over the {len(train)} updates {mean:.3f}.")
    lines.append(f"- everything is in {run.path} (metrics.jsonl, seed_log.jsonl, plots/, final/); "
                 f"`evolm eval --like {run.path}` measures the table's 'after' column again, exactly.")
    return lines
