"""The ES loop: config -> model -> population scores -> update -> run directory; resumable.

One iteration (``step`` = iterations done so far, 1-based in the logs):

1. draw ``es.prompts_per_iteration`` training examples with a key-derived seed (same for all members);
2. for each member (direction d, sign s): ``perturb(d, s)``, generate with the iteration's shared
   sampling seed (common random numbers), fitness = mean task reward, ``restore()`` (bit-exact);
3. ``compute_update`` (shaping + estimator, ``es/update.py``) and ``ParamSet.apply_update``;
4. append a metrics record and a seed-log record; every ``run.checkpoint_every`` updates, save a
   checkpoint (weights in Hugging Face safetensors names + state).

Design decisions:

- The engine touches the model only through ``ParamSet`` (perturb / restore / apply_update on named
  tensors) and generation only through a ``Generator``. ``LocalPopulation`` scores members one after
  another in this process; a distributed population (Ray actors each holding a model replica and a
  ParamSet, or vLLM workers) implements the same two calls, ``score`` and ``apply_update``.
- Everything random is a pure function of ``(run.seed, iteration, member)``, so a killed run resumed
  from its newest checkpoint reaches bit-identical weights, and the seed log (per update: the
  coefficients and the step scale) replays the whole run from the base model (``replay``).
- Held-out evaluation before and after training and the periodic probe go through
  ``evolm.evaluate``; they never change the weights.
"""

from __future__ import annotations

import copy
import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from evolm import config as config_mod
from evolm.backends.base import Generator, SamplingParams
from evolm.es.noise import make_noise
from evolm.seeding import derive_seed, seed31
from evolm.es.params import ParamSet
from evolm.es.update import Update, compute_update, member_layout
from evolm.runs import RunDir, load_weights
from evolm.tasks.base import Example, Task


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MB (Linux reports KB, macOS bytes)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


@dataclass
class MemberScores:
    fitness: list[float]
    errors: dict[int, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=lambda: {"generate": 0.0, "perturb": 0.0, "restore": 0.0})
    gen_sequences: int = 0
    gen_tokens: int = 0


def score_completions(task: Task, examples: list[Example], completions) -> tuple[float, str | None]:
    """Mean reward over all completions of all examples; a reward that raises gives NaN and its message."""
    rewards = []
    try:
        for example, outs in zip(examples, completions):
            rewards += [float(task.reward(c.text, example)) for c in outs]
    except Exception as e:  # a broken reward must not take the run down or reach the weights
        return float("nan"), f"{type(e).__name__}: {e}"
    return (float(np.mean(rewards)) if rewards else float("nan")), None


class LocalPopulation:
    """Scores ES members one after another on this process's model."""

    def __init__(self, params: ParamSet, generator: Generator, task: Task):
        self.params = params
        self.generator = generator
        self.task = task

    def score(self, iteration: int, layout: list[tuple[int, int]], sigma: float, examples: list[Example],
              prompts: list[str], sampling: SamplingParams, on_member: Callable[[], None] | None = None) -> MemberScores:
        out = MemberScores(fitness=[])
        for m, (direction, sign) in enumerate(layout):
            t0 = time.perf_counter()
            self.params.perturb(iteration, direction, sign, sigma)
            self.generator.sync_weights()
            t1 = time.perf_counter()
            completions = self.generator.generate(prompts, sampling)
            t2 = time.perf_counter()
            self.params.restore()
            self.generator.sync_weights()
            t3 = time.perf_counter()
            fitness, error = score_completions(self.task, examples, completions)
            out.fitness.append(fitness)
            if error:
                out.errors[m] = error
            out.seconds["perturb"] += t1 - t0
            out.seconds["generate"] += t2 - t1
            out.seconds["restore"] += t3 - t2
            out.gen_sequences += sum(len(c) for c in completions)
            out.gen_tokens += sum(x.num_tokens for c in completions for x in c)
            if on_member:
                on_member()
        return out

    def apply_update(self, iteration: int, update: Update) -> None:
        if update.applies:
            self.params.apply_update(iteration, update.coefficients, update.scale)
            self.generator.sync_weights()


def training_batch(task: Task, tokenizer, seed: int, iteration: int, count: int) -> tuple[list[Example], list[str]]:
    """The iteration's training examples and rendered prompts (same for every member)."""
    examples = task.examples("train", count, seed=seed31(seed, "prompts", iteration))
    return examples, [task.render_prompt(ex, tokenizer) for ex in examples]


def build_paramset(model, cfg) -> ParamSet:
    es = cfg.es
    params = ParamSet(model, None, categories=tuple(es.params), regex=es.param_regex)
    device = params.tensors[0].device
    params.noise = make_noise(es.noise, derive_seed(cfg.run.seed, "noise"), params.largest_numel, es.noise_table_size, device)
    return params


# -- checkpoints ------------------------------------------------------------------------------------

def _save_masters(params: ParamSet, directory: Path) -> None:
    if params.masters is not None:
        from safetensors.torch import save_file

        save_file(params.state_dict(), str(directory / "masters.safetensors"))


def _load_masters(params: ParamSet, directory: Path) -> None:
    path = directory / "masters.safetensors"
    if params.masters is not None and path.exists():
        from safetensors.torch import load_file

        state = load_file(str(path))
        for k, name in enumerate(params.names):
            params.masters[k].copy_(state[name])
            params.tensors[k].copy_(params.masters[k].view_as(params.tensors[k]))


def _float32_model(model, params: ParamSet):
    """The model with float32 weights (the masters when generation runs in lower precision)."""
    if params.masters is None:
        return model
    clone = copy.deepcopy(model).to(torch.float32)
    named = dict(clone.named_parameters())
    for name, master in zip(params.names, params.masters):
        named[name].data.copy_(master.view_as(named[name]))
    return clone


# -- the loop ---------------------------------------------------------------------------------------

def run_es(cfg, resume: RunDir | None = None, *, model=None, tokenizer=None, task: Task | None = None,
           generator: Generator | None = None, run_dir: RunDir | None = None,
           probe: Callable | None = None, callbacks: tuple[Callable, ...] = (), quiet: bool = False) -> RunDir:
    """Run (or resume) ES post-training described by ``cfg`` (an ``ESJob``); returns the run directory.

    ``model``/``tokenizer``/``task``/``generator`` may be injected (tests, pipelines); otherwise they
    are built from the config. ``callbacks`` are called as ``cb(step, record)`` after every update.
    ``probe(model, step) -> dict`` (default: ``heldout.make_probe`` from ``[probe]``) is logged as a
    ``kind="probe"`` record at step 0, every ``probe.every`` updates and at the end.
    """
    from evolm import models
    from evolm.backends import make_generator
    from evolm.tasks import make_task

    say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))
    torch.set_num_threads(cfg.model.threads)
    if model is None:
        model, tokenizer = models.load(cfg.model.spec, dtype=cfg.model.dtype, threads=cfg.model.threads, device=cfg.model.device)
    if task is None:
        task = make_task(cfg.task.name, cfg.task.reward, cfg.task.system_prompt, **cfg.task.params)
    if generator is None:
        generator = make_generator(cfg.generation.backend, model, tokenizer, cfg.generation.batch_size,
                                   cfg.generation.prefix_cache)

    start = 0
    seconds_total = 0.0
    totals = {"gen_sequences_total": 0, "gen_tokens_total": 0}
    if resume is not None:
        run = resume
        found = run.latest_checkpoint()
        if found:
            ckpt, state = found
            load_weights(model, ckpt)
            start, seconds_total = int(state["step"]), float(state.get("seconds_total", 0.0))
            totals = {k: int(state.get(k, 0)) for k in totals}
            say(f"[evolm] resuming {run.path} from update {start}")
        run.truncate_after(start)
        run.update_info(status="running")
    else:
        run = run_dir or RunDir.create(cfg.run.out_dir, cfg.run.name, config_mod.to_toml(cfg), kind="es",
                                       info={"model": cfg.model.spec, "task": cfg.task.name})
    params = build_paramset(model, cfg)
    if resume is not None and found:
        _load_masters(params, found[0])
    generator.sync_weights()
    population = LocalPopulation(params, generator, task)
    es = cfg.es
    layout = member_layout(es.estimator, es.population)
    if start == 0 and not run.seed_log():
        run.log_seed({"kind": "header", "noise": params.noise.describe(), "estimator": es.estimator,
                      "population": es.population, "sigma": es.sigma, "lr": es.lr, "divide_by_sigma": es.divide_by_sigma,
                      "shaping": es.shaping, "layout": layout, "params": params.names, "param_indices": params.indices,
                      "numel": params.numel})
    say(f"[evolm] ES on {cfg.model.spec}: {len(params.names)} tensors, {params.numel:,} parameters, "
        f"N={es.population} ({es.estimator}), sigma={es.sigma}, lr={es.lr}, noise={es.noise}; run dir {run.path}")

    from evolm.heldout import heldout_eval, make_probe, probe_record

    if probe is None:
        probe = make_probe(cfg, tokenizer, generator, task)
    logged = {(r.get("kind"), r.get("step")) for r in run.metrics()}  # a resume without checkpoint keeps step 0
    if cfg.eval.before_after and start == 0 and ("eval", 0) not in logged:
        heldout_eval(cfg, model, tokenizer, generator, task, run, label="before", step=0, say=say)
    if probe is not None and start == 0 and ("probe", 0) not in logged:
        run.log_metrics(probe_record(probe, model, 0, "es"))

    sampling_base = dict(n=1, temperature=cfg.generation.temperature, top_p=cfg.generation.top_p,
                         max_new_tokens=cfg.generation.max_new_tokens)
    from tqdm.auto import tqdm

    bar = tqdm(total=es.iterations * len(layout), initial=start * len(layout), desc="ES", unit="member",
               disable=quiet or not cfg.run.progress, dynamic_ncols=True, file=sys.stdout)
    probe_every = cfg.probe.every
    for iteration in range(start, es.iterations):
        t_start = time.perf_counter()
        examples, prompts = training_batch(task, tokenizer, cfg.run.seed, iteration, es.prompts_per_iteration)
        sampling = SamplingParams(seed=seed31(cfg.run.seed, "sampling", iteration), **sampling_base)
        scores = population.score(iteration, layout, es.sigma, examples, prompts, sampling, on_member=lambda: bar.update(1))
        t_update = time.perf_counter()
        update = compute_update(scores.fitness, estimator=es.estimator, shaping=es.shaping, lr=es.lr, sigma=es.sigma,
                                divide_by_sigma=es.divide_by_sigma, errors=scores.errors)
        population.apply_update(iteration, update)
        seconds_update = time.perf_counter() - t_update
        step = iteration + 1
        fit = np.asarray(scores.fitness, dtype=np.float64)
        finite = fit[np.isfinite(fit)]
        record = {
            "step": step, "method": "es", "kind": "train",
            "reward_mean": float(finite.mean()) if finite.size else None,
            "reward_std": float(finite.std()) if finite.size else None,
            "reward_min": float(finite.min()) if finite.size else None,
            "reward_max": float(finite.max()) if finite.size else None,
            "fitness": scores.fitness, "update_status": update.status,
            "update_norm_coef": float(math.sqrt(sum(c * c for c in update.coefficients))) * update.scale,
            "seconds_generate": scores.seconds["generate"], "seconds_perturb": scores.seconds["perturb"],
            "seconds_restore": scores.seconds["restore"], "seconds_update": seconds_update,
            "gen_sequences": scores.gen_sequences, "gen_tokens": scores.gen_tokens,
        }
        totals["gen_sequences_total"] += scores.gen_sequences
        totals["gen_tokens_total"] += scores.gen_tokens
        record.update(totals)
        if update.message:
            record["message"] = update.message
            if not quiet:
                bar.write(f"[evolm] update {step}: {update.message}")
        if es.eval_center_every and step % es.eval_center_every == 0:
            t0 = time.perf_counter()
            center, _ = score_completions(task, examples, generator.generate(prompts, sampling))
            record["center_reward"] = center
            record["seconds_center"] = time.perf_counter() - t0
        record["seconds"] = time.perf_counter() - t_start
        seconds_total += record["seconds"]
        record["seconds_total"] = seconds_total
        record["peak_rss_mb"] = peak_rss_mb()
        run.log_seed({"step": step, "iteration": iteration, "coefficients": update.coefficients, "scale": update.scale,
                      "status": update.status, "fitness": scores.fitness})
        run.log_metrics(record)
        bar.set_postfix(update=step, reward=f"{record['reward_mean']:.3f}" if finite.size else "nan")
        if probe is not None and probe_every and step % probe_every == 0 and step < es.iterations:
            run.log_metrics(probe_record(probe, model, step, "es"))
        if cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0 and step < es.iterations:
            ckpt = run.save_checkpoint(_float32_model(model, params) if params.masters is not None else model, step,
                                       {"method": "es", "seconds_total": seconds_total, **totals},
                                       keep=cfg.run.keep_checkpoints)
            _save_masters(params, ckpt)
        for cb in callbacks:
            cb(step, record)
    bar.close()

    final_model = _float32_model(model, params)
    run.save_final(final_model, tokenizer, {"step": es.iterations, "method": "es", "seconds_total": seconds_total, **totals})
    if probe is not None:
        run.log_metrics(probe_record(probe, model, es.iterations, "es"))
    if cfg.eval.before_after:
        heldout_eval(cfg, model, tokenizer, generator, task, run, label="after", step=es.iterations, say=say)
    from evolm.plots import plot_training

    plot_training(run)
    run.finish(steps=es.iterations, seconds_total=seconds_total, peak_rss_mb=peak_rss_mb(), **totals)
    say(f"[evolm] done: {run.path} (final weights in {run.path / 'final'})")
    return run


def replay(model, seed_log: list[dict], cfg) -> ParamSet:
    """Re-apply a run's logged updates to ``model`` (the base weights) in order; returns the ParamSet."""
    params = build_paramset(model, cfg)
    for record in seed_log:
        if record.get("status") == "applied":
            params.apply_update(int(record["iteration"]), record["coefficients"], float(record["scale"]))
    return params
