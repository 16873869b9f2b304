"""One run lifecycle for every training job: ES, GRPO and the stages of a pipeline.

    validate config -> build components -> open the run directory -> measure (before) ->
    the method's training loop -> finish (final weights, probe, measure (after), plots, status)

Design decisions:

- ``run_es`` and ``run_grpo`` are the entry points (the CLI, sweeps and pipelines call them); each is
  the same few lines around its method's loop (``es.engine.train``, ``grpo.train``), so a run
  directory looks the same whoever wrote it and a new method needs only its loop.
- Everything that can be checked is checked before the run directory is created: the config, the
  task and its data, the model spec, and (ES) the parameter selection. A bad input leaves no
  half-written directory behind.
- ``open_run`` creates a run directory, or reopens one to resume: the kind must match, the resolved
  config (with the overrides given on resume) is written back, records newer than the newest
  checkpoint are dropped, and the method's loop continues from ``Start`` (step, checkpoint, state).
- ``open_run`` records the weights a new run starts from in ``run.json`` (``base``: their float32
  fingerprint, ``evolm.state``, and where to find them), because every analysis of the run compares
  with exactly those weights. A float32 model's step-0 weights are its spec's; a lower-precision
  model (``model.dtype = "bfloat16"``) starts from the spec *rounded*, so those rounded weights are
  saved to ``<run>/base/`` (in the model's dtype: exact, half the size of float32).
- ``start_measurements`` takes the held-out evaluation before training and the step-0 probe, once
  (a resume that already logged them does not measure them again; a sweep can hand in a shared
  ``eval_before``); ``finish_run`` takes the final probe (unless logged), saves ``final/``, the
  evaluation after training and the plots, and marks the run finished.
- ``marking_failures`` records how a run stopped: ``interrupted`` (Ctrl-C, SIGTERM as SystemExit) or
  ``failed`` with the error, and the last step logged, so ``run.json`` never says ``running`` for a
  run that is not.
- Components may be injected (tests, pipelines hand over the model in memory); otherwise they are
  built from the config.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from evolm import config as config_mod
from evolm import grpo, models
from evolm.backends import make_generator
from evolm.backends.base import Generator
from evolm.console import Say, say_for
from evolm.errors import UserError
from evolm.es import engine as es_engine
from evolm.heldout import heldout_eval, make_probe, probe_record
from evolm.plots import plot_training
from evolm.runs import RunDir, TrainResult, atomic_write_text, peak_rss_mb, save_model_dir
from evolm.state import lower_precision, model_fingerprint
from evolm.tasks import make_task
from evolm.tasks.base import Task


@dataclass
class Components:
    """What a training job works with."""

    model: Any
    tokenizer: Any
    task: Task
    generator: Generator | None = None


@dataclass
class Start:
    """Where a run's training loop starts: step 0, or the newest checkpoint of a resumed run."""

    step: int = 0
    checkpoint: Path | None = None
    state: dict = field(default_factory=dict)


def build_components(cfg, *, model=None, tokenizer=None, task: Task | None = None, generator: Generator | None = None,
                     with_generator: bool = True) -> Components:
    """The task (first: it checks its data), the model and tokenizer, and the generation backend."""
    torch.set_num_threads(cfg.model.threads)
    if task is None:
        task = make_task(cfg.task.name, cfg.task.reward, cfg.task.system_prompt, **cfg.task.params)
    if model is None:
        model, loaded = models.load(cfg.model.spec, dtype=cfg.model.dtype, threads=cfg.model.threads, device=cfg.model.device)
        tokenizer = tokenizer or loaded
    if tokenizer is None:
        raise UserError("pass the tokenizer together with an injected model")
    if generator is None and with_generator:
        generator = make_generator(cfg.generation.backend, model, tokenizer, cfg.generation.batch_size,
                                   cfg.generation.prefix_cache)
    return Components(model, tokenizer, task, generator)


def check_kind(run: RunDir, kind: str) -> None:
    """Refuse to resume a run of another kind, naming the verb that can."""
    found = run.info().get("kind")
    if found not in (None, kind):
        wanted = {"es": "an ES run", "grpo": "a GRPO run", "pipeline": "a pipeline"}.get(kind, f"a '{kind}' run")
        raise UserError(f"{run.path} is a '{found}' run, not {wanted}; resume it with `evolm {found} --resume {run.path}`")


BASE_DIR = "base"
"""Where a run whose model is not float32 keeps the (rounded) weights it started from."""


def base_record(cfg, model, injected: bool) -> dict:
    """What ``run.json`` says about the weights a run starts from (``base``): their fingerprint
    (``evolm.state.model_fingerprint``: float32 values, tied tensors once), the config's spec and
    dtype, ``weights``: ``"spec"`` (the spec's own weights), ``"base"`` (the model's weights were
    rounded to a lower precision; saved in ``<run>/base/``) or ``"injected"`` (a model handed in by the
    caller: the spec need not hold these weights; the fingerprint decides), and ``path``: where the
    weights are, relative to the run directory, when evolm knows (``base``; a pipeline stage points
    at the stage before it)."""
    low = lower_precision(model)
    weights = BASE_DIR if low else ("injected" if injected else "spec")
    return {"fingerprint": model_fingerprint(model), "spec": cfg.model.spec, "dtype": cfg.model.dtype,
            "weights": weights, "path": BASE_DIR if weights == BASE_DIR else None, "rounded_to": low or None}


def open_run(cfg, kind: str, *, resume: RunDir | str | Path | None = None, run_dir: str | Path | None = None,
             info: dict | None = None, model=None, injected: bool = False) -> tuple[RunDir, Start]:
    """Create the run directory (``run_dir``, default ``run.out_dir / run.name``) or reopen ``resume``.

    ``model`` (a new run): the model training starts from; its fingerprint goes into ``run.json``
    (``base_record``), and a lower-precision model's weights into ``<run>/base/``. ``injected``: the
    caller built the model (its weights need not be ``model.spec``'s)."""
    if resume is not None:
        run = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        check_kind(run, kind)
        atomic_write_text(run.config_path, config_mod.to_toml(cfg))
        found = run.latest_checkpoint()
        start = Start(int(found[1]["step"]), found[0], found[1]) if found else Start()
        run.truncate_after(start.step)  # a resume without checkpoint keeps the step-0 measurements
        run.update_info(status="running", resumed_from_step=start.step)
        return run, start
    if run_dir is not None:
        path = Path(run_dir.path if isinstance(run_dir, RunDir) else run_dir)
        out_dir, name = path.parent, path.name
    else:
        out_dir, name = Path(cfg.run.out_dir), cfg.run.name
    base = base_record(cfg, model, injected) if model is not None else None
    run = RunDir.create(out_dir, name, config_mod.to_toml(cfg), kind=kind,
                        info={"model": cfg.model.spec, "task": cfg.task.name, **(info or {})})
    if base is not None:
        if base["weights"] == BASE_DIR:
            save_model_dir(run.path / BASE_DIR, model, None, extra={"base.json": base})
        run.update_info(base=base)
    return run, Start()


@contextlib.contextmanager
def marking_failures(run: RunDir) -> Iterator[None]:
    """Record in ``run.json`` how a run stopped when its body raises (and re-raise)."""
    try:
        yield
    except BaseException as e:
        steps = [r["step"] for r in run.train_records()]
        status = "interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "failed"
        run.update_info(status=status, stopped_at_step=steps[-1] if steps else 0, error=repr(e)[:2000])
        raise


def start_measurements(cfg, comps: Components, run: RunDir, start: Start, method: str, *, probe: Callable | None = None,
                       eval_before: dict | None = None, say: Say = print) -> Callable | None:
    """The held-out evaluation before training and the step-0 probe (each once); returns the probe."""
    if probe is None:
        probe = make_probe(cfg, comps.tokenizer, comps.generator, comps.task)
    logged = {(r.get("kind"), r.get("step")) for r in run.metrics()}
    if cfg.eval.before_after and start.step == 0 and ("eval", 0) not in logged:
        if eval_before is not None:  # measured on the same starting weights elsewhere (a sweep's first point)
            run.write_json("eval_before.json", eval_before)
            run.log_metrics({"step": 0, "kind": "eval", "label": "before", "task": eval_before.get("task"),
                             **eval_before.get("summary", {})})
        else:
            heldout_eval(cfg, comps.model, comps.tokenizer, comps.generator, comps.task, run, label="before", step=0, say=say)
    if probe is not None and start.step == 0 and ("probe", 0) not in logged:
        run.log_metrics(probe_record(probe, comps.model, 0, method))
    return probe


def finish_run(cfg, comps: Components, run: RunDir, method: str, result: TrainResult, *,
               probe: Callable | None = None, state: dict | None = None, say: Say = print) -> None:
    """Final probe (unless logged), ``final/``, the evaluation after training, plots, status finished."""
    if probe is not None and result.steps not in {r["step"] for r in run.probes()}:
        run.log_metrics(probe_record(probe, comps.model, result.steps, method))
    run.save_final(result.final_model, comps.tokenizer, {"step": result.steps, "method": method, **result.totals,
                                                         **(state or {})})
    if cfg.eval.before_after:
        heldout_eval(cfg, comps.model, comps.tokenizer, comps.generator, comps.task, run, label="after",
                     step=result.steps, say=say)
    plot_training(run)
    run.finish(steps=result.steps, peak_rss_mb=peak_rss_mb(), **result.totals)
    say(f"[evolm] done: {run.path} (final weights in {run.path / 'final'})")


# -- the jobs ---------------------------------------------------------------------------------------

def run_es(cfg, resume=None, *, model=None, tokenizer=None, task: Task | None = None, generator: Generator | None = None,
           run_dir=None, probe: Callable | None = None, callbacks: tuple[Callable, ...] = (), quiet: bool = False,
           eval_before: dict | None = None) -> RunDir:
    """Run (or resume) ES post-training described by ``cfg`` (an ``ESJob``); returns the run directory.

    ``model``/``tokenizer``/``task``/``generator`` may be injected (tests, pipelines); otherwise they
    are built from the config. ``callbacks`` are called as ``cb(step, record)`` after every update.
    ``probe(model, step) -> dict`` (default: ``heldout.make_probe`` from ``[probe]``) is logged as a
    ``kind="probe"`` record at step 0, every ``probe.every`` updates and at the end.
    """
    say = say_for(quiet)
    config_mod.validate(cfg)
    comps = build_components(cfg, model=model, tokenizer=tokenizer, task=task, generator=generator)
    if resume is not None:
        resume = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        check_kind(resume, es_engine.METHOD)
    header = es_engine.seed_log_header(resume.seed_log()) if resume is not None else None
    # refuses a selection that matches nothing, or a config that is not the resumed run's, before any file changes
    params = es_engine.build_paramset(comps.model, cfg, header)
    run, start = open_run(cfg, es_engine.METHOD, resume=resume, run_dir=run_dir, model=comps.model, injected=model is not None)
    with marking_failures(run):
        probe = start_measurements(cfg, comps, run, start, es_engine.METHOD, probe=probe, eval_before=eval_before, say=say)
        result = es_engine.train(cfg, comps, run, start, params, probe=probe, callbacks=callbacks, say=say, quiet=quiet)
        finish_run(cfg, comps, run, es_engine.METHOD, result, probe=probe, say=say)
    return run


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
    grpo.import_trl()
    need_generator = cfg.eval.before_after or (probe is None and cfg.probe.every > 0)
    comps = build_components(cfg, model=model, tokenizer=tokenizer, task=task, with_generator=need_generator)
    if init_state_dict is not None:
        comps.model.load_state_dict(init_state_dict)
    examples = grpo.training_examples(cfg, comps.task)
    run, start = open_run(cfg, grpo.METHOD, resume=resume, run_dir=run_dir, model=comps.model,
                          injected=model is not None or init_state_dict is not None)
    grpo.check_resumable(start)
    with marking_failures(run):
        probe = start_measurements(cfg, comps, run, start, grpo.METHOD, probe=probe, eval_before=eval_before, say=say)
        result = grpo.train(cfg, comps, run, start, examples, probe=probe, callbacks=callbacks or [],
                            fresh_start=model is not None or init_state_dict is not None, quiet=quiet)
        finish_run(cfg, comps, run, grpo.METHOD, result, probe=probe, say=say)
    return run
