"""Pipelines: GRPO and ES stages that share one update budget and run one after another on the same weights.

``evolm pipeline --config FILE`` runs e.g. ``stages = ["grpo:0.5", "es:0.5"]`` of ``budget = 20``
updates (10 GRPO optimizer steps, then 10 ES iterations), or an interleaved schedule
(``["grpo:5", "es:5"]`` with ``interleave = true``, repeated until the budget is spent).
``--sweep-splits 0.25,0.5,0.75 --orders grpo-es,es-grpo`` runs a grid of GRPO shares and orders as an
ordinary ``evolm sweep`` of pipelines (``sweep.split_points``).

Design decisions:

- One update is one ES iteration or one GRPO optimizer step (the budget ES and GRPO already share).
  ``plan_stages`` turns the stage list into exact update counts (pure; rounding rule in its docstring).
- ``pipeline.match`` counts the budget in another quantity every training record logs: sequences,
  tokens or seconds. The stages are then fractions of it, and stage i runs (``run.match`` /
  ``run.budget`` of its config) until the pipeline's total reaches ``budget × (the shares of stages
  0..i)``, so an overshoot of one stage (less than one update) is taken from the next stage's share
  instead of adding up; ``es.iterations`` and ``grpo.steps`` cap each stage's updates. Global step
  numbers follow the updates the stages actually ran.
- A stage is an ordinary ES or GRPO run made by ``jobs.run_es`` / ``jobs.run_grpo`` in
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
- The run around the stages is the shared lifecycle (``evolm/jobs.py``): components, run directory,
  failure marking, experiment trackers; the pipeline adds only its plan, the hand-over and the
  combined stream.
- Trackers (``run.report_to``) follow the pipeline as one run on the global update axis: stages open
  none, and every rebuild of the combined stream hands its records to the pipeline's trackers, which
  send each record once.
- ``run.save`` applies to the stages and to ``final/``, except ``none``, which a pipeline refuses: a
  resumed pipeline loads the last finished stage's ``final/``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import shutil
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

from evolm import config as config_mod
from evolm import jobs, models
from evolm.config import (DistributedConfig, ESSection, ESJob, EvalConfig, GenerationConfig, ModelConfig, ProbeConfig, RunConfig, TaskConfig,
                          require)
from evolm.console import say_for
from evolm.errors import ConfigError, UserError
from evolm.grpo import GRPOJob, GRPOSection
from evolm.heldout import check_measurements, heldout_eval, make_probe
from evolm.plots import plot_training
from evolm.runs import TOTALS, RunDir, atomic_write_jsonl, load_weights, peak_rss_mb, spent
from evolm.seeding import seed31

METHODS = ("grpo", "es")
"""Methods a stage can run."""
KIND = "pipeline"
RESUME = jobs.Resumable("pipeline.budget", may_change=("pipeline.stages", "pipeline.interleave"), from_final=True,
                        where="stage by stage (finished stages are skipped, the interrupted one resumes)")
"""A resume may grow the budget and re-plan stages that have not finished (``_check_plan_on_resume``)."""


# --------------------------------------------------------------------------------------------------
# config


@dataclass
class PipelineSection:
    budget: int = 20
    """Total budget of the pipeline, shared by its stages, in pipeline.match units: updates (one ES iteration = one GRPO optimizer step = one update), or sequences, tokens, seconds."""
    stages: list[str] = field(default_factory=lambda: ["grpo:0.5", "es:0.5"])
    """Stages in order, each "method:amount" with method grpo or es. Amounts written with '.' or '/' (0.5, 1/3) are fractions of the budget (they must sum to 1; rounded by largest remainder); integers (10) are update counts (they must sum to the budget unless interleave is on)."""
    interleave: bool = False
    """Repeat the stages (given as update counts) in order until the budget is spent; the last stage is cut short to fit."""
    match: Literal["updates", "sequences", "tokens", "seconds"] = "updates"
    """The quantity budget counts. updates: exact update counts per stage. sequences, tokens, seconds (generated sequences, generated tokens, update seconds, as every training record logs them): stages are fractions of the budget, each runs until the pipeline's running total reaches its cumulative share, and es.iterations / grpo.steps cap each stage's updates."""

    def validate(self, p: str) -> None:
        plan_stages(self.stages, self.budget, self.interleave, prefix=p, match=self.match)


@dataclass
class PipelineJob:
    """A sequence of GRPO and ES stages sharing one update budget: ``evolm pipeline --config FILE``.

    ``es`` and ``grpo`` configure every stage of that method, except their budgets (``es.iterations``,
    ``grpo.steps``), which come from ``pipeline`` (with ``pipeline.match`` other than updates they cap
    each stage's updates). ``eval`` and ``probe`` are measured on the pipeline as a whole (see
    ``evolm.pipeline``).
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(name="pipeline-run"))
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    es: ESSection = field(default_factory=ESSection)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    eval: EvalConfig = field(default_factory=EvalConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    pipeline: PipelineSection = field(default_factory=PipelineSection)

    def validate_job(self) -> None:
        require(self.run.save != "none",
                "run.save = 'none' is not available for pipelines: a resumed pipeline starts from the last finished "
                "stage's final/ weights; use 'final' (no checkpoints) instead")
        require(self.generation.backend == "hf",
                f"generation.backend must be hf in a pipeline (got {self.generation.backend}): the vLLM backend "
                "runs single ES jobs (evolm es); for vLLM rollouts in GRPO stages set grpo.use_vllm = true")
        require(self.generation.verify == "off",
                f"generation.verify='{self.generation.verify}' is not tested in pipelines; set generation.verify='off' "
                "(it verifies members of single ES jobs, evolm es)")
        require(self.model.dtype == "float32",
                f"model.dtype must be float32 in a pipeline (got {self.model.dtype}): stages hand the weights over in "
                 "memory, and ES keeps float32 masters apart from a lower-precision model")
        require(self.es.arithmetic == "exact",
                f"es.arithmetic must be exact in a pipeline (got '{self.es.arithmetic}'): reference and artifact arithmetic run in the "
                "model's dtype, and pipelines hand float32 weights between stages; run it as a single job (evolm es)")
        p = self.pipeline
        require(self.run.match == "updates",
                f"run.match is set per stage by a pipeline; set pipeline.match = '{self.run.match}' instead")
        if any(s.method == "grpo" for s in plan_stages(p.stages, p.budget, p.interleave, match=p.match)):
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
    """Updates done in the pipeline before this stage (planned; 0 when the budget is not in updates)."""
    target: float | None = None
    """For a budget in sequences, tokens or seconds: the pipeline's total this stage runs until (cumulative share x budget); None for updates."""

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


def plan_stages(stages: Sequence[str], budget: int, interleave: bool = False, prefix: str = "pipeline",
                match: str = "updates", caps: Mapping[str, int] | None = None) -> list[Stage]:
    """The stages to run, with exact update counts summing to ``budget`` (pure).

    With ``match`` sequences, tokens or seconds the amounts must be fractions (no ``interleave``): stage
    i gets ``target`` = budget × (shares of stages 0..i) in that quantity and ``updates`` = its method's
    cap (``caps[method]``: ``es.iterations`` / ``grpo.steps``; 0 when not given).

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
    if match != "updates":
        return _plan_by_share(parsed, stages, budget, interleave, prefix, match, caps or {})
    if len(kinds) > 1:
        raise ConfigError(f"{prefix}.stages mixes fractions and update counts ({', '.join(stages)}): use one kind")
    methods = [m for m, _ in parsed]
    if kinds == {True}:
        if interleave:
            raise ConfigError(f"{prefix}.interleave needs stages given as update counts (e.g. 'grpo:5'), not fractions")
        counts = largest_remainder(_fractions(parsed, stages, prefix), budget)
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


def _fractions(parsed, stages, prefix) -> list[Fraction]:
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
    return shares


def _plan_by_share(parsed, stages, budget, interleave, prefix, match, caps) -> list[Stage]:
    """Stages of a budget in sequences, tokens or seconds: fractions only, each with its cumulative target."""
    if interleave:
        raise ConfigError(f"{prefix}.interleave needs {prefix}.match = 'updates' (stages given as update counts)")
    if not all(_is_fraction(a) for _, a in parsed):
        raise ConfigError(f"{prefix}.match = '{match}' needs stages given as fractions of the budget (e.g. 'grpo:0.5'), "
                          f"not update counts (got {', '.join(stages)})")
    shares = _fractions(parsed, stages, prefix)
    plan, done = [], Fraction(0)
    for (method, _), share in zip(parsed, shares):
        done += share
        plan.append(Stage(method=method, updates=int(caps.get(method, 0)), index=len(plan), target=float(done * budget)))
    return plan


def stage_seed(root: int, index: int) -> int:
    """The ``run.seed`` of stage ``index`` (independent keys per stage: no reused ES noise, no reused GRPO problems)."""
    return seed31(root, "pipeline-stage", index)


MIN_STAGE_BUDGET = 1e-9
"""A stage whose share the stages before it already spent still runs one update (its budget is this)."""


def stage_config(cfg: PipelineJob, stage: Stage, stages_dir: str | Path, spent_before: float = 0.0):
    """The ``ESJob`` or ``GRPOJob`` of one stage: the pipeline's sections with the stage's budget,
    seed and directory; held-out evaluation off (the pipeline does it once). For a budget in
    sequences, tokens or seconds, ``spent_before`` is what the earlier stages spent: the stage's
    ``run.budget`` is the rest of its cumulative target."""
    run = dataclasses.replace(copy.deepcopy(cfg.run), name=stage.name, out_dir=str(stages_dir),
                              seed=stage_seed(cfg.run.seed, stage.index), report_to=[], save_dtype="float32")
    if stage.target is not None:
        run = dataclasses.replace(run, match=cfg.pipeline.match, budget=max(stage.target - spent_before, MIN_STAGE_BUDGET))
    common = dict(run=run, model=copy.deepcopy(cfg.model), task=copy.deepcopy(cfg.task),
                  generation=copy.deepcopy(cfg.generation), eval=dataclasses.replace(cfg.eval, before_after=False),
                  probe=copy.deepcopy(cfg.probe))
    if stage.method == "es":
        # one process: stages hand the weights over in memory (distributed.workers = "auto" would pick Ray actors)
        return ESJob(es=dataclasses.replace(cfg.es, iterations=stage.updates), distributed=DistributedConfig(workers=0), **common)
    return GRPOJob(grpo=dataclasses.replace(cfg.grpo, steps=stage.updates), **common)


# --------------------------------------------------------------------------------------------------
# the combined metrics stream (pure over the files)


def _eval_record(path: Path, stage: Stage, offset: int) -> dict | None:
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    return {"step": report.get("step", 0), "stage": stage.index, "stage_method": stage.method,
            "stage_step": report.get("step", 0) - offset, "kind": "eval", "label": report.get("label"),
            "task": report.get("task"), **report.get("summary", {})}


def stage_steps(run_path: str | Path, stage: Stage) -> int:
    """Updates a stage has run (its last training record's step; 0 before its first)."""
    train = RunDir(Path(run_path) / "stages" / stage.name).train_records()
    return int(train[-1]["step"]) if train else 0


def stage_spent(run_path: str | Path, stage: Stage, match: str) -> float:
    """What a stage has spent in ``match`` units (its last training record's running total)."""
    train = RunDir(Path(run_path) / "stages" / stage.name).train_records()
    return spent(train[-1], match) if train else 0.0


def combined_records(run_path: str | Path, plan: Sequence[Stage]) -> list[dict]:
    """The pipeline's metrics stream, built from ``eval_before.json``, every stage directory's
    ``metrics.jsonl`` (in plan order) and ``eval_after.json``.

    Stage records get ``stage``, ``stage_method``, ``stage_step`` (their own ``step``) and a global
    ``step`` (= the updates earlier stages ran + stage step); training records get pipeline-wide running totals
    ``seconds_total``, ``gen_sequences_total``, ``gen_tokens_total``. A later stage's step-0 probe
    repeats the previous stage's final probe (same weights) and is left out.
    """
    run_path = Path(run_path)
    out = []
    if plan:
        before = _eval_record(run_path / "eval_before.json", plan[0], 0)
        if before:
            out.append(before)
    totals = {k: 0 for k in TOTALS}
    offset = 0
    for stage in plan:
        start = offset
        offset += stage_steps(run_path, stage)
        for r in RunDir(run_path / "stages" / stage.name).metrics():
            if stage.index > 0 and r.get("kind") == "probe" and r.get("step") == 0:
                continue
            rec = {"step": start + int(r.get("step", 0)), "stage": stage.index, "stage_method": stage.method,
                   "stage_step": int(r.get("step", 0))}
            rec.update({k: v for k, v in r.items() if k not in rec and k != "step"})
            if r.get("kind") == "train":
                for k in TOTALS:
                    totals[k] += r.get(k) or 0
                    rec[f"{k}_total"] = totals[k]
            out.append(rec)
    if plan:
        after = _eval_record(run_path / "eval_after.json", plan[-1], offset - stage_steps(run_path, plan[-1]))
        if after:
            out.append(after)
    return out


def write_combined(run, plan: Sequence[Stage]) -> None:
    """Rewrite ``<run>/metrics.jsonl`` from the stage directories (atomic) and hand every record to the
    run's listeners (its trackers, which send each record once)."""
    records = combined_records(run.path, plan)
    atomic_write_jsonl(run.metrics_path, records)
    for listener in run.listeners:
        for record in records:
            listener(record)


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


def _plan_dicts(plan: Sequence[Stage]) -> list[dict]:
    return [{k: v for k, v in dataclasses.asdict(s).items() if not (k == "target" and v is None)} | {"name": s.name}
            for s in plan]


def _check_plan_on_resume(run, plan: Sequence[Stage]) -> None:
    old = run.info().get("plan") or []
    for entry in old:
        i = entry["index"]
        if RunDir(run.path / "stages" / entry["name"]).state() != "finished":
            continue
        new = plan[i] if i < len(plan) else None
        if new is None or (new.method, new.updates, new.start, new.target) != (entry["method"], entry["updates"], entry["start"],
                                                                               entry.get("target")):
            raise UserError(f"{run.path}: stage {entry['name']} ({entry['method']}, {entry['updates']} updates) has finished "
                            "but the resumed config plans it differently; keep pipeline.stages/budget as they were "
                            "(a larger budget may only add updates after the finished stages)")


def run_pipeline(cfg: PipelineJob, resume=None, *, model=None, tokenizer=None, task=None, probe=None,
                 run_dir=None, eval_before: dict | None = None,
                 on_stage_start: Callable[[Stage, Any], None] | None = None,
                 stage_callbacks: Mapping[str, Sequence] | None = None, quiet: bool = False) -> RunDir:
    """Run (or resume) the pipeline ``cfg``; returns the top-level ``RunDir``.

    - ``model``/``tokenizer``/``task``: use these objects instead of building them from the config
      (on resume pass the same starting model: finished stages' weights are loaded into it).
    - ``probe(model, step) -> dict``: the held-out probe (default ``heldout.make_probe`` from ``[probe]``).
    - ``run_dir``: directory to create (default ``run.out_dir / run.name``).
    - ``eval_before``: an ``eval_before.json`` report of the same starting weights to reuse instead
      of measuring it again (sweeps share one).
    - ``on_stage_start(stage, model)``: called just before a stage starts or resumes training.
    - ``stage_callbacks``: ``{"es": [cb(step, record), ...], "grpo": [TrainerCallback, ...]}`` passed
      to every stage of that method (tests use them to interrupt a stage).
    """
    config_mod.validate(cfg)
    jobs.check_new_run(cfg, resume, run_dir)
    p = cfg.pipeline
    plan = plan_stages(p.stages, p.budget, p.interleave, match=p.match, caps={"es": cfg.es.iterations, "grpo": cfg.grpo.steps})
    say = say_for(quiet)
    comps = jobs.build_components(cfg, model=model, tokenizer=tokenizer, task=task)
    check_measurements(cfg, comps.task, probe_given=probe is not None)
    if resume is not None:
        resume = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        _check_plan_on_resume(resume, plan)
        if jobs.resume_point(cfg, KIND, resume, RESUME).done:
            return jobs.open_run(cfg, KIND, resume=resume, rules=RESUME, say=say)[0]
    marking = jobs.Marking()  # entered before open_run writes "running": a signal from then on is recorded
    with jobs.marking_failures(marking):
        run, _ = jobs.open_run(cfg, KIND, resume=resume, run_dir=run_dir, info={"plan": _plan_dicts(plan)}, rules=RESUME,
                               say=say, model=comps.model, injected=model is not None, marking=marking)
        if resume is not None and run.info().get("plan") != _plan_dicts(plan):
            (run.path / "eval_after.json").unlink(missing_ok=True)
        run.update_info(plan=_plan_dicts(plan))
        say(f"[evolm] run directory: {run.path}")
        say(f"[evolm] pipeline {run.path}: " + ", ".join(
            f"{s.method} x {s.updates}" if s.target is None else f"{s.method} to {s.target:,.6g} {p.match} (at most {s.updates} updates)"
            for s in plan) + f" ({p.budget} {p.match})")
        if probe is None:
            probe = make_probe(cfg, comps.tokenizer, comps.generator, comps.task)
        stage_probe = StageProbe(probe) if probe is not None else None

        with jobs.tracking(cfg, run, KIND, once=True):
            first_state = RunDir(run.path / "stages" / plan[0].name).state()
            if cfg.eval.before_after and not (run.path / "eval_before.json").exists():
                if first_state != "absent":
                    raise UserError(f"{run.path}: eval_before.json is missing but stage {plan[0].name} has started; "
                                    "the starting weights are gone (set eval.before_after = false to continue)")
                if eval_before is not None:
                    run.write_json("eval_before.json", eval_before)
                else:
                    heldout_eval(cfg, comps.model, comps.tokenizer, comps.generator, comps.task, _NoLog(run), label="before",
                                 step=0, say=say)
                write_combined(run, plan)
            _run_stages(cfg, run, plan, comps, stage_probe, dict(stage_callbacks or {}), on_stage_start, quiet, say)

            totals = {f"{k}_total": 0 for k in TOTALS}
            for r in combined_records(run.path, plan):
                if r.get("kind") == "train":
                    totals = {k: r[k] for k in totals}
            steps = sum(stage_steps(run.path, s) for s in plan)  # = p.budget for a budget in updates
            run.save_final(comps.model, comps.tokenizer, {"step": steps, "method": KIND, "plan": _plan_dicts(plan), **totals},
                           dtype=cfg.run.save_dtype)
            if cfg.eval.before_after and not (run.path / "eval_after.json").exists():
                heldout_eval(cfg, comps.model, comps.tokenizer, comps.generator, comps.task, _NoLog(run), label="after",
                             step=steps, say=say)
            write_combined(run, plan)
            plot_training(run)
            run.finish(steps=steps, peak_rss_mb=peak_rss_mb(), weights=cfg.run.save, **totals)
    say(f"[evolm] pipeline done: {run.path} (final weights in {run.path / 'final'})")
    return run


def _run_stages(cfg, run, plan, comps, stage_probe, callbacks, on_stage_start, quiet, say):
    """Run every stage of ``plan`` that has not finished; the model ends with the last stage's weights."""
    model, generator = comps.model, comps.generator
    fingerprints = dict(run.info().get("fingerprints") or {})
    pending_load: Path | None = None  # final/ of the last skipped (finished) stage
    ran_previous = False  # the previous stage ran in this process, so the model holds its final weights
    for stage in plan:
        sdir = run.path / "stages" / stage.name
        state = RunDir(sdir).state()
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
        spent_before = sum(stage_spent(run.path, s, cfg.pipeline.match) for s in plan[:stage.index])
        if stage.target is None:
            what = f"for {stage.updates} updates (pipeline updates {stage.start + 1}-{stage.start + stage.updates})"
        else:
            what = (f"until the pipeline has spent {stage.target:,.6g} {cfg.pipeline.match} (now {spent_before:,.6g}; "
                    f"at most {stage.updates} updates)")
        say(f"[evolm] stage {stage.name}: {stage.method} {what}" + (", resuming" if state == "started" else ""))
        scfg = stage_config(cfg, stage, run.path / "stages", spent_before)
        sync = lambda *_: write_combined(run, plan)  # noqa: E731
        resume = RunDir.open(sdir) if state == "started" else None
        if stage.method == "es":
            jobs.run_es(scfg, resume=resume, model=model, tokenizer=comps.tokenizer, task=comps.task, generator=generator,
                        run_dir=sdir, probe=stage_probe, callbacks=(*callbacks.get("es", ()), sync), quiet=quiet)
        else:
            jobs.run_grpo(scfg, resume=resume, model=model, tokenizer=comps.tokenizer, task=comps.task, run_dir=sdir,
                          probe=stage_probe, callbacks=[*callbacks.get("grpo", ()), _trainer_sync(sync)], quiet=quiet)
            generator.sync_weights()
        stage_run = RunDir(sdir)
        stage_run.update_info(pipeline=str(run.path), stage=stage.index, stage_start=stage.start)
        base = stage_run.info().get("base")
        if base and stage.index > 0 and not base.get("path"):  # the stage started from the previous stage's final/
            stage_run.update_info(base={**base, "path": f"../{plan[stage.index - 1].name}"})
        fingerprints.setdefault(stage.name, {})["final"] = models.fingerprint(model)
        run.update_info(fingerprints=fingerprints)
        write_combined(run, plan)
        ran_previous = True
    if pending_load is not None:  # every stage had finished before this call
        load_weights(model, pending_load)
        generator.sync_weights()


def _trainer_sync(sync: Callable[[], None]):
    """A TrainerCallback that rebuilds the combined stream after each GRPO update is logged."""
    from transformers import TrainerCallback  # TRL's Trainer stack: imported only when a GRPO stage runs

    class CombinedStream(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kw):
            sync()

    return CombinedStream()


__all__ = ["PipelineSection", "PipelineJob", "Stage", "plan_stages", "largest_remainder", "stage_config", "stage_seed",
           "combined_records", "run_pipeline"]
