"""``evolm demo``: a short ES run on the embedded default model with before/after pass@k.

It runs ``evolm es`` with the packaged ``configs/demo.toml`` (SmolLM2-135M-Instruct, 2-digit addition
with a one-shot prompt, N=8, sigma=1e-3, lr=5e-4, 12 updates of 32 prompts each; 8.5 minutes on one
thread of an otherwise idle 2-core CPU, about twice that when another job shares the cores), then
prints held-out greedy accuracy and pass@k (unbiased estimator, k <= 8) before and after, and where
the run directory is.

What to expect: the demo shows the machinery end to end (perturb, score, restore bit-exactly, update,
evaluate, checkpoint), not a large gain. Twelve updates move the 135M model little; on 32 held-out
problems one problem is 0.031 of greedy accuracy, and the changes measured on this machine were
within a couple of problems either way (docs/results.md). Longer runs: ``configs/es-arithmetic.toml``.
"""

from __future__ import annotations

from importlib import resources


def demo_config_text() -> str:
    return resources.files("evolm").joinpath("configs/demo.toml").read_text()


def summary_table(before: dict, after: dict, ks) -> str:
    rows = [("greedy accuracy", "greedy")] + [(f"pass@{k} (T=1)", f"pass@{k}") for k in ks] + [
        ("token entropy (nats)", "entropy"), ("distinct correct answers", "distinct_correct")]
    lines = [f"{'held-out metric':<26}{'before':>10}{'after':>10}{'change':>10}"]
    for label, key in rows:
        b, a = before.get(key), after.get(key)
        if b is None or a is None:
            continue
        lines.append(f"{label:<26}{b:>10.3f}{a:>10.3f}{a - b:>+10.3f}")
    return "\n".join(lines)


def run_demo(overrides=(), resume: str | None = None) -> None:
    import json
    import tomllib

    from evolm import config
    from evolm.es.engine import run_es
    from evolm.runs import RunDir

    if resume:
        run = RunDir.open(resume)
        cfg = config.load(config.ESJob, run.config_path, overrides)
        run = run_es(cfg, resume=run)
    else:
        cfg = config.from_dict(config.ESJob, tomllib.loads(demo_config_text()), overrides)
        run = run_es(cfg)
    before = json.loads((run.path / "eval_before.json").read_text())["summary"] if (run.path / "eval_before.json").exists() else {}
    after = json.loads((run.path / "eval_after.json").read_text())["summary"] if (run.path / "eval_after.json").exists() else {}
    print()
    print(f"ES on {cfg.model.spec}, task {cfg.task.name}: {cfg.es.iterations} updates, population {cfg.es.population}")
    if before and after:
        print(summary_table(before, after, cfg.eval.k))
    train = [r for r in run.metrics() if r.get("kind") == "train"]
    if train:
        print(f"training reward (population mean): {train[0]['reward_mean']:.3f} -> {train[-1]['reward_mean']:.3f}")
    print(f"run directory: {run.path}  (metrics.jsonl, seed_log.jsonl, plots/, final/)")
