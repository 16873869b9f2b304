"""What several verbs share: the ``--config/--set/--resume`` options, turning them into a job config, and
the before/after table every training verb prints last."""

from __future__ import annotations

import argparse

from evolm import config
from evolm.errors import UserError
from evolm.runs import RunDir


def add_config_args(p: argparse.ArgumentParser, example_set: str = "es.sigma=0.002") -> None:
    p.add_argument("--config", "-c", metavar="FILE", help="TOML config file (see `evolm config`)")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help=f"override a config field, e.g. --set {example_set} (repeatable; values are TOML literals)")


def job_config(kind: str, args, verb: str | None = None):
    """``(cfg, resume)`` for a job verb: the config of ``--resume RUN_DIR`` (whose kind must be ``kind``)
    or of ``--config FILE``, with ``--set`` overrides applied and validated."""
    from evolm.jobs import check_kind  # the job modules import torch: only when a job verb runs
    from evolm.registry import job_kind

    job = job_kind(kind)
    if getattr(args, "resume", None):
        if getattr(args, "config", None):
            raise UserError(f"--config and --resume together: a resume continues from the run's own config.toml; "
                            f"leave out --config {args.config} and change what may change with --set (e.g. the "
                            f"budget, --set {job.resume.budget_field}=N)")
        run = RunDir.open(args.resume)
        check_kind(run, kind)  # before parsing: another kind's config has sections this one lacks
        return config.load(job.config_class, run.config_path, args.overrides), run
    if not args.config:
        raise UserError(f"evolm {verb or kind} needs --config FILE (or --resume RUN_DIR); "
                        f"`evolm config {kind}` prints every field")
    cfg = config.load(job.config_class, args.config, args.overrides, paths_from_file=True)
    RunDir.check_new(cfg.run.out_dir, cfg.run.name)  # before the model, task and data load (seconds)
    return cfg, None


def before_after_table(before: dict, after: dict, ks, temperature: float = 1.0) -> str:
    """The held-out summary before and after training as an aligned text table (greedy, pass@k at the
    sampling ``temperature``, entropy, distinct correct answers, and the change)."""
    rows = [("greedy accuracy", "greedy")] + [(f"pass@{k} (T={temperature:g})", f"pass@{k}") for k in ks] + [
        ("token entropy (nats)", "entropy"), ("distinct correct answers", "distinct_correct")]
    lines = [f"{'held-out metric':<26}{'before':>10}{'after':>10}{'change':>10}"]
    for label, key in rows:
        b, a = before.get(key), after.get(key)
        if b is None or a is None:
            continue
        lines.append(f"{label:<26}{b:>10.3f}{a:>10.3f}{a - b:>+10.3f}")
    return "\n".join(lines)


def outcome(run: RunDir, ks) -> str:
    """What a training verb prints last: the held-out before/after table (``before_after_table``), or a
    line saying why there is none."""
    before, after = run.evaluation("before"), run.evaluation("after")
    if before and after:
        head = (f"held-out evaluation ({after.get('task')}, {after.get('summary', {}).get('problems')} problems never "
                f"trained on, the same before and after; eval_before.json / eval_after.json in {run.path}):")
        temperature = float((after.get("sampling") or {}).get("temperature", 1.0))
        return head + "\n" + before_after_table(before["summary"], after["summary"], ks, temperature)
    return f"no before/after table: the run has no held-out evaluation (eval.before_after = false) in {run.path}"
