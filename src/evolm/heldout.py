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

from evolm.backends.base import SamplingParams
from evolm.evaluate import evaluate_task
from evolm.seeding import seed31
from evolm.tasks import heldout_reward, make_task


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


def _measure(generator, task, tokenizer, seed: int, count: int, n: int, ks, temperature: float, top_p: float,
             max_new_tokens: int, greedy: bool, progress: bool) -> dict:
    examples = task.examples("test", count, seed=seed31(seed, "heldout", task.name))
    sampling = SamplingParams(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                              seed=seed31(seed, "heldout-sampling"), return_entropy=True)
    result = evaluate_task(generator, task, tokenizer, examples, sampling, ks=ks, greedy=greedy, progress=progress)
    return result.to_dict(problems=True)


def heldout_eval(cfg, model, tokenizer, generator, train_task, run, label: str, step: int, say=print) -> dict:
    """Evaluate the current weights on the held-out set; write ``eval_<label>.json``; return the summary."""
    ev = cfg.eval
    task = _task_for(ev.task, ev.params, train_task, cfg.task.reward)
    max_new = ev.max_new_tokens or cfg.generation.max_new_tokens
    say(f"[evolm] held-out evaluation ({label}): {task.name}, {ev.count} problems, greedy + {ev.n_samples} samples at T={ev.temperature}")
    with isolated(model):
        report = _measure(generator, task, tokenizer, cfg.run.seed, ev.count, ev.n_samples, ev.k, ev.temperature,
                          ev.top_p, max_new, greedy=True, progress=cfg.run.progress)
    report.update(label=label, step=step)
    run.write_json(f"eval_{label}.json", report)
    summary = report["summary"]
    run.log_metrics({"step": step, "kind": "eval", "label": label, "task": task.name, **summary})
    return summary


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

