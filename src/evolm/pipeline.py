"""Pipelines: GRPO and ES stages that share one update budget and run one after another on the same weights.

``evolm pipeline --config FILE`` runs e.g. ``stages = ["grpo:0.5", "es:0.5"]`` of ``budget = 20``
updates (10 GRPO optimizer steps, then 10 ES iterations), or an interleaved schedule
(``["grpo:5", "es:5"]`` with ``interleave = true``, repeated until the budget is spent).
``--sweep-splits 0.25,0.5,0.75 --orders grpo-es,es-grpo`` runs a grid of GRPO shares and orders.

Design decisions:

- One update is one ES iteration or one GRPO optimizer step (the budget ES and GRPO already share).
  ``plan_stages`` turns the stage list into exact update counts (pure; rounding rule in its docstring).
- A stage is an ordinary ES or GRPO run made by ``run_es`` / ``run_grpo`` in
  ``<run>/stages/NN-<method>/``, with a config derived from the pipeline's (``stage_config``): the
  stage's updates as ``es.iterations`` / ``grpo.steps`` and a seed derived from ``run.seed`` and the
  stage index (``seeding.seed31``), so two ES stages never reuse noise keys and two GRPO stages never
  reuse training problems. Every stage directory can be evaluated and analysed like any run.
- Hand-over is in memory: the model object the previous stage trained is the next stage's starting
  point, bit for bit (the stage's ``final/`` holds the same float32 tensors; the test suite checks
  it, and ``run.json`` records the weight fingerprint at every boundary). ES keeps float32 masters
  apart from a lower-precision model, which an in-memory hand-over would round, so pipelines require
  ``model.dtype = "float32"``. Optimizer state does not cross stages: each GRPO stage starts AdamW
  afresh, as a separate GRPO run from those weights would.
- Held-out measurements belong to the pipeline: before/after evaluation (``[eval]``) runs once on
  the top-level run, and one probe (``[probe]``, built once, so every point is measured on the same
  problems with the same sampling seed) is handed to every stage, which logs it at its start, every
  ``probe.every`` of its own updates and at its end. A stage's opening probe would repeat the
  previous stage's closing one (same weights), so it is reused instead of measured again and left
  out of the combined stream.
- The top-level ``metrics.jsonl`` is rebuilt from the stage directories (``combined_records``) after
  every update, so it is never out of step with them after a kill: every record carries ``stage``
  (index), ``stage_method``, ``stage_step`` (the stage's own step) and ``step`` (updates done in the
  whole pipeline); ``seconds_total``, ``gen_sequences_total`` and ``gen_tokens_total`` are running
  totals over the pipeline.
- Resume: finished stages (``final/`` written and ``run.json`` status finished) are skipped and the
  model is loaded from the last finished stage's ``final/``; the interrupted stage continues through
  its own resume path (``run_es(resume=...)`` / ``run_grpo(resume=...)``). The plan may grow on
  resume (a larger budget) but may not rewrite stages that have finished.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import math
import shutil
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from evolm.config import (ESConfig, EvalConfig, GenerationConfig, ModelConfig, ProbeConfig, RunConfig, TaskConfig,
                          _require)
from evolm.errors import ConfigError, UserError
from evolm.grpo import GRPOSection
from evolm.seeding import seed31

METHODS = ("grpo", "es")
"""Methods a stage can run."""
KIND = "pipeline"
SWEEP_KIND = "pipeline-sweep"


# --------------------------------------------------------------------------------------------------
# config


@dataclass
class PipelineSection:
    budget: int = 20
    """Total updates of the pipeline, shared by its stages (one ES iteration = one GRPO optimizer step = one update)."""
    stages: list[str] = field(default_factory=lambda: ["grpo:0.5", "es:0.5"])
    """Stages in order, each "method:amount" with method grpo or es. Amounts written with '.' or '/' (0.5, 1/3) are fractions of the budget (they must sum to 1; rounded by largest remainder); integers (10) are update counts (they must sum to the budget unless interleave is on)."""
    interleave: bool = False
    """Repeat the stages (given as update counts) in order until the budget is spent; the last stage is cut short to fit."""

    def validate(self, p: str) -> None:
        plan_stages(self.stages, self.budget, self.interleave, prefix=p)


@dataclass
class PipelineJob:
    """A sequence of GRPO and ES stages sharing one update budget: ``evolm pipeline --config FILE``.

    ``es`` and ``grpo`` configure every stage of that method, except their budgets (``es.iterations``,
    ``grpo.steps``), which come from ``pipeline``. ``eval`` and ``probe`` are measured on the
    pipeline as a whole (see ``evolm.pipeline``).
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(name="pipeline-run"))
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    es: ESConfig = field(default_factory=ESConfig)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    eval: EvalConfig = field(default_factory=EvalConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    pipeline: PipelineSection = field(default_factory=PipelineSection)

    def validate_job(self) -> None:
        _require(self.model.dtype == "float32",
                 f"model.dtype must be float32 in a pipeline (got {self.model.dtype}): stages hand the weights over in "
                 "memory, and ES keeps float32 masters apart from a lower-precision model")
        p = self.pipeline
        if any(s.method == "grpo" for s in plan_stages(p.stages, p.budget, p.interleave)):
            from evolm.grpo import GRPOJob

            GRPOJob(run=self.run, model=self.model, grpo=self.grpo).validate_job()


# --------------------------------------------------------------------------------------------------
# the plan (pure)


@dataclass(frozen=True)
class Stage:
    method: str
    """grpo or es."""
    updates: int
    """Updates this stage runs (ES iterations or GRPO optimizer steps)."""
    index: int
    """Position in the plan (0-based); names the stage directory."""
    start: int = 0
    """Updates done in the pipeline before this stage."""

    @property
    def name(self) -> str:
        """The stage directory name, e.g. ``00-grpo``."""
        return f"{self.index:02d}-{self.method}"


def parse_stage(text: str, where: str) -> tuple[str, str]:
    """``"grpo:0.5"`` -> ``("grpo", "0.5")``; ConfigError naming ``where`` otherwise."""
    if not isinstance(text, str) or text.count(":") != 1:
        raise ConfigError(f"{where} must look like 'method:amount', e.g. 'grpo:0.5' or 'es:10' (got {text!r})")
    method, amount = (s.strip() for s in text.split(":"))
    if method not in METHODS:
        raise ConfigError(f"{where}: unknown method '{method}' (choose one of {', '.join(METHODS)})")
    if not amount:
        raise ConfigError(f"{where}: missing amount after '{method}:'")
    return method, amount


def _is_fraction(amount: str) -> bool:
    return any(c in amount for c in "./eE")


def largest_remainder(shares: Sequence[Fraction], total: int) -> list[int]:
    """Integers proportional to ``shares`` (which sum to 1) that sum to exactly ``total`` (pure).

    Each gets the floor of its quota ``share * total``; the units left over go one each to the
    largest fractional remainders, ties to the earlier entry (Hamilton's method).
    """
    quotas = [Fraction(s) * total for s in shares]
    counts = [math.floor(q) for q in quotas]
    left = total - sum(counts)
    order = sorted(range(len(quotas)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return counts


def plan_stages(stages: Sequence[str], budget: int, interleave: bool = False, prefix: str = "pipeline") -> list[Stage]:
    """The stages to run, with exact update counts summing to ``budget`` (pure).

    - Fractions (every amount written with '.', '/' or an exponent: ``0.25``, ``1/3``): each in
      (0, 1], summing to exactly 1 (compared as exact rationals, so ``0.3, 0.7`` is fine and
      ``0.33, 0.33, 0.33`` is not). Updates = ``largest_remainder(fractions, budget)``. ``interleave``
      is not allowed with fractions.
    - Counts (integers ``>= 1``): without ``interleave`` they must sum to ``budget``; with it the
      list is repeated in order until the budget is spent and the last stage is cut short.
    - Stages that get 0 updates are dropped; ``index`` numbers the stages that remain, ``start`` is
      the number of pipeline updates before each.

    Every error is a ``ConfigError`` naming the field (``{prefix}.stages[i]``, ``{prefix}.budget``...).
    """
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ConfigError(f"{prefix}.budget must be an integer >= 1 (got {budget!r})")
    if not stages:
        raise ConfigError(f"{prefix}.stages must list at least one stage, e.g. ['grpo:0.5', 'es:0.5']")
    parsed = [parse_stage(s, f"{prefix}.stages[{i}]") for i, s in enumerate(stages)]
    kinds = {_is_fraction(a) for _, a in parsed}
    if len(kinds) > 1:
        raise ConfigError(f"{prefix}.stages mixes fractions and update counts ({', '.join(stages)}): use one kind")
    methods = [m for m, _ in parsed]
    if kinds == {True}:
        if interleave:
            raise ConfigError(f"{prefix}.interleave needs stages given as update counts (e.g. 'grpo:5'), not fractions")
        shares = []
        for i, (_, a) in enumerate(parsed):
            try:
                f = Fraction(a)
            except (ValueError, ZeroDivisionError):
                raise ConfigError(f"{prefix}.stages[{i}]: '{a}' is not a number") from None
            if not 0 < f <= 1:
                raise ConfigError(f"{prefix}.stages[{i}]: a fraction must lie in (0, 1] (got {a})")
            shares.append(f)
        if sum(shares) != 1:
            raise ConfigError(f"{prefix}.stages fractions must sum to 1 (got {float(sum(shares)):g}: {', '.join(stages)})")
        counts = largest_remainder(shares, budget)
    else:
        counts = []
        for i, (_, a) in enumerate(parsed):
            try:
                n = int(a)
            except ValueError:
                raise ConfigError(f"{prefix}.stages[{i}]: '{a}' is not a number") from None
            if n < 1:
                raise ConfigError(f"{prefix}.stages[{i}]: an update count must be >= 1 (got {n})")
            counts.append(n)
        if interleave:
            cycle_methods, cycle_counts = methods, counts
            methods, counts, left = [], [], budget
            while left > 0:
                for m, n in zip(cycle_methods, cycle_counts):
                    if left <= 0:
                        break
                    methods.append(m)
                    counts.append(min(n, left))
                    left -= counts[-1]
        elif sum(counts) != budget:
            raise ConfigError(f"{prefix}.stages update counts sum to {sum(counts)} but {prefix}.budget is {budget} "
                              f"(make them equal, give fractions, or set {prefix}.interleave = true)")
    plan, start = [], 0
    for m, n in zip(methods, counts):
        if n > 0:
            plan.append(Stage(method=m, updates=n, index=len(plan), start=start))
            start += n
    return plan


def stage_seed(root: int, index: int) -> int:
    """The ``run.seed`` of stage ``index`` (independent keys per stage: no reused ES noise, no reused GRPO problems)."""
    return seed31(root, "pipeline-stage", index)


def stage_config(cfg: PipelineJob, stage: Stage, stages_dir: str | Path):
    """The ``ESJob`` or ``GRPOJob`` of one stage: the pipeline's sections with the stage's budget,
    seed and directory; held-out evaluation off (the pipeline does it once)."""
    from evolm.config import ESJob
    from evolm.grpo import GRPOJob

    run = dataclasses.replace(copy.deepcopy(cfg.run), name=stage.name, out_dir=str(stages_dir),
                              seed=stage_seed(cfg.run.seed, stage.index))
    common = dict(run=run, model=copy.deepcopy(cfg.model), task=copy.deepcopy(cfg.task),
                  generation=copy.deepcopy(cfg.generation), eval=dataclasses.replace(cfg.eval, before_after=False),
                  probe=copy.deepcopy(cfg.probe))
    if stage.method == "es":
        return ESJob(es=dataclasses.replace(cfg.es, iterations=stage.updates), **common)
    return GRPOJob(grpo=dataclasses.replace(cfg.grpo, steps=stage.updates), **common)


# --------------------------------------------------------------------------------------------------
# the combined metrics stream (pure over the files)


TOTALS = ("seconds", "gen_sequences", "gen_tokens")
"""Per-update cost fields whose running totals (``<field>_total``) the combined stream recomputes."""


def _eval_record(path: Path, stage: Stage) -> dict | None:
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    return {"step": report.get("step", 0), "stage": stage.index, "stage_method": stage.method,
            "stage_step": report.get("step", 0) - stage.start, "kind": "eval", "label": report.get("label"),
            "task": report.get("task"), **report.get("summary", {})}


def combined_records(run_path: str | Path, plan: Sequence[Stage]) -> list[dict]:
    """The pipeline's metrics stream, built from ``eval_before.json``, every stage directory's
    ``metrics.jsonl`` (in plan order) and ``eval_after.json``.

    Stage records get ``stage``, ``stage_method``, ``stage_step`` (their own ``step``) and a global
    ``step`` (= stage start + stage step); training records get pipeline-wide running totals
    ``seconds_total``, ``gen_sequences_total``, ``gen_tokens_total``. A later stage's step-0 probe
    repeats the previous stage's final probe (same weights) and is left out.
    """
    from evolm.runs import read_jsonl

    run_path = Path(run_path)
    out = []
    if plan:
        before = _eval_record(run_path / "eval_before.json", plan[0])
        if before:
            out.append(before)
    totals = {k: 0 for k in TOTALS}
    for stage in plan:
        for r in read_jsonl(run_path / "stages" / stage.name / "metrics.jsonl"):
            if stage.index > 0 and r.get("kind") == "probe" and r.get("step") == 0:
                continue
            rec = {"step": stage.start + int(r.get("step", 0)), "stage": stage.index, "stage_method": stage.method,
                   "stage_step": int(r.get("step", 0))}
            rec.update({k: v for k, v in r.items() if k not in rec and k != "step"})
            if r.get("kind") == "train":
                for k in TOTALS:
                    totals[k] += r.get(k) or 0
                    rec[f"{k}_total"] = totals[k]
            out.append(rec)
    if plan:
        after = _eval_record(run_path / "eval_after.json", plan[-1])
        if after:
            out.append(after)
    return out


def write_combined(run, plan: Sequence[Stage]) -> None:
    """Rewrite ``<run>/metrics.jsonl`` from the stage directories (atomic)."""
    from evolm.runs import atomic_write_jsonl

    atomic_write_jsonl(run.metrics_path, combined_records(run.path, plan))


# --------------------------------------------------------------------------------------------------
# running


class StageProbe:
    """The pipeline's probe as handed to each stage. A stage that starts on the weights the previous
    stage ended with in this process gets that stage's closing probe back for its step 0 instead of
    a second measurement of the same weights."""

    def __init__(self, probe: Callable[[Any, int], dict]):
        self.probe = probe
        self.last: dict | None = None
        self.carry: dict | None = None

    def start_stage(self, continues_previous: bool) -> None:
        self.carry = self.last if continues_previous else None

    def __call__(self, model, step: int) -> dict:
        if step == 0 and self.carry is not None:
            out, self.carry = dict(self.carry), None
            return out
        self.carry = None
        self.last = dict(self.probe(model, step))
        return self.last


class _NoLog:
    """A run directory view for ``heldout_eval`` that writes its JSON file but leaves the metrics
    stream alone (the pipeline's stream is rebuilt from the files)."""

    def __init__(self, run):
        self.run = run

    def write_json(self, name: str, obj) -> Path:
        return self.run.write_json(name, obj)

    def log_metrics(self, record: dict) -> None:
        pass


def stage_state(path: Path) -> str:
    """``finished`` (final weights written, run.json status finished), ``started`` or ``absent``."""
    if not (path / "config.toml").exists() or not (path / "run.json").exists():
        return "absent"
    info = json.loads((path / "run.json").read_text())
    if info.get("status") == "finished" and (path / "final" / "config.json").exists():
        return "finished"
    return "started"


def _plan_dicts(plan: Sequence[Stage]) -> list[dict]:
    return [dataclasses.asdict(s) | {"name": s.name} for s in plan]


def _check_plan_on_resume(run, plan: Sequence[Stage]) -> None:
    old = run.info().get("plan") or []
    for entry in old:
        i = entry["index"]
        if stage_state(run.path / "stages" / entry["name"]) != "finished":
            continue
        new = plan[i] if i < len(plan) else None
        if new is None or (new.method, new.updates, new.start) != (entry["method"], entry["updates"], entry["start"]):
            raise UserError(f"{run.path}: stage {entry['name']} ({entry['method']}, {entry['updates']} updates) has finished "
                            "but the resumed config plans it differently; keep pipeline.stages/budget as they were "
                            "(a larger budget may only add updates after the finished stages)")


def run_pipeline(cfg: PipelineJob, resume=None, *, model=None, tokenizer=None, task=None, probe=None,
                 run_dir=None, eval_before: dict | None = None,
                 on_stage_start: Callable[[Stage, Any], None] | None = None,
                 stage_callbacks: Mapping[str, Sequence] | None = None, quiet: bool = False):
    """Run (or resume) the pipeline ``cfg``; returns the top-level ``RunDir``.

    - ``model``/``tokenizer``/``task``: use these objects instead of building them from the config
      (on resume pass the same starting model: finished stages' weights are loaded into it).
    - ``probe(model, step) -> dict``: the held-out probe (default ``heldout.make_probe`` from ``[probe]``).
    - ``run_dir``: directory to create (default ``run.out_dir / run.name``).
    - ``eval_before``: an ``eval_before.json`` report of the same starting weights to reuse instead
      of measuring it again (split sweeps share one).
    - ``on_stage_start(stage, model)``: called just before a stage starts or resumes training.
    - ``stage_callbacks``: ``{"es": [cb(step, record), ...], "grpo": [TrainerCallback, ...]}`` passed
      to every stage of that method (tests use them to interrupt a stage).
    """
    import torch

    from evolm import config as config_mod
    from evolm import models
    from evolm.backends import make_generator
    from evolm.heldout import heldout_eval, make_probe
    from evolm.plots import plot_training
    from evolm.runs import RunDir
    from evolm.tasks import make_task

    config_mod.validate(cfg)
    p = cfg.pipeline
    plan = plan_stages(p.stages, p.budget, p.interleave)
    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    torch.set_num_threads(cfg.model.threads)

    if resume is not None:
        run = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        kind = run.info().get("kind")
        if kind != KIND:
            raise UserError(f"{run.path} is a '{kind}' run, not a pipeline; resume it with `evolm {kind} --resume`")
        _check_plan_on_resume(run, plan)
        from evolm.runs import atomic_write_text

        atomic_write_text(run.config_path, config_mod.to_toml(cfg))
        if run.info().get("plan") != _plan_dicts(plan):
            (run.path / "eval_after.json").unlink(missing_ok=True)
        elif run.info().get("status") == "finished":
            say(f"[evolm] {run.path} has already finished")
            return run
        run.update_info(status="running", plan=_plan_dicts(plan))
    else:
        if run_dir is not None:
            path = Path(run_dir.path if isinstance(run_dir, RunDir) else run_dir)
            out_dir, name = path.parent, path.name
        else:
            out_dir, name = Path(cfg.run.out_dir), cfg.run.name
        run = RunDir.create(out_dir, name, config_mod.to_toml(cfg), kind=KIND,
                            info={"model": cfg.model.spec, "task": cfg.task.name, "plan": _plan_dicts(plan)})
    say(f"[evolm] pipeline {run.path}: " + ", ".join(f"{s.method} x {s.updates}" for s in plan)
        + f" ({p.budget} updates)")

    if model is None:
        model, tokenizer = models.load(cfg.model.spec, dtype=cfg.model.dtype, threads=cfg.model.threads,
                                       device=cfg.model.device)
    if tokenizer is None:
        raise UserError("run_pipeline: pass the tokenizer together with an injected model")
    if task is None:
        task = make_task(cfg.task.name, cfg.task.reward, cfg.task.system_prompt, **cfg.task.params)
    generator = make_generator(cfg.generation.backend, model, tokenizer, cfg.generation.batch_size,
                                   cfg.generation.prefix_cache)
    if probe is None:
        probe = make_probe(cfg, tokenizer, generator, task)
    stage_probe = StageProbe(probe) if probe is not None else None

    first_state = stage_state(run.path / "stages" / plan[0].name)
    if cfg.eval.before_after and not (run.path / "eval_before.json").exists():
        if first_state != "absent":
            raise UserError(f"{run.path}: eval_before.json is missing but stage {plan[0].name} has started; "
                            "the starting weights are gone (set eval.before_after = false to continue)")
        if eval_before is not None:
            run.write_json("eval_before.json", eval_before)
        else:
            heldout_eval(cfg, model, tokenizer, generator, task, _NoLog(run), label="before", step=0, say=say)
        write_combined(run, plan)

    try:
        _run_stages(cfg, run, plan, model, tokenizer, task, generator, stage_probe, dict(stage_callbacks or {}),
                    on_stage_start, quiet, say)
    except BaseException as e:
        run.update_info(status="interrupted", error=repr(e))
        raise

    totals = {f"{k}_total": 0 for k in TOTALS}
    for r in combined_records(run.path, plan):
        if r.get("kind") == "train":
            totals = {k: r[k] for k in totals}
    run.save_final(model, tokenizer, {"step": p.budget, "method": KIND, "plan": _plan_dicts(plan), **totals})
    if cfg.eval.before_after and not (run.path / "eval_after.json").exists():
        heldout_eval(cfg, model, tokenizer, generator, task, _NoLog(run), label="after", step=p.budget, say=say)
    write_combined(run, plan)
    plot_training(run)
    from evolm.es.engine import peak_rss_mb

    run.finish(steps=p.budget, peak_rss_mb=peak_rss_mb(), **totals)
    say(f"[evolm] pipeline done: {run.path} (final weights in {run.path / 'final'})")
    return run


def _run_stages(cfg, run, plan, model, tokenizer, task, generator, stage_probe, callbacks, on_stage_start, quiet, say):
    """Run every stage of ``plan`` that has not finished; the model ends with the last stage's weights."""
    from evolm import config as config_mod
    from evolm import models
    from evolm.runs import load_weights
    from evolm.runs import RunDir

    fingerprints = dict(run.info().get("fingerprints") or {})
    pending_load: Path | None = None  # final/ of the last skipped (finished) stage
    ran_previous = False  # the previous stage ran in this process, so the model holds its final weights
    for stage in plan:
        sdir = run.path / "stages" / stage.name
        state = stage_state(sdir)
        if state == "finished":
            say(f"[evolm] stage {stage.name}: finished earlier, skipped")
            pending_load, ran_previous = sdir / "final", False
            continue
        if pending_load is not None:
            load_weights(model, pending_load)
            generator.sync_weights()
            pending_load = None
        if state == "absent":
            shutil.rmtree(sdir, ignore_errors=True)
            fingerprints[stage.name] = {"init": models.fingerprint(model)}
            run.update_info(fingerprints=fingerprints)
        if on_stage_start is not None:
            on_stage_start(stage, model)
        if stage_probe is not None:
            stage_probe.start_stage(continues_previous=ran_previous and state == "absent")
        say(f"[evolm] stage {stage.name}: {stage.method} for {stage.updates} updates "
            f"(pipeline updates {stage.start + 1}-{stage.start + stage.updates})"
            + (", resuming" if state == "started" else ""))
        scfg = stage_config(cfg, stage, run.path / "stages")
        sync = lambda *_: write_combined(run, plan)  # noqa: E731
        if stage.method == "es":
            from evolm.es.engine import run_es

            if state == "started":
                srun = RunDir.open(sdir)
            else:
                srun = RunDir.create(sdir.parent, sdir.name, config_mod.to_toml(scfg), kind="es",
                                     info={"model": cfg.model.spec, "task": task.name})
            run_es(scfg, resume=srun if state == "started" else None, model=model, tokenizer=tokenizer, task=task,
                   generator=generator, run_dir=srun, probe=stage_probe,
                   callbacks=(*callbacks.get("es", ()), sync), quiet=quiet)
        else:
            from evolm.grpo import run_grpo

            run_grpo(scfg, model=model, tokenizer=tokenizer, task=task, run_dir=sdir, probe=stage_probe,
                     resume=RunDir.open(sdir) if state == "started" else None,
                     callbacks=[*callbacks.get("grpo", ()), _trainer_sync(sync)])
            generator.sync_weights()
        RunDir(sdir).update_info(pipeline=str(run.path), stage=stage.index, stage_start=stage.start)
        fingerprints.setdefault(stage.name, {})["final"] = models.fingerprint(model)
        run.update_info(fingerprints=fingerprints)
        write_combined(run, plan)
        ran_previous = True
    if pending_load is not None:  # every stage had finished before this call
        load_weights(model, pending_load)
        generator.sync_weights()


def _trainer_sync(sync: Callable[[], None]):
    """A TrainerCallback that rebuilds the combined stream after each GRPO update is logged."""
    from transformers import TrainerCallback

    class CombinedStream(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            sync()

    return CombinedStream()


# --------------------------------------------------------------------------------------------------
# split sweeps


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


ORDERS = ("grpo-es", "es-grpo")


def sweep_points(splits: Sequence[str | float], orders: Sequence[str] = ORDERS) -> list[tuple[str, list[str]]]:
    """(point name, stages) for every (order, split) pair; ``split`` is GRPO's share of the budget (pure).

    A split of 0 or 1 is a single-method run, the same for every order, and appears once
    (``es-only`` / ``grpo-only``). Names look like ``grpo-es-0.25``.
    """
    bad = [o for o in orders if o not in ORDERS]
    if bad or not orders:
        raise UserError(f"--orders must be a comma-separated list of {', '.join(ORDERS)} (got {', '.join(orders) or 'nothing'})")
    points: list[tuple[str, list[str]]] = []
    for text in splits:
        try:
            share = Fraction(str(text))
        except (ValueError, ZeroDivisionError):
            raise UserError(f"--sweep-splits: '{text}' is not a number") from None
        if not 0 <= share <= 1:
            raise UserError(f"--sweep-splits values are GRPO's share of the budget and must lie in [0, 1] (got {text})")
        if share in (0, 1):
            name, stages = ("grpo-only", ["grpo:1.0"]) if share == 1 else ("es-only", ["es:1.0"])
            candidates = [(name, stages)]
        else:
            g, e = f"grpo:{_fraction_text(share)}", f"es:{_fraction_text(1 - share)}"
            label = _fraction_text(share).replace("/", "_")
            candidates = [(f"{o}-{label}", [g, e] if o == "grpo-es" else [e, g]) for o in orders]
        for c in candidates:
            if c[0] not in {n for n, _ in points}:
                points.append(c)
    return points


SUMMARY_FIELDS = ("greedy", "pass@1", "pass@4", "pass@8", "entropy")


def sweep_summary(sweep_path: str | Path, points: Sequence[tuple[str, list[str]]]) -> list[dict]:
    """One row per point: its plan, final held-out metrics, last probe and cost (from its files)."""
    from evolm.runs import read_jsonl

    rows = []
    for name, stages in points:
        path = Path(sweep_path) / name
        info = json.loads((path / "run.json").read_text()) if (path / "run.json").exists() else {}
        row: dict[str, Any] = {"point": name, "stages": " ".join(f"{s['method']}:{s['updates']}" for s in info.get("plan", []))
                               or " ".join(stages), "status": info.get("status", "not started")}
        for label in ("before", "after"):
            f = path / f"eval_{label}.json"
            if f.exists():
                summary = json.loads(f.read_text()).get("summary", {})
                row.update({f"{label}_{k}": summary.get(k) for k in SUMMARY_FIELDS if k in summary})
        records = read_jsonl(path / "metrics.jsonl")
        probes = [r for r in records if r.get("kind") == "probe"]
        if probes:
            row.update({f"probe_{k}": probes[-1].get(k) for k in SUMMARY_FIELDS if k in probes[-1]})
        train = [r for r in records if r.get("kind") == "train"]
        if train:
            row.update(updates=train[-1]["step"], seconds_total=train[-1].get("seconds_total"),
                       gen_tokens_total=train[-1].get("gen_tokens_total"),
                       peak_rss_mb=max(r.get("peak_rss_mb") or 0 for r in train))
        rows.append(row)
    return rows


def summary_markdown(rows: Sequence[dict]) -> str:
    columns = ["point", "stages", "status"] + [c for c in
               [f"{p}_{k}" for p in ("before", "after", "probe") for k in SUMMARY_FIELDS]
               + ["updates", "seconds_total", "gen_tokens_total", "peak_rss_mb"]
               if any(c in r for r in rows)]

    def cell(v):
        if v is None:
            return ""
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def run_split_sweep(cfg: PipelineJob, splits: Sequence[str | float] = (), orders: Sequence[str] = ORDERS,
                    resume=None, quiet: bool = False) -> Path:
    """Run a pipeline for every (order, GRPO share) in one sweep directory; returns its path.

    The sweep directory (``run.out_dir / run.name``, or ``resume``) holds ``config.toml`` (the base
    pipeline), ``run.json`` (kind ``pipeline-sweep``, the splits and orders), one pipeline run
    directory per point, and ``sweep_summary.json`` / ``sweep_summary.md`` rewritten after every point.
    Finished points are skipped and interrupted ones resumed, whether the sweep is continued with
    ``resume`` or by running the same command again. All points share one before-evaluation.
    """
    from evolm import config as config_mod
    from evolm.runs import RunDir, atomic_write_text

    config_mod.validate(cfg)
    toml = config_mod.to_toml(cfg)
    if splits:
        sweep_points([str(s) for s in splits], orders)  # refuse bad splits before creating anything
    elif resume is None:
        raise UserError("a split sweep needs --sweep-splits, e.g. 0.25,0.5,0.75")
    if resume is not None:
        sweep = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        info = sweep.info()
        if info.get("kind") != SWEEP_KIND:
            raise UserError(f"{sweep.path} is not a split sweep (kind '{info.get('kind')}')")
        if not splits:
            splits, orders = info["splits"], info["orders"]
        atomic_write_text(sweep.config_path, toml)  # overrides given on resume apply to unfinished points
    else:
        path = Path(cfg.run.out_dir) / cfg.run.name
        if "{time}" not in cfg.run.name and (path / "run.json").exists():
            sweep = RunDir.open(path)
            if sweep.info().get("kind") != SWEEP_KIND or sweep.config_path.read_text() != toml:
                raise UserError(f"{path} exists and holds another run or sweep config; choose another run.name "
                                f"or continue it with --resume {path}")
        else:
            sweep = RunDir.create(cfg.run.out_dir, cfg.run.name, toml, kind=SWEEP_KIND)
    splits = [str(s) for s in splits]
    points = sweep_points(splits, orders)
    sweep.update_info(status="running", splits=splits, orders=list(orders), points=[n for n, _ in points])

    def write_summary():
        rows = sweep_summary(sweep.path, points)
        sweep.write_json("sweep_summary.json", rows)
        atomic_write_text(sweep.path / "sweep_summary.md", summary_markdown(rows))

    base = cfg
    for name, stages in points:
        point = sweep.path / name
        state = stage_state(point)
        if state == "finished":
            continue
        pcfg = copy.deepcopy(base)
        pcfg.pipeline.stages, pcfg.pipeline.interleave = list(stages), False
        pcfg.run.out_dir, pcfg.run.name = str(sweep.path), name
        shared = [sweep.path / n / "eval_before.json" for n, _ in points if (sweep.path / n / "eval_before.json").exists()]
        before = json.loads(shared[0].read_text()) if shared else None
        if not quiet:
            print(f"[evolm] sweep point {name}: {', '.join(stages)}", flush=True)
        if state == "started":
            run_pipeline(pcfg, resume=RunDir.open(point), quiet=quiet)
        else:
            shutil.rmtree(point, ignore_errors=True)
            run_pipeline(pcfg, run_dir=point, eval_before=before, quiet=quiet)
        write_summary()
    write_summary()
    sweep.finish()
    return sweep.path


# --------------------------------------------------------------------------------------------------
# command line


def _split_list(text: str | None) -> list[str]:
    return [t.strip() for t in (text or "").split(",") if t.strip()]


def _cmd_pipeline(args) -> int:
    from evolm import config
    from evolm.runs import RunDir

    splits, orders = _split_list(args.sweep_splits), _split_list(args.orders) or list(ORDERS)
    if args.resume:
        run = RunDir.open(args.resume)
        cfg = config.load(PipelineJob, run.config_path, args.overrides)
        if run.info().get("kind") == SWEEP_KIND:
            out = run_split_sweep(cfg, splits, orders if splits else (), resume=run)
            print(out / "sweep_summary.md")
            print((out / "sweep_summary.md").read_text(), end="")
            return 0
        print(run_pipeline(cfg, resume=run).path)
        return 0
    if not args.config:
        raise UserError("evolm pipeline needs --config FILE (or --resume RUN_DIR); `evolm config pipeline` prints every field")
    cfg = config.load(PipelineJob, args.config, args.overrides)
    if splits:
        out = run_split_sweep(cfg, splits, orders)
        print((out / "sweep_summary.md").read_text(), end="")
        print(out)
        return 0
    print(run_pipeline(cfg).path)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "pipeline", help="GRPO and ES stages sharing one update budget (sequential, interleaved, split sweeps)",
        description="Run stages such as grpo:0.5, es:0.5 of one update budget on the same weights (each stage starts "
                    "from the previous stage's final weights). Writes runs/<name>/ with stages/NN-<method>/ (ordinary "
                    "ES and GRPO run directories), one metrics.jsonl with stage, stage_method, stage_step and global "
                    "step columns, held-out eval_before/after.json, and final/. `evolm config pipeline` lists every field.",
        epilog="examples:\n"
               "  evolm pipeline --config configs/pipeline-grpo-es.toml\n"
               "  evolm pipeline --config configs/pipeline-interleaved.toml --set pipeline.budget=12\n"
               "  evolm pipeline --config configs/pipeline-grpo-es.toml --sweep-splits 0.25,0.5,0.75 --orders grpo-es,es-grpo\n"
               "  evolm pipeline --resume runs/pipeline-grpo-es-20261130-010000",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", metavar="FILE", help="TOML config file (see `evolm config pipeline`)")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set pipeline.stages=['es:0.5','grpo:0.5'] (repeatable)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a killed pipeline (finished stages are skipped, the interrupted one resumes from its "
                        "newest checkpoint) or a split sweep directory")
    p.add_argument("--sweep-splits", metavar="S1,S2,...",
                   help="run one pipeline per GRPO share of the budget (values in [0, 1]; 0 and 1 are the pure "
                        "methods) and order, in subdirectories of one sweep directory, with a summary table")
    p.add_argument("--orders", metavar="O1,O2",
                   help="stage orders for --sweep-splits: grpo-es, es-grpo or both (default: both)")
    p.set_defaults(func=_cmd_pipeline)


__all__ = ["PipelineSection", "PipelineJob", "Stage", "plan_stages", "largest_remainder", "stage_config", "stage_seed",
           "combined_records", "run_pipeline", "sweep_points", "run_split_sweep", "add_cli"]
