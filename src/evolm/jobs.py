"""One run lifecycle for every training job: ES, GRPO and the stages of a pipeline.

    validate config -> build components -> open the run directory -> measure (before) ->
    the method's training loop -> finish (final weights, probe, measure (after), plots, status)

Design decisions:

- ``run_es`` and ``run_grpo`` are the entry points (the CLI, sweeps and pipelines call them); each is
  the same few lines around its method's loop (``es.engine.train``, ``grpo.train``), so a run
  directory looks the same whoever wrote it and a new method needs only its loop.
- Everything that can be checked is checked before the run directory is created: the config, the
  task and its data, the model spec, and (ES) the parameter selection. A bad input leaves no
  half-written directory behind. A new run whose directory already holds a run is refused first of
  all, right after the config is validated (``check_new_run``), not after seconds of loading.
- ``open_run`` creates a run directory, or reopens one to resume. A resume never changes the past and
  never moves the run backwards (``resume_point`` checks everything before any file changes): the kind
  must match; a field other than the budget and the operational ones
  (``config.RESUME_MAY_CHANGE``) may not change; the budget may not fall below the updates already
  logged; a finished run with the same budget has nothing to do (nothing is rewritten), and with a
  larger one it is extended from ``final/`` (ES: bit-identical to having run longer) or from a
  checkpoint of its last update (GRPO needs the optimizer state), else refused. What a kill left
  half-written is cleaned first; a live process still writing the run is refused. The resolved config
  is written back and appended to ``config_history.jsonl`` with the fields the resume changed,
  records newer than the starting point are dropped, and the method's loop continues from ``Start``.
- ``open_run`` records the weights a new run starts from in ``run.json`` (``base``: their float32
  fingerprint, ``evolm.state``, and where to find them), because every analysis of the run compares
  with exactly those weights. A float32 model's step-0 weights are its spec's; a lower-precision
  model (``model.dtype = "bfloat16"``) starts from the spec *rounded*, so those rounded weights are
  saved to ``<run>/base/`` (in the model's dtype: exact, half the size of float32).
- The config arrives resolved (``config.resolve_auto``: no ``"auto"`` left), so ``config.toml`` says what
  the run used; ``open_run`` adds the reasons to ``run.json`` (``auto``), and ``run_es`` prints where
  members are scored (``[evolm] parallelism: ...``) right after the run directory.
- ``start_measurements`` takes the held-out evaluation before training and the step-0 probe, once
  (a resume that already logged them does not measure them again; a sweep can hand in a shared
  ``eval_before``); with Ray actors (``distributed.workers >= 2``) ``run_es`` hands them to
  ``es.engine.train`` to take once the actors are up, so HF actors measure them as they measure
  everything after (``measure_start``, bit-identical to one process); ``finish_run`` takes the final
  probe (unless logged), saves ``final/``, the evaluation after training and the plots, and marks the
  run finished.
- ``marking_failures`` records how a run stopped: ``interrupted`` (Ctrl-C; SIGTERM, which the CLI
  turns into ``errors.Terminated``, a KeyboardInterrupt) or ``failed`` with the error, and the last
  step logged, so ``run.json`` never says ``running`` for a run that is not (also on a full disk:
  ``RunDir.update_info`` falls back to an in-place write). A job enters it before ``open_run``, with a
  ``Marking`` that ``open_run`` fills in before it writes ``running``: a signal at that very moment is
  recorded too (only kill -9 leaves ``running``, with a writer no longer alive, which a resume accepts).
- ``tracking`` opens the experiment trackers of ``run.report_to`` (``evolm.trackers``) as a listener of
  the run directory, so every record ``log_metrics`` writes reaches them, and closes them with the
  run's outcome. A job prints its run directory as soon as it exists (its first line), so a killed
  run can be resumed from what the terminal shows.
- What ``final/`` holds follows ``run.save`` (all, final: ``final/`` in ``run.save_dtype``; none: no
  weights, ``run.json`` says ``weights = "none"``); checkpoints are the method loop's business
  (``run.checkpoints``).
- Components may be injected (tests, pipelines hand over the model in memory); otherwise they are
  built from the config.
- ``replay_run`` rebuilds an ES run's weights at any logged update from its base model and seed log
  (``es.engine.replay``), so ``run.save = "none"`` keeps nothing a user cannot get back.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from evolm import config as config_mod
from evolm import grpo, models, trackers
from evolm.backends import make_generators
from evolm.backends.base import Generator
from evolm.console import Say, say_for
from evolm.errors import UserError
from evolm.es import engine as es_engine
from evolm.es import ray_population
from evolm.heldout import check_measurements, heldout_eval, make_probe, probe_record
from evolm.plots import plot_training
from evolm.plugins import check_recorded, refuse_run_on_import
from evolm.runs import (RunDir, TrainResult, atomic_write_text, budget_reached, peak_rss_mb, save_model_dir, this_process,
                        writer_alive)
from evolm.state import lower_precision, model_fingerprint
from evolm.tasks import task_from_config
from evolm.tasks.base import Task, check_rewards


@dataclass
class Components:
    """What a training job works with."""

    model: Any
    tokenizer: Any
    task: Task
    generator: Generator | None = None
    heldout_generator: Generator | None = None
    """Held-out evaluation and probes (``generation.eval_backend``); None: ``generator``."""

    @property
    def heldout(self) -> Generator | None:
        return self.heldout_generator or self.generator


@dataclass
class Start:
    """Where a run's training loop starts: step 0, the newest checkpoint of a resumed run, or ``final/``
    of a finished run being extended."""

    step: int = 0
    checkpoint: Path | None = None
    """The directory whose weights (and state) the loop loads first: a checkpoint or ``final/``."""
    state: dict = field(default_factory=dict)
    done: bool = False
    """The run has finished with this budget already: nothing to train, nothing is rewritten."""
    replay: bool = False
    """No weights to load: the loop first re-applies the seed log's updates 1..``step`` to the base weights
    (``es.engine.replay_into``; ES only, ``Resumable.from_seed_log``). A run directory copied without its
    weights (committed under docs/, carried to another machine or session) continues where it stopped."""

    def describe(self) -> str:
        if self.checkpoint is None:
            if self.replay:
                return f"update {self.step} (its seed log replayed: no checkpoint)"
            return "the start (no checkpoint)" if self.step == 0 else f"update {self.step}"
        where = "final/" if self.checkpoint.name == "final" else f"checkpoint {self.checkpoint.name}"
        return f"update {self.step} ({where})"


def build_components(cfg, *, model=None, tokenizer=None, task: Task | None = None, generator: Generator | None = None,
                     with_generator: bool = True) -> Components:
    """The task (first: it checks its data), the model and tokenizer, and the generation backend."""
    torch.set_num_threads(cfg.model.threads)
    if task is None:
        task = task_from_config(cfg.task)
    if model is None:
        model, loaded = models.load(cfg.model.spec, dtype=cfg.model.dtype, threads=cfg.model.threads, device=cfg.model.device,
                                    revision=cfg.model.revision, trust_remote_code=cfg.model.trust_remote_code)
        tokenizer = tokenizer or loaded
    if tokenizer is None:
        raise UserError("pass the tokenizer together with an injected model")
    heldout = None
    if generator is None and with_generator:  # held-out measurements may use another backend (eval_backend)
        generator, heldout = make_generators(cfg, model, tokenizer)
    return Components(model, tokenizer, task, generator, heldout if heldout is not generator else None)


def check_kind(run: RunDir, kind: str) -> None:
    """Refuse to resume a run of another kind, naming the verb that can."""
    found = run.info().get("kind")
    if found not in (None, kind):
        wanted = {"es": "an ES run", "grpo": "a GRPO run", "pipeline": "a pipeline"}.get(kind, f"a '{kind}' run")
        raise UserError(f"{run.path} is a '{found}' run, not {wanted}; resume it with `evolm {found} --resume {run.path}`")


@dataclass(frozen=True)
class Resumable:
    """What a job kind allows on resume (``resume_point``)."""

    budget_field: str
    """The dotted config field holding the update budget (``es.iterations``, ``grpo.steps``, ...)."""
    may_change: tuple[str, ...] = ()
    """Fields besides ``config.RESUME_MAY_CHANGE`` and the budget that a resume may change."""
    from_final: bool = False
    """The loop can continue from ``final/`` (ES: weights are the whole state); else only from a checkpoint."""
    where: str = ""
    """How to say where a resume continues, when not from one checkpoint (pipelines: stage by stage)."""
    from_seed_log: bool = False
    """With no checkpoint and no ``final/``, the loop can rebuild the weights from the seed log (ES: the log is
    the whole state) and continue after its last logged update, instead of starting again from update 0."""


ES_RESUME = Resumable("es.iterations", may_change=("run.budget",), from_final=True, from_seed_log=True)
GRPO_RESUME = Resumable("grpo.steps", may_change=("run.budget",))


def _budget(cfg, rules: Resumable) -> int:
    section, name = rules.budget_field.split(".")
    return int(getattr(getattr(cfg, section), name))


def resume_point(cfg, kind: str, run: RunDir, rules: Resumable) -> Start:
    """Where ``run`` continues with config ``cfg``, after checking (without changing any file) that
    the resume neither rewrites its past nor moves it backwards; a ``UserError`` naming the fix if not."""
    check_kind(run, kind)
    info = run.info()
    if info.get("status") == "running" and writer_alive(info):
        raise UserError(f"{run.path} is being written by process {info.get('pid')} on this host (still running); "
                        "stop it, or wait for it to finish, before resuming")
    allowed = set(config_mod.RESUME_MAY_CHANGE) | set(rules.may_change) | {rules.budget_field}
    past = {k: v for k, v in config_mod.config_changes(run.config(), cfg).items() if k not in allowed}
    if past:
        shown = "; ".join(f"{k} = {_show(v['new'])} (the run's: {_show(v['old'])})" for k, v in list(past.items())[:4])
        raise UserError(f"{run.path}: a resume may change only the budget ({rules.budget_field}) and how the run is "
                        f"executed, not how its updates were computed: {shown}. Resume with the run's own values, or "
                        f"start a new run from its weights (--set model.spec={run.path})")
    budget = _budget(cfg, rules)
    logged = max((int(r["step"]) for r in run.train_records()), default=0)
    final = run.final_state() if run.state() == "finished" else None
    done = int(final.get("step", logged)) if final is not None else None
    reached = max(logged, done or 0)
    if budget < reached:
        raise UserError(f"{run.path} has made {reached} updates; {rules.budget_field} = {budget} would discard "
                        f"updates {budget + 1}-{reached}. Resume with {rules.budget_field} >= {reached}")
    found = run.latest_checkpoint()
    checkpoint = Start(int(found[1]["step"]), found[0], found[1]) if found else Start()
    if run.state() == "finished" and budget > reached and not _exact_final(run, final):
        saved = run.config().get("run", {})
        raise UserError(f"{run.path} finished without float32 final weights (run.save = {saved.get('save', 'all')}, "
                        f"run.save_dtype = {saved.get('save_dtype', 'float32')}), so it cannot be extended in place "
                        f"without redoing its updates. Rebuild its weights (`evolm replay {run.path} --step {reached}` "
                        f"for ES) and start a new run from them (--set model.spec=DIR)")
    if done is not None:
        if budget == done or budget_reached(cfg.run, final, done):  # the update cap, or run.match's budget, spent
            return Start(done, run.path / "final", final, done=True)
        if rules.from_final:
            return Start(done, run.path / "final", final)
        if checkpoint.step != done:
            raise UserError(f"{run.path} finished at update {done} but its newest checkpoint is update {checkpoint.step}; "
                            f"{kind} continues only from a checkpoint (final/ lacks the optimizer state), so it cannot "
                            f"be extended to {budget} without redoing and rewriting finished updates. Start a new run "
                            f"from its weights instead (--set model.spec={run.path})")
        return checkpoint
    partial = run.final_state() if rules.from_final else None  # final/ written, then killed before "finished"
    if partial is not None and checkpoint.step < int(partial.get("step", -1)) <= budget:
        return Start(int(partial["step"]), run.path / "final", partial)
    if rules.from_seed_log and found is None:
        replayed = seed_log_point(run)
        if replayed is not None:
            return replayed
    return checkpoint


def seed_log_point(run: RunDir) -> Start | None:
    """Where a run without weights continues by replay: its last update logged in both ``seed_log.jsonl``
    and ``metrics.jsonl`` (a kill between the two writes loses that update, which is redone), with that
    record's running totals as the state; None when it logged no update. The seed log must be gapless
    from update 1 (a torn or hand-edited log is refused: replaying it would not rebuild the run's weights)."""
    steps = [int(r["step"]) for r in run.seed_log() if "iteration" in r]
    if not steps:
        return None
    if steps != list(range(1, len(steps) + 1)):
        raise UserError(f"{run.path}/seed_log.jsonl does not hold updates 1..{max(steps)} in order, so its weights "
                        "cannot be rebuilt by replay; restore the run's seed log, or start a new run")
    records = {int(r["step"]): r for r in run.train_records()}
    step = max((s for s in steps if s in records), default=0)
    if step == 0:
        return None
    state = {k: records[step][k] for k in ("seconds_total", "gen_sequences_total", "gen_tokens_total") if k in records[step]}
    return Start(step, None, {"step": step, **state}, replay=True)


def _exact_final(run: RunDir, final: dict | None) -> bool:
    """Whether ``final/`` holds the run's weights as trained (saved, and not cast to a lower precision)."""
    if final is None:
        return False
    return run.config().get("run", {}).get("save_dtype", "float32") == "float32"


def _show(value) -> str:
    return config_mod.toml_inline(value) if value is not None else "(unset)"


BASE_DIR = "base"
"""Where a run whose model is not float32 keeps the (rounded) weights it started from."""


def base_record(cfg, model, injected: bool) -> dict:
    """What ``run.json`` says about the weights a run starts from (``base``): their fingerprint
    (``evolm.state.model_fingerprint``: float32 values, tied tensors once), the config's spec and
    dtype, ``weights``: ``"spec"`` (the spec's own weights), ``"base"`` (the model's weights were
    rounded to a lower precision; saved in ``<run>/base/``) or ``"injected"`` (a model handed in by the
    caller: the spec need not hold these weights; the fingerprint decides), and ``path``: where the
    weights are, relative to the run directory, when evolm knows (``base``; a pipeline stage points
    at the stage before it). ``revision``: ``model.revision`` (None when unset)."""
    low = lower_precision(model)
    weights = BASE_DIR if low else ("injected" if injected else "spec")
    return {"fingerprint": model_fingerprint(model), "spec": cfg.model.spec, "revision": cfg.model.revision or None,
            "dtype": cfg.model.dtype, "weights": weights, "path": BASE_DIR if weights == BASE_DIR else None,
            "rounded_to": low or None}


def open_run(cfg, kind: str, *, resume: RunDir | str | Path | None = None, run_dir: str | Path | None = None,
             info: dict | None = None, rules: Resumable | None = None, say: Say = print, model=None,
             injected: bool = False, marking: Marking | None = None) -> tuple[RunDir, Start]:
    """Create the run directory (``run_dir``, default ``run.out_dir / run.name``) or reopen ``resume``
    (checked by ``resume_point`` with ``rules``). A resume of a run that has nothing left to do returns
    ``Start(done=True)`` and changes no file.

    ``model`` (a new run): the model training starts from; its fingerprint goes into ``run.json``
    (``base_record``), and a lower-precision model's weights into ``<run>/base/``. ``injected``: the
    caller built the model (its weights need not be ``model.spec``'s)."""
    refuse_run_on_import()  # a user's script training at module level, imported by evolm to find its reward
    toml = config_mod.to_toml(cfg)
    resolved = config_mod.to_dict(cfg)
    trackers.check(cfg.run.report_to)  # a missing tracker package fails before any file changes
    if resume is not None:
        run = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        for done in run.clean_temporaries():
            say(f"[evolm] {done} (left half-done by a process that was killed)")
        if rules is None:
            raise ValueError("open_run needs the job kind's resume rules to resume a run")
        start = resume_point(cfg, kind, run, rules)
        if start.done:
            say(f"[evolm] {run.path} has already finished its {start.step} updates: nothing to do "
                f"(extend it with --set {rules.budget_field}=N)")
            return run, start
        changes = config_mod.config_changes(run.config(), cfg)
        atomic_write_text(run.config_path, toml)
        run.log_config("resume", start.step, resolved, changes, resumed_from=start.describe())
        run.truncate_after(start.step)  # a resume without checkpoint keeps the step-0 measurements
        kept = run.retire_eval_after()
        if kept is not None:
            say(f"[evolm] {kept.name}: the held-out evaluation of the weights before this resume (eval_after.json is "
                "measured again when the run finishes)")
        if marking is not None:  # from here on the caller's marking_failures records how the run stops
            marking.run = run
        run.update_info(status="running", resumed_from_step=start.step, **this_process(),
                        **({"auto": cfg.auto_notes} if getattr(cfg, "auto_notes", None) else {}))
        if model is not None:
            restore_base_dir(run, model, say)
        changed = ", ".join(f"{k} {_show(v['old'])} -> {_show(v['new'])}" for k, v in changes.items())
        say(f"[evolm] resuming {run.path} {rules.where or 'from ' + start.describe()}"
            + (f"; changed: {changed}" if changed else ""))
        return run, start
    if run_dir is not None:
        path = Path(run_dir.path if isinstance(run_dir, RunDir) else run_dir)
        out_dir, name = path.parent, path.name
    else:
        out_dir, name = Path(cfg.run.out_dir), cfg.run.name
    base = base_record(cfg, model, injected) if model is not None else None
    if marking is not None and "{time}" not in name:  # create writes "running": marked from then on
        marking.path = Path(out_dir) / name
    run = RunDir.create(out_dir, name, toml, kind=kind, info={"model": cfg.model.spec, "task": cfg.task.name, **(info or {})})
    if marking is not None:
        marking.run = run
    run.log_config("create", 0, resolved)
    if getattr(cfg, "auto_notes", None):  # what "auto" became on this machine (config.toml holds the values)
        run.update_info(auto=cfg.auto_notes)
    if base is not None:
        if base["weights"] == BASE_DIR:
            save_model_dir(run.path / BASE_DIR, model, None, extra={"base.json": base})
        run.update_info(base=base)
    return run, Start()


def check_new_run(cfg, resume=None, run_dir=None) -> None:
    """A new run whose directory already holds a run is refused here, right after the config is validated,
    not seconds later when ``open_run`` creates it (``RunDir.check_new``)."""
    if resume is not None:
        return
    path = Path(run_dir.path if isinstance(run_dir, RunDir) else run_dir) if run_dir is not None else None
    RunDir.check_new(*((path.parent, path.name) if path is not None else (cfg.run.out_dir, cfg.run.name)))


def restore_base_dir(run: RunDir, model, say: Say = print) -> None:
    """A resumed run whose ``run.json`` keeps its rounded base in ``<run>/base/`` but whose directory lacks it
    (a copy without weights: a committed run continued by replaying its seed log) gets it back from ``model``,
    the rounded weights the resume starts from, when their fingerprint is the recorded one; the analyses read
    ``base/`` as the run's own base. Another fingerprint writes nothing and says so."""
    base = run.info().get("base") or {}
    if base.get("weights") != BASE_DIR or (run.path / BASE_DIR).exists():
        return
    if model_fingerprint(model) != base.get("fingerprint"):
        say(f"[evolm] {run.path / BASE_DIR} is missing and the model this resume starts from is not the recorded base "
            "(another fingerprint): not rebuilt; analyses need --base")
        return
    save_model_dir(run.path / BASE_DIR, model, None, extra={"base.json": base})
    say(f"[evolm] {run.path / BASE_DIR}: the run's rounded base weights rebuilt (fingerprint {base['fingerprint']}, as recorded)")


def record_plugins(run: RunDir, task: Task) -> None:
    """Write where the run's task and reward functions come from into ``run.json`` (``plugins``), so a later
    verb that cannot import them names the package or file it needs (``plugins.check_recorded``)."""
    found = task.plugins()
    if found:
        run.update_info(plugins=found)


@dataclass
class Marking:
    """The run whose outcome a ``marking_failures`` block records. A job enters the block before it opens
    its run and hands this to ``open_run``, which names the run here before ``run.json`` says "running":
    a signal at any moment after that (a SIGTERM the instant a resume wrote "running") is recorded."""

    run: RunDir | None = None
    path: Path | None = None
    """A run directory being created: its ``run.json`` (when written) is the one to mark."""

    def target(self) -> RunDir | None:
        if self.run is not None:
            return self.run
        if self.path is not None and (self.path / "run.json").exists():
            return RunDir(self.path)
        return None


@contextlib.contextmanager
def marking_failures(run: RunDir | Marking) -> Iterator[None]:
    """Record in ``run.json`` how a run stopped when its body raises (and re-raise). ``run``: the run, or
    a ``Marking`` that ``open_run`` fills in (nothing is recorded while it names no run)."""
    try:
        yield
    except BaseException as e:
        run = run.target() if isinstance(run, Marking) else run
        if run is None:
            raise
        status = "interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "failed"
        try:
            steps = [r["step"] for r in run.train_records()]
            run.update_info(status=status, stopped_at_step=steps[-1] if steps else 0, error=repr(e)[:2000])
        except OSError:  # the disk refuses even that: the original error is the one to report
            pass
        raise


@contextlib.contextmanager
def tracking(cfg, run: RunDir, kind: str, start: Start | None = None, *, once: bool = False) -> Iterator[trackers.Trackers]:
    """Open the trackers of ``run.report_to`` for ``run`` (a listener of its ``log_metrics``) and close
    them with the run's outcome. ``start``: where a resumed run continues (TensorBoard purges later
    events); ``once``: send each record once (a pipeline re-hands its whole rebuilt stream)."""
    info = run.info()
    resumed = "trackers" in info
    opened = trackers.open_trackers(
        cfg.run.report_to, run.path, kind=kind, config=config_mod.to_dict(cfg), config_toml=config_mod.to_toml(cfg),
        project=cfg.run.tracker_project, wandb_mode=cfg.run.wandb_mode, previous=info.get("trackers"),
        resume_step=start.step if resumed and start is not None else None, once=once,
        sent=[trackers.record_key(r) for r in run.metrics()] if once else ())
    if opened:
        run.update_info(trackers=opened.info())
    run.listeners.append(opened)
    status = "failed"
    try:
        yield opened
        status = "finished"
    except (KeyboardInterrupt, SystemExit):
        status = "interrupted"
        raise
    finally:
        run.listeners.remove(opened)
        opened.close(status)


def start_measurements(cfg, comps: Components, run: RunDir, start: Start, method: str, *, probe: Callable | None = None,
                       eval_before: dict | None = None, say: Say = print) -> Callable | None:
    """The held-out evaluation before training and the step-0 probe (each once); returns the probe."""
    probe = run_probe(cfg, comps, probe)
    measure_start(cfg, comps, run, start, method, probe=probe, eval_before=eval_before, say=say)
    return probe


def run_probe(cfg, comps: Components, probe: Callable | None) -> Callable | None:
    """The probe a run logs: the one handed in, else ``heldout.make_probe`` from ``[probe]`` (None: no probe)."""
    return probe if probe is not None else make_probe(cfg, comps.tokenizer, comps.heldout, comps.task)


def measure_start(cfg, comps: Components, run: RunDir, start: Start, method: str, *, probe: Callable | None,
                  eval_before: dict | None = None, say: Say = print) -> None:
    """``start_measurements`` with the probe made: what ``run_es`` measures once its Ray actors are up."""
    logged = {(r.get("kind"), r.get("step")) for r in run.metrics()}
    if cfg.eval.before_after and start.step == 0 and ("eval", 0) not in logged:
        if eval_before is not None:  # measured on the same starting weights elsewhere (a sweep's first point)
            run.write_json("eval_before.json", eval_before)
            run.log_metrics({"step": 0, "kind": "eval", "label": "before", "task": eval_before.get("task"),
                             **eval_before.get("summary", {})})
        else:
            heldout_eval(cfg, comps.model, comps.tokenizer, comps.heldout, comps.task, run, label="before", step=0, say=say)
    if probe is not None and start.step == 0 and ("probe", 0) not in logged:
        run.log_metrics(probe_record(probe, comps.model, 0, method))


def finish_run(cfg, comps: Components, run: RunDir, method: str, result: TrainResult, *,
               probe: Callable | None = None, state: dict | None = None, say: Say = print) -> None:
    """Final probe (unless logged), ``final/``, the evaluation after training, plots, status finished."""
    if probe is not None and result.steps not in {r["step"] for r in run.probes()}:
        run.log_metrics(probe_record(probe, comps.model, result.steps, method))
    if cfg.run.save != "none":
        run.save_final(result.final_model, comps.tokenizer, {"step": result.steps, "method": method, **result.totals,
                                                             **(state or {})}, dtype=cfg.run.save_dtype)
    if cfg.eval.before_after:
        heldout_eval(cfg, comps.model, comps.tokenizer, comps.heldout, comps.task, run, label="after",
                     step=result.steps, say=say)
    plot_training(run)
    run.finish(steps=result.steps, peak_rss_mb=peak_rss_mb(), weights=cfg.run.save, **result.totals)
    say(f"[evolm] done: {run.path} " + done_note(run, cfg.run.save, method))


def done_note(run: RunDir, save: str, method: str) -> str:
    """Where the run's final weights are (or how to rebuild them)."""
    if save != "none":
        return f"(final weights in {run.path / 'final'})"
    if method == es_engine.METHOD:
        return f"(run.save = none: no weights saved; rebuild them with `evolm replay {run.path} --step N`)"
    return "(run.save = none: no weights saved)"


# -- the jobs ---------------------------------------------------------------------------------------

def run_es(cfg, resume=None, *, model=None, tokenizer=None, task: Task | None = None, generator: Generator | None = None,
           run_dir=None, probe: Callable | None = None, callbacks: tuple[Callable, ...] = (), quiet: bool = False,
           eval_before: dict | None = None, population_factory: Callable | None = None) -> RunDir:
    """Run (or resume) ES post-training described by ``cfg`` (an ``ESJob``); returns the run directory.

    ``model``/``tokenizer``/``task``/``generator`` may be injected (tests, pipelines); otherwise they
    are built from the config. ``callbacks`` are called as ``cb(step, record)`` after every update.
    ``probe(model, step) -> dict`` (default: ``heldout.make_probe`` from ``[probe]``) is logged as a
    ``kind="probe"`` record at step 0, every ``probe.every`` updates and at the end.
    ``population_factory(cfg, params, generator, task)``: who scores the members in this process
    (``es.engine.train``'s; e.g. experiments/refnum/null_walk.py's seeded random fitness); refused with
    Ray actors, which bring their own.
    """
    say = say_for(quiet)
    config_mod.validate(cfg)
    check_new_run(cfg, resume, run_dir)
    if population_factory is not None and cfg.distributed.workers >= 2:
        raise UserError("a population_factory scores members in this process; set distributed.workers=0")
    ray_population.check_local_gpus(cfg)  # GPUs a private Ray instance cannot give: refused before anything loads
    if resume is not None:
        resume = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        point = resume_point(cfg, es_engine.METHOD, resume, ES_RESUME)
        if point.done:  # before loading anything
            return open_run(cfg, es_engine.METHOD, resume=resume, rules=ES_RESUME, say=say)[0]
        check_replay_resume(cfg, resume, point)
    # the actors' CPUs (and GPUs) on the Ray cluster, reserved before anything loads, or refused in one line
    placement = ray_population.reserve(cfg, say) if cfg.distributed.workers >= 2 else None
    try:
        comps = build_components(cfg, model=model, tokenizer=tokenizer, task=task, generator=generator)
        evaluator = None
        if cfg.distributed.workers >= 2:  # evaluations (probes, after training) run on the HF actors once they start
            evaluator = comps.heldout_generator = ray_population.ActorsOrDriver(comps.heldout)
        es_engine.check_training_data(cfg, comps.task)
        check_rewards(comps.task, comps.tokenizer)
        check_measurements(cfg, comps.task, probe_given=probe is not None)
        header = es_engine.seed_log_header(resume.seed_log()) if resume is not None else None
        # refuses a selection that matches nothing, or a config that is not the resumed run's, before any file changes
        # a vLLM generator wraps the ParamSet so that members are perturbed inside its engine; with vLLM actors
        # (backends.actors_generate) the driver's generator is HF and each actor wraps its own engine's
        es_engine.check_memory(comps.model, cfg)  # masters and noise table beside the model: refused before allocating
        params = es_engine.build_paramset(comps.model, cfg, header, comps.generator)
        marking = Marking()  # entered before open_run writes "running": a signal from then on is recorded
        with marking_failures(marking):
            run, start = open_run(cfg, es_engine.METHOD, resume=resume, run_dir=run_dir, rules=ES_RESUME, say=say,
                                  model=comps.model, injected=model is not None, marking=marking)
            record_plugins(run, comps.task)
            say(f"[evolm] run directory: {run.path}")
            say(f"[evolm] {config_mod.parallelism(cfg)}")
            for note in getattr(cfg, "auto_notes", []):  # the generation dtype "auto" chose (bf16 on CUDA and AMX CPUs)
                if note.startswith("model.dtype = bfloat16"):
                    say(f"[evolm] {note}")
            frees_driver = probe is None  # a probe handed in may read the driver's model: the driver keeps it
            with tracking(cfg, run, es_engine.METHOD, start):
                factory, measure = population_factory, None
                if evaluator is None:
                    probe = start_measurements(cfg, comps, run, start, es_engine.METHOD, probe=probe, eval_before=eval_before,
                                               say=say)
                else:  # K Ray actors (evolm.es.ray_population): they need the model's source, and they measure the start
                    probe = run_probe(cfg, comps, probe)
                    factory = ray_population.factory(comps, run, checkpoint=start.checkpoint, header=header,
                                                     injected=model is not None, placement=placement, evaluator=evaluator,
                                                     free=frees_driver, say=say)
                    measure = functools.partial(measure_start, cfg, comps, run, start, es_engine.METHOD, probe=probe,
                                                eval_before=eval_before, say=say)
                try:
                    result = es_engine.train(cfg, comps, run, start, params, probe=probe, callbacks=callbacks, say=say,
                                             quiet=quiet, population_factory=factory, on_population=measure)
                    finish_run(cfg, comps, run, es_engine.METHOD, result, probe=probe, say=say)
                finally:
                    if evaluator is not None and evaluator.population is not None:  # it evaluated after training
                        evaluator.population.close()
                        evaluator.population = None
        if generator is None:  # built here: release it (a vLLM engine's processes)
            comps.generator.close()
    finally:
        if placement is not None:
            placement.release()
    return run


def check_replay_resume(cfg, run: RunDir, start: Start) -> None:
    """A resume that rebuilds its weights from the seed log (``Start.replay``) is tested in one process on
    the HF backend (exact and reference arithmetic, full-rank and low-rank): anything else is refused in one
    line (how a run is executed may change on resume, and the result is bit-identical)."""
    if not start.replay:
        return
    workers = cfg.distributed.workers
    why = (f"{run.path} has no checkpoint, so its weights would be rebuilt from its seed log (update {start.step}), "
           "which is tested in one process on the HF backend only")
    if cfg.generation.backend != "hf":
        raise UserError(f"{why}; rebuild them with `evolm replay {run.path} --step {start.step}` and start a new run "
                        "from that directory (--set model.spec=DIR)")
    if isinstance(workers, int) and workers >= 2:
        raise UserError(f"{why}; resume with --set distributed.workers=0 (the same weights), and set it back after the "
                        "run's first checkpoint")


def run_grpo(cfg, resume=None, *, model=None, tokenizer=None, task: Task | None = None, run_dir=None,
             init_state_dict=None, probe: Callable | None = None, callbacks: list | None = None, quiet: bool = False,
             eval_before: dict | None = None) -> RunDir:
    """Train with TRL's GRPOTrainer (``evolm.grpo``) and write a run directory; returns its ``RunDir``.

    - ``model``/``tokenizer``/``task``: use these objects instead of building them from the config.
    - ``run_dir``: directory to create, absent or empty (default ``run.out_dir / run.name``).
    - ``init_state_dict``: starting weights loaded into the model before training (pipelines).
    - ``probe(model, step) -> dict``: held-out probe (default ``heldout.make_probe`` from ``[probe]``).
    - ``resume``: a GRPO ``RunDir`` (or path) to continue from its newest checkpoint up to ``grpo.steps``.
      Pass the same ``model``/``init_state_dict`` as the original call (they define the starting
      weights, and with ``beta > 0`` the reference); the checkpoint's weights replace them.
    - ``callbacks``: extra ``transformers.TrainerCallback`` objects (tests use one to interrupt a run).
    """
    say = say_for(quiet)
    config_mod.validate(cfg)
    check_new_run(cfg, resume, run_dir)
    grpo.import_trl()
    if resume is not None:
        resume = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        point = resume_point(cfg, grpo.METHOD, resume, GRPO_RESUME)
        if point.done:  # before loading anything
            return open_run(cfg, grpo.METHOD, resume=resume, rules=GRPO_RESUME, say=say)[0]
        grpo.check_resumable(point, resume.config(), cfg)
    need_generator = cfg.eval.before_after or (probe is None and cfg.probe.every > 0)
    comps = build_components(cfg, model=model, tokenizer=tokenizer, task=task, with_generator=need_generator)
    if init_state_dict is not None:
        comps.model.load_state_dict(init_state_dict)
    examples = grpo.training_examples(cfg, comps.task)
    check_rewards(comps.task, comps.tokenizer)
    check_measurements(cfg, comps.task, probe_given=probe is not None)
    marking = Marking()  # entered before open_run writes "running": a signal from then on is recorded
    with marking_failures(marking):
        run, start = open_run(cfg, grpo.METHOD, resume=resume, run_dir=run_dir, rules=GRPO_RESUME, say=say,
                              model=comps.model, injected=model is not None or init_state_dict is not None,
                              marking=marking)
        grpo.check_resumable(start)
        record_plugins(run, comps.task)
        say(f"[evolm] run directory: {run.path}")
        with tracking(cfg, run, grpo.METHOD, start):
            probe = start_measurements(cfg, comps, run, start, grpo.METHOD, probe=probe, eval_before=eval_before,
                                       say=say)
            result = grpo.train(cfg, comps, run, start, examples, probe=probe, callbacks=callbacks or [],
                                fresh_start=model is not None or init_state_dict is not None, quiet=quiet)
            finish_run(cfg, comps, run, grpo.METHOD, result, probe=probe, say=say)
    return run


# -- rebuilding an ES run's weights -------------------------------------------------------------------

def replay_line(run_path, spec: str, step: int, out) -> str:
    """What ``replay_run`` says it rebuilds: the base model plus updates 1..step (step 0: the base model alone)."""
    what = ("with no update (step 0, the base model)" if step == 0 else "+ update 1 of the seed log" if step == 1
            else f"+ updates 1..{step} of the seed log")
    return f"[evolm] replaying {run_path}: {spec} {what} -> {out}"


def replay_run(run_dir, step: int | None = None, out=None, *, device: str | None = None, say: Say = print) -> Path:
    """Write the model an ES run had after ``step`` updates (default: its last logged update) to ``out``
    (default ``RUN_DIR/replay/step_NNNNNN``): the run's base model (``model.spec`` loaded as the run
    loaded it) plus the logged updates 1..step of ``seed_log.jsonl``, saved in float32 (the masters) as
    a Hugging Face directory, bit-identical to the run's checkpoint or ``final/`` of that step."""
    run = RunDir.open(run_dir)
    info = run.info()
    if info.get("kind") != es_engine.METHOD:
        raise UserError(f"{run.path} is a '{info.get('kind')}' run; only ES runs can be rebuilt from their seed log "
                        "(a GRPO run's weights are its checkpoints and final/)")
    if int(info.get("stage") or 0) > 0:
        raise UserError(f"{run.path} is stage {info['stage']} of the pipeline {info.get('pipeline')}: it started from the "
                        "previous stage's weights, not from model.spec; rebuild those first (or use its final/)")
    check_recorded(info.get("plugins"), str(run.path))  # its task and rewards import here, or one line naming them
    cfg = config_mod.load(config_mod.ESJob, run.config_path)
    log = run.seed_log()
    header = es_engine.seed_log_header(log)
    updates = [r for r in log if r.get("kind") != "header" and "step" in r]
    if header is None:
        raise UserError(f"{run.path} has no seed-log header (seed_log.jsonl); it cannot be replayed")
    last = max((int(r["step"]) for r in updates), default=0)
    step = last if step is None else int(step)
    if not 0 <= step <= last:
        raise UserError(f"--step {step} is outside the run's logged updates 0..{last} (seed_log.jsonl)")
    out = Path(out) if out else run.path / "replay" / f"step_{step:06d}"
    torch.set_num_threads(cfg.model.threads)
    say(replay_line(run.path, cfg.model.spec, step, out))
    model, tokenizer = models.load(cfg.model.spec, dtype=cfg.model.dtype, threads=cfg.model.threads,
                                   device=device or cfg.model.device, revision=cfg.model.revision,
                                   trust_remote_code=cfg.model.trust_remote_code)
    params = es_engine.replay(model, [header] + [r for r in updates if int(r["step"]) <= step], cfg)
    final = es_engine.float32_model(model, params)
    save_model_dir(out, final, tokenizer, extra={"state.json": {"step": step, "method": es_engine.METHOD,
                                                                  "replayed_from": str(run.path)}})
    return out
