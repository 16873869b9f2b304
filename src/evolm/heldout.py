"""Held-out measurements taken during training runs: before/after evaluation and the periodic probe.

Both go through ``evolm.evaluate.evaluate_task``, the same function ``evolm eval`` uses, so numbers in
a run directory and numbers from the CLI are measured identically. ES and GRPO share this module:

- ``heldout_eval`` (``[eval]``): greedy accuracy plus pass@k / maj@k / token entropy from
  ``eval.n_samples`` samples per problem, on ``eval.count`` held-out problems. Written to
  ``eval_<label>.json`` and logged as a ``kind="eval"`` metrics record.
- ``make_probe`` (``[probe]``): every ``probe.every`` updates, ``probe.n_samples`` samples on
  ``probe.count`` problems of a held-out task (by default a different task from the training one,
  as "Understanding Evolution Strategies for LLM Reasoning" (arXiv 2608.27351) probes GPQA while
  training on GSM8K) -> token entropy, pass@1, pass@k. Logged as
  ``kind="probe"`` records; ``plots/probe.png`` draws them.

``evolm eval --like RUN_DIR`` measures a model with a run's own ``[eval]`` settings (``like_config``,
``evaluate_like``) through the same ``measure_heldout``, so it reproduces ``eval_after.json`` exactly.

Design decisions: the held-out problems and the sampling seed are fixed for the whole run (derived
from ``run.seed``: the evaluation's key root is ``run.seed``, the probe's ``seed31(run.seed, "probe")``), so every before/after/probe point is measured on the same problems with the same
random stream, and differences come from the weights alone. No generation cache is used: weights
change between calls. Every measurement runs through ``isolated(model)``: eval mode, no gradients and
forked random states (torch, CUDA, Python, NumPy), so measuring never changes a training trajectory
(GRPO draws from the global generators; ES does not, but goes through the same code). Both trainers
log probes with ``probe_record``, so ES and GRPO probe records have the same fields.
"""

from __future__ import annotations

import contextlib
import random
import time
from typing import Callable, Iterator

import numpy as np
import torch

from evolm import models
from evolm.backends import make_heldout_generator
from evolm.backends.base import SamplingParams
from evolm.config import LEGACY_DEFAULTS, ESJob, from_dict
from evolm.errors import UserError
from evolm.evaluate import evaluate_task
from evolm.runs import RunDir
from evolm.seeding import seed31
from evolm.plugins import check_recorded
from evolm.tasks import heldout_reward, make_task, task_from_config


@contextlib.contextmanager
def isolated(model) -> Iterator[None]:
    """Eval mode, no gradients, forked random state; the model's train/eval mode is restored after."""
    was_training = model.training
    py_state, np_state = random.getstate(), np.random.get_state()
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() and next(model.parameters()).is_cuda else []
    with torch.random.fork_rng(devices=devices):
        model.eval()
        try:
            with torch.no_grad():
                yield
        finally:
            model.train(was_training)
            random.setstate(py_state)
            np.random.set_state(np_state)


def probe_record(probe: Callable, model, step: int, method: str) -> dict:
    """The metrics record of one probe: ``{"step", "method", "kind": "probe", **probe(model, step),
    "probe_seconds"}``, measured under ``isolated(model)``."""
    t0 = time.perf_counter()
    with isolated(model):
        result = dict(probe(model, step))
    return {"step": step, "method": method, "kind": "probe", **result, "probe_seconds": time.perf_counter() - t0}


def _task_for(name: str, params: dict, train_task, reward: str):
    if not name or name == train_task.name and not params:
        return train_task
    return make_task(name, heldout_reward(name, reward), None, **params)


def heldout_examples(task, seed: int, count: int) -> list:
    """The ``count`` held-out (test) problems of ``task`` that a run with root seed ``seed`` measures."""
    return task.examples("test", count, seed=seed31(seed, "heldout", task.name))


def _measure(generator, task, tokenizer, seed: int, count: int, n: int, ks, temperature: float, top_p: float,
             max_new_tokens: int, greedy: bool, progress: bool) -> dict:
    examples = heldout_examples(task, seed, count)
    sampling = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                              seed=seed31(seed, "heldout-sampling"), return_entropy=True)
    result = evaluate_task(generator, task, tokenizer, examples, sampling, ks=ks, greedy=greedy, progress=progress)
    return result.to_dict(problems=True)


def heldout_task(cfg, train_task=None):
    """The task ``[eval]`` measures: ``eval.task`` with ``eval.params`` (its held-out reward), or the
    training task (``train_task``, built from ``[task]`` when not given)."""
    if train_task is None:
        t = cfg.task
        train_task = task_from_config(t)
    return _task_for(cfg.eval.task, cfg.eval.params, train_task, cfg.task.reward)


def measure_heldout(cfg, generator, tokenizer, task, progress: bool = True) -> dict:
    """The ``[eval]`` measurement of the generator's current weights on ``task`` (``heldout_task``):
    ``eval.count`` test problems and the sampling seed derived from ``run.seed``, greedy plus
    ``eval.n_samples`` samples. The one function behind ``eval_<label>.json`` and ``evolm eval --like``."""
    ev = cfg.eval
    max_new = ev.max_new_tokens or cfg.generation.max_new_tokens
    return _measure(generator, task, tokenizer, cfg.run.seed, ev.count, ev.n_samples, ev.k, ev.temperature,
                    ev.top_p, max_new, greedy=True, progress=progress)


def heldout_eval(cfg, model, tokenizer, generator, train_task, run, label: str, step: int, say=print) -> dict:
    """Evaluate the current weights on the held-out set; write ``eval_<label>.json``; return the summary."""
    ev = cfg.eval
    task = heldout_task(cfg, train_task)
    say(f"[evolm] held-out evaluation ({label}): {task.name}, {ev.count} problems, greedy + {ev.n_samples} samples at T={ev.temperature}")
    with isolated(model):
        report = measure_heldout(cfg, generator, tokenizer, task, progress=cfg.run.progress)
    report.update(label=label, step=step)
    run.write_json(f"eval_{label}.json", report)
    summary = report["summary"]
    run.log_metrics({"step": step, "kind": "eval", "label": label, "task": task.name, **summary})
    return summary


HELDOUT_SECTIONS = ("model", "task", "generation", "eval")
"""The config sections (besides ``run.seed``) a run's held-out evaluation depends on."""


def like_config(run_config: dict):
    """The held-out settings of a run, from its ``config.toml`` (as a dict, any job kind): a validated
    ``ESJob`` holding the run's ``[model] [task] [generation] [eval]`` sections and ``run.seed``."""
    data = {k: dict(run_config[k]) for k in HELDOUT_SECTIONS if isinstance(run_config.get(k), dict)}
    # a run written before generation.cpu_matmul measured with torch's linears (config.LEGACY_DEFAULTS)
    data.setdefault("generation", {}).setdefault("cpu_matmul", LEGACY_DEFAULTS["generation.cpu_matmul"])
    data["run"] = {"seed": int(run_config.get("run", {}).get("seed", 0))}
    return from_dict(ESJob, data)


def evaluate_like(run_path, model_spec: str | None = None, *, dtype: str | None = None, device: str | None = None,
                  threads: int | None = None, progress: bool = True, n_samples: int | None = None,
                  ks: list[int] | None = None) -> dict:
    """Measure a model exactly as the run at ``run_path`` measured its ``eval_after.json``: the same task,
    problems, samples, k, temperature, top-p, completion length, seed derivation, generation backend,
    batch size and prefix cache (``like_config`` + ``measure_heldout``), no generation cache.

    ``model_spec`` defaults to the run directory (its ``final/``); ``dtype`` and ``device`` to the run's.
    Returns an ``eval.json`` report (``evaluate.write_outputs`` writes it) whose one task entry has the
    same ``summary`` as the run's ``eval_after.json`` when the weights are the run's final weights.

    ``n_samples`` / ``ks`` (``evolm eval --like RUN --n 32 --k 1,16,32``) draw more samples on the same
    problems to reach a larger k than the run measured; everything else stays the run's, and the summary
    then differs from ``eval_after.json`` by design (more samples per problem, other sampling draws).
    """
    run = RunDir.open(run_path)
    check_recorded(run.info().get("plugins"), str(run.path))  # its task and rewards import here, or one line naming them
    cfg = like_config(run.config())
    if n_samples is not None:
        cfg.eval.n_samples = n_samples
        cfg.eval.k = [k for k in cfg.eval.k if k <= n_samples] if ks is None else cfg.eval.k
    if ks is not None:
        cfg.eval.k = ks
    bad = [k for k in cfg.eval.k if not 1 <= k <= cfg.eval.n_samples]
    if bad:
        raise UserError(f"--k {','.join(map(str, bad))} is outside 1..{cfg.eval.n_samples} (the samples per problem); "
                        f"raise --n or lower --k")
    task = heldout_task(cfg)
    spec = model_spec or str(run.path)
    model, tokenizer = models.load(spec, dtype=dtype or cfg.model.dtype, threads=threads or cfg.model.threads,
                                   device=device or cfg.model.device,  # the revision is model.spec's, not this spec's
                                   revision=cfg.model.revision if spec == cfg.model.spec else "",
                                   trust_remote_code=cfg.model.trust_remote_code)
    generator = make_heldout_generator(cfg, model, tokenizer)  # the backend the run measured its held-out sets with
    with isolated(model):
        result = measure_heldout(cfg, generator, tokenizer, task, progress=progress)
    ev = cfg.eval
    return {
        "model": {"spec": spec, "fingerprint": models.fingerprint(model), "dtype": dtype or cfg.model.dtype,
                  "device": device or cfg.model.device},
        "settings": {"like": str(run.path), "n": ev.n_samples, "ks": result["ks"], "temperature": ev.temperature,
                     "top_p": ev.top_p, "max_new_tokens": ev.max_new_tokens or cfg.generation.max_new_tokens,
                     "limit": ev.count, "split": "test", "seed": cfg.run.seed,
                     "seed_derivation": "the run's held-out evaluation: problems seed31(run.seed, 'heldout', task), "
                                        "sampling seed31(run.seed, 'heldout-sampling')",
                     "greedy": True, "batch_size": cfg.generation.batch_size,
                     "prefix_cache": cfg.generation.prefix_cache,
                     "cpu_matmul": cfg.generation.cpu_matmul, "backend": cfg.generation.backend},
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "tasks": {task.name: result},
    }


def check_measurements(cfg, train_task, probe_given: bool = False) -> None:
    """Build the held-out tasks ``[eval]`` (when ``eval.before_after``) and ``[probe]`` (when probing,
    unless a probe is handed in) and draw their problems, so a missing data file or a bad task
    parameter is reported before a run directory exists rather than after it."""
    if cfg.eval.before_after:
        task = _task_for(cfg.eval.task, cfg.eval.params, train_task, cfg.task.reward)
        task.examples("test", cfg.eval.count, seed=seed31(cfg.run.seed, "heldout", task.name))
    if cfg.probe.every and not probe_given:
        task = _task_for(cfg.probe.task, cfg.probe.params, train_task, cfg.task.reward)
        task.examples("test", cfg.probe.count, seed=seed31(seed31(cfg.run.seed, "probe"), "heldout", task.name))


def make_probe(cfg, tokenizer, generator, train_task) -> Callable[[object, int], dict] | None:
    """The periodic held-out probe described by ``cfg.probe`` (None when ``probe.every == 0``)."""
    pr = cfg.probe
    if not pr.every:
        return None
    task = _task_for(pr.task, pr.params, train_task, cfg.task.reward)
    max_new = pr.max_new_tokens or cfg.generation.max_new_tokens

    def probe(model, step: int) -> dict:
        report = _measure(generator, task, tokenizer, seed31(cfg.run.seed, "probe"), pr.count, pr.n_samples, pr.k, pr.temperature,
                          pr.top_p, max_new, greedy=False, progress=False)
        s = report["summary"]
        out = {"task": task.name, "entropy": s.get("entropy"), "mean_tokens": s.get("mean_tokens"),
               "distinct_correct": s.get("distinct_correct")}
        out.update({k: v for k, v in s.items() if k.startswith("pass@")})
        return out

    return probe

