"""The ES training loop: prompts -> population scores -> update -> run directory records; resumable.

One iteration (``step`` = iterations done so far, 1-based in the logs):

1. draw ``es.prompts_per_iteration`` training examples with a key-derived seed (same for all members);
2. the population scores every member (direction d, sign s): perturb, generate with the iteration's
   shared sampling seed (common random numbers), fitness = mean task reward, restore bit for bit
   (``es/population.py``);
3. ``compute_update`` (shaping + estimator, ``es/update.py``) and ``population.apply_update``;
4. append a metrics record (``runs.train_record``) and a seed-log record; every
   ``run.checkpoint_every`` updates (with ``run.save = "all"``), save a checkpoint (weights in Hugging
   Face safetensors names + state, plus float32 masters when generation runs in lower precision,
   written inside the checkpoint before it is renamed into place).

The run around the loop (run directory, components, held-out measurements, final weights) is the
shared lifecycle in ``evolm/jobs.py``; ``jobs.run_es`` is the entry point.

Design decisions:

- The engine touches the model only through ``ParamSet`` (perturb / restore / apply_update on named
  tensors) and generation only through a population (``score``, ``apply_update``); where the members
  are scored (this process, Ray actors, vLLM workers) is the population's business.
- Everything random is a pure function of ``(run.seed, iteration, member)``, so a killed run resumed
  from its newest checkpoint reaches bit-identical weights, and the seed log (per update: the
  coefficients and the step scale) replays the whole run from the base model (``replay``).
- A reward function's None means "cannot score this completion" (TRL: does not apply), and such a completion
  counts 0. An update in which no reward function scored any completion of any member has no fitness
  signal by construction, which is a reward that never scores (it returns None for a wrong answer
  instead of 0.0), not bad luck: the run stops at that update with one line naming the reward
  (``check_scored``). None for some completions is fine and the run goes on.
"""

from __future__ import annotations

import copy
import math
import time
from pathlib import Path
from typing import Callable

import torch

from evolm.backends.base import Generator, SamplingParams
from evolm.console import Say, progress_bar
from evolm.errors import ConfigError
from evolm.es.noise import make_noise, noise_from_header
from evolm.es.params import PERTURB_ARITHMETIC, ParamSet
from evolm.es.lowrank import LowRankNoise, LowRankParamSet
from evolm.es.lowrank_population import LowRankPopulation
from evolm.es.population import LocalPopulation, score_completions
from evolm.es.update import compute_update, member_layout
from evolm.heldout import probe_record
from evolm.rewards import nothing_scored
from evolm.runs import RunDir, TrainResult, budget_reached, load_weights, train_record
from evolm.seeding import derive_seed, seed31
from evolm.tasks.base import Example, Task

METHOD = "es"


def training_batch(task: Task, tokenizer, seed: int, iteration: int, count: int) -> tuple[list[Example], list[str]]:
    """The iteration's training examples and rendered prompts (same for every member)."""
    examples = task.examples("train", count, seed=seed31(seed, "prompts", iteration))
    return examples, [task.render_prompt(ex, tokenizer) for ex in examples]


def check_training_data(cfg, task: Task) -> None:
    """Draw the first update's training problems (a missing data file fails here, before the run directory exists)."""
    task.examples("train", cfg.es.prompts_per_iteration, seed=seed31(cfg.run.seed, "prompts", 0))


ALLOCATED_AT_CHECK = ("weights", "weights (engine)", "driver's HF copy (weights)", "KV cache (vllm_kv_cache_gb)",
                      "KV cache (the rest of vllm_gpu_memory_utilization)")
"""Lines of the memory account already allocated when ``check_memory`` runs (the model is loaded and a vLLM
engine has started with its KV cache): the check compares the rest with what is free."""


def pending_memory(model, cfg):
    """The lines of ``evolm.memory.es_account`` still to be allocated once the model is loaded (less
    ``ALLOCATED_AT_CHECK``): float32 masters, the noise table, the HF backend's KV cache, the save transient."""
    from evolm.memory import ModelShape, es_account

    return [ln for ln in es_account(cfg, ModelShape.of_model(model), cuda_here=_cuda(model))
            if ln.item not in ALLOCATED_AT_CHECK and ln.bytes]


def memory_need(model, cfg) -> dict[str, int]:
    """``pending_memory`` by item, in bytes."""
    return {ln.item: ln.bytes for ln in pending_memory(model, cfg)}


def _cuda(model) -> bool:
    return next(model.parameters()).device.type == "cuda"


def check_memory(model, cfg, free_bytes: int | dict | None = None) -> None:
    """Refuse in one line, before ES allocates, a run whose remaining state does not fit (``memory_need`` per
    device against its free memory: CUDA's ``mem_get_info``, the RAM available). ``free_bytes``: what is
    free (tests; an int means every device), None reads the machine."""
    from evolm import memory

    lines = pending_memory(model, cfg)
    devices = {ln.device for ln in lines}
    if free_bytes is None:
        free = memory.free_here(devices)
    elif isinstance(free_bytes, int):
        free = {d: free_bytes for d in devices}
    else:
        free = dict(free_bytes)
    memory.check(cfg, lines, free)


def build_paramset(model, cfg, header: dict | None = None, generator: Generator | None = None) -> ParamSet:
    """The ``ParamSet`` of the parameters ``es.params`` / ``es.param_regex`` select, with the run's noise.

    ``header``: the seed-log header of an existing run (resume, replay); the noise is rebuilt exactly
    as the run drew it, after ``check_header`` confirmed that the config describes the same run.
    ``generator``: a generator that holds its own weights (vLLM) wraps the ParamSet
    (``attach_paramset``), so that members are perturbed where generation happens."""
    es = cfg.es
    if es.perturbation == "lowrank":
        return build_lowrank_paramset(model, cfg, header, generator)
    if es.arithmetic == "reference":
        from evolm.es.reference import ReferenceParamSet

        params = ReferenceParamSet(model, None, categories=tuple(es.params), regex=es.param_regex, lr=es.lr,
                                   error_sample=es.reference_error_sample,
                                   sample_seed=derive_seed(cfg.run.seed, "reference-shadow"))
    elif es.arithmetic == "artifact":
        from evolm.es.artifact import ArtifactParamSet

        params = ArtifactParamSet(model, None, categories=tuple(es.params), regex=es.param_regex, lr=es.lr,
                                  population=es.population, engines=es.engines, sync_every=es.engine_sync_every,
                                  sync_also=lambda step: step >= es.iterations or (cfg.run.checkpoints and step % cfg.run.checkpoint_every == 0),
                                  error_sample=es.reference_error_sample,
                                  sample_seed=derive_seed(cfg.run.seed, "reference-shadow"))
    else:  # masters kept by the generator's replica (vLLM workers) are not kept here too
        params = ParamSet(model, None, categories=tuple(es.params), regex=es.param_regex,
                          masters_elsewhere=bool(getattr(generator, "masters_in_engine", False)))
    device = params.tensors[0].device
    if header is None:
        params.noise = make_noise(es.noise, derive_seed(cfg.run.seed, "noise"), params.layout, es.noise_table_size, device)
    else:
        check_header(header, params, cfg)
        params.noise = noise_from_header(header["noise"], params.layout, device)
    attach = getattr(generator, "attach_paramset", None)
    return attach(params) if attach is not None else params


def build_lowrank_paramset(model, cfg, header: dict | None = None, generator: Generator | None = None) -> LowRankParamSet:
    """The low-rank ParamSet of an ES job config (``es.perturbation = "lowrank"``), with its keyed noise.

    The base noise source sees the members' draws as its parameter layout (``draw_layout``: (out + in) r
    values per matrix, numel per vector), so with the table one member's factors are one contiguous
    stretch of it, no value used twice. ``header``: an existing run's seed-log header (resume,
    replay), checked against the config (``check_header``) and rebuilt as the run drew it. ``generator``:
    a vLLM engine wraps it (``attach_paramset``), so that updates happen inside the engine and its workers
    build the members' LoRA adapters from the same noise (``es/lora_population.py``)."""
    es = cfg.es
    params = LowRankParamSet(model, None, categories=tuple(es.params), regex=es.param_regex, rank=es.rank,
                             masters_elsewhere=bool(getattr(generator, "masters_in_engine", False)))
    device = params.tensors[0].device
    if header is None:
        base = make_noise(es.noise, derive_seed(cfg.run.seed, "noise"), params.draw_layout, es.noise_table_size, device)
    else:
        check_header(header, params, cfg)
        base = noise_from_header(header["noise"]["base"], params.draw_layout, device)
    params.noise = LowRankNoise(base, {i: s for i, s in zip(params.indices, params.shapes)}, es.rank)
    attach = getattr(generator, "attach_paramset", None)
    return attach(params) if attach is not None else params


def make_population(cfg, params: ParamSet, generator: Generator, task: Task):
    """The population an ES job's config asks for: local (this process, one member after another), or
    low-rank (``es.perturbation = "lowrank"``: all members in batched forward passes,
    ``es/lowrank_population.py``, or as LoRA adapters in one vLLM engine call, ``es/lora_population.py``). ``distributed.workers >= 2`` asks for ``es.ray_population.RayPopulation``,
    which ``jobs.run_es`` hands to ``engine.train`` as its population factory (it needs the run directory
    and the model's source)."""
    if cfg.es.perturbation == "lowrank":
        if getattr(generator, "lora_slots", 0):  # vLLM: members as LoRA adapters, all in one engine call
            from evolm.es.lora_population import LoRAPopulation

            return LoRAPopulation(params, generator, task, cfg.es.member_batch)
        return LowRankPopulation(params, generator, task, cfg.es.member_batch)
    return LocalPopulation(params, generator, task, verify=cfg.generation.verify)


def run_header(params: ParamSet, cfg, layout: list[tuple[int, int]]) -> dict:
    """The first record of a run's seed log: everything replay needs besides the updates."""
    es = cfg.es
    return {"kind": "header", "noise": params.noise.describe(), "estimator": es.estimator, "population": es.population,
            "sigma": es.sigma, "lr": es.lr, "divide_by_sigma": es.divide_by_sigma, "shaping": es.shaping, "layout": layout,
            "params": params.names, "param_indices": params.indices, "numel": params.numel,
            "perturb": {"arithmetic": perturb_arithmetic(cfg), "path": params.perturb_path,
                        **({"engines": es.engines, "engine_sync_every": es.engine_sync_every} if es.arithmetic == "artifact" else {})},
            "perturbation": es.perturbation,
            **({"rank": es.rank} if es.perturbation == "lowrank" else {})}


def perturb_arithmetic(cfg) -> str:
    """The seed-log name of the arithmetic ``es.arithmetic`` selects (exact: ``PERTURB_ARITHMETIC``)."""
    if cfg.es.arithmetic == "reference":
        from evolm.es.reference import REFERENCE_ARITHMETIC

        return REFERENCE_ARITHMETIC
    if cfg.es.arithmetic == "artifact":
        from evolm.es.artifact import ARTIFACT_ARITHMETIC

        return ARTIFACT_ARITHMETIC
    return PERTURB_ARITHMETIC


def seed_log_header(records: list[dict]) -> dict | None:
    return next((r for r in records if r.get("kind") == "header"), None)


def check_header(header: dict, params: ParamSet, cfg) -> None:
    """Refuse (one line) a config that would continue or replay a run with other noise or parameters
    than its seed log was written with; never a silent divergence."""
    noise = header.get("noise") or {}
    problems = []
    perturbation = header.get("perturbation", "full")  # headers before es.perturbation existed are full-rank
    if perturbation != cfg.es.perturbation:
        problems.append(f"es.perturbation is '{cfg.es.perturbation}' but the run's perturbations were '{perturbation}'")
    elif perturbation == "lowrank":
        if int(header.get("rank", 0)) != cfg.es.rank:
            problems.append(f"es.rank is {cfg.es.rank} but the run's perturbations had rank {header.get('rank')}")
        noise = noise.get("base") or {}  # the low-rank factors are drawn from this source
    if noise.get("kind") != cfg.es.noise:
        problems.append(f"es.noise is '{cfg.es.noise}' but the run drew '{noise.get('kind')}' noise")
    if "seed" in noise and int(noise["seed"]) != derive_seed(cfg.run.seed, "noise"):
        problems.append("run.seed is not the seed the run's noise was drawn from")
    if cfg.es.noise_table_size and noise.get("kind") == "table" and int(noise.get("size", 0)) != cfg.es.noise_table_size:
        problems.append(f"es.noise_table_size is {cfg.es.noise_table_size} but the run's table had {noise.get('size')} entries")
    if header.get("params") is not None and list(header["params"]) != params.names:
        problems.append("es.params / es.param_regex select other parameters than the run perturbed")
    elif noise.get("scheme") == "member" and int(noise.get("total", params.noise_numel)) != params.noise_numel:
        problems.append("the model's selected parameters differ in size from the run's")
    arithmetic = (header.get("perturb") or {}).get("arithmetic")
    expected = perturb_arithmetic(cfg)
    if (arithmetic or PERTURB_ARITHMETIC) != expected:
        problems.append(f"the run perturbed with '{arithmetic}' arithmetic, this config (es.arithmetic='{cfg.es.arithmetic}') "
                        f"with '{expected}'")
    elif cfg.es.arithmetic == "artifact":  # the member split and the syncs are the run's arithmetic too
        perturb = header.get("perturb") or {}
        for key in ("engines", "engine_sync_every"):
            if int(perturb.get(key, -1)) != getattr(cfg.es, key):
                problems.append(f"es.{key} is {getattr(cfg.es, key)} but the run had {perturb.get(key)}")
    if problems:
        raise ConfigError("the config does not describe the run in its seed log: " + "; ".join(problems)
                          + " (use the run's own config.toml)")


# -- checkpoints ------------------------------------------------------------------------------------

def save_masters(params: ParamSet, directory: Path) -> None:
    """A checkpoint's ``masters.safetensors``: written from the masters tensor by tensor (no clone of them)."""
    if getattr(params, "masters_in_engine", False):  # masters held by a replica (a vLLM engine) write themselves
        params.save_masters(directory)
    elif params.masters is not None:
        from evolm.streamsave import write_named

        write_named(directory / "masters.safetensors", dict(zip(params.names, params.masters)))


def load_masters(params: ParamSet, directory: Path, model) -> None:
    """The float32 masters from a checkpoint's ``masters.safetensors``, or, in ``final/`` (which holds
    the float32 weights the masters are), from the weights themselves (tied names resolved)."""
    if not params.keeps_masters:
        return
    from safetensors.torch import load_file

    path = directory / "masters.safetensors"
    if path.exists():
        state = load_file(str(path))
    else:
        state = {}
        for f in sorted(directory.glob("*.safetensors")):
            state.update(load_file(str(f)))
        aliases: dict[int, list[str]] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(name)
        named = dict(model.named_parameters(remove_duplicate=False))
        state = {name: next(state[a] for a in aliases[id(named[name])] if a in state) for name in params.names}
    if getattr(params, "masters_in_engine", False):  # a replica (a vLLM engine) holds them
        params.load_masters(state)
        return
    for k, name in enumerate(params.names):
        params.masters[k].copy_(state[name].to(torch.float32).view_as(params.masters[k]))
        params.tensors[k].copy_(params.masters[k].view_as(params.tensors[k]))


def float32_model(model, params: ParamSet):
    """What a save writes: the model itself, or, when generation runs in lower precision, the model with its
    float32 masters in place of its tensors and every tensor stored in float32 (``streamsave.ModelWeights``:
    references, no copy; ``runs.save_model_dir`` streams it tensor by tensor)."""
    if not params.keeps_masters:
        return model
    from evolm.streamsave import ModelWeights

    named = dict(model.named_parameters(remove_duplicate=False))
    return ModelWeights(model, {n: m.view_as(named[n]) for n, m in zip(params.names, params.masters)}, torch.float32)


def float32_copy(model, params: ParamSet):
    """A float32 copy of the model holding the masters (for a caller that wants a model object, not a save)."""
    if not params.keeps_masters:
        return model
    clone = copy.deepcopy(model).to(torch.float32)
    named = dict(clone.named_parameters())
    for name, master in zip(params.names, params.masters):
        named[name].data.copy_(master.view_as(named[name]))
    return clone


# -- the loop ---------------------------------------------------------------------------------------

def train(cfg, comps, run: RunDir, start, params: ParamSet, *, probe: Callable | None = None,
          callbacks: tuple[Callable, ...] = (), say: Say = print, quiet: bool = False,
          population_factory: Callable | None = None, on_population: Callable[[], None] | None = None) -> TrainResult:
    """Run ES updates ``start.step`` .. ``es.iterations`` on ``comps`` (a ``jobs.Components``), stopping
    earlier once a ``run.match`` budget of sequences, tokens or seconds (``run.budget``) is spent.

    ``start`` (``jobs.Start``): the step to continue from and, on resume, the checkpoint whose weights
    and masters are loaded first. ``probe(model, step) -> dict`` is logged every ``probe.every``
    updates; ``callbacks`` are called as ``cb(step, record)`` after every update.
    ``population_factory(cfg, params, generator, task)``: who scores the members (default
    ``make_population``, this process; ``jobs.run_es`` passes the Ray population's). ``on_population()`` is
    called once the population is up, before the first update (``jobs.run_es``: the measurements before
    training, which Ray actors take).
    """
    model, tokenizer, task, generator = comps.model, comps.tokenizer, comps.task, comps.generator
    es = cfg.es
    totals = {"seconds_total": 0.0, "gen_sequences_total": 0, "gen_tokens_total": 0}
    if start.replay:  # a run directory without weights: its seed log rebuilds them, bit for bit
        t0 = time.perf_counter()
        replay_into(params, [r for r in run.seed_log() if int(r.get("step", 0)) <= start.step], cfg)
        say(f"[evolm] rebuilt the weights at update {start.step} from the seed log in {time.perf_counter() - t0:.0f} s")
    elif start.checkpoint is not None:  # a checkpoint, or final/ of a finished run being extended
        load_weights(model, start.checkpoint)
        load_masters(params, start.checkpoint, model)
        if hasattr(params, "sync_replicas"):  # artifact: every replica was replica 0 when it was saved, if a sync preceded it
            _resume_replicas(params, run, start.step)
    if start.checkpoint is not None or start.replay:  # the totals continue from the record resumed
        totals = {"seconds_total": float(start.state.get("seconds_total", 0.0)),
                  "gen_sequences_total": int(start.state.get("gen_sequences_total", 0)),
                  "gen_tokens_total": int(start.state.get("gen_tokens_total", 0))}
    if start.step and not start.replay and hasattr(params, "replay_shadow"):  # reference: the exact shadow so far (replay_into built it)
        params.replay_shadow([r for r in run.seed_log() if "iteration" in r and int(r["step"]) <= start.step])
    generator.sync_weights()
    path = params.perturb_path  # builds the fused kernel now (announced), so no timed record or ETA includes it
    layout = member_layout(es.estimator, es.population)
    if start.step == 0 and not run.seed_log():  # before the population: Ray actors may take the driver's weights
        run.log_seed(run_header(params, cfg, layout))
    population = (population_factory or make_population)(cfg, params, generator, task)
    if start.step and hasattr(population, "resume_from"):  # e.g. generation.verify="auto" that turned itself off
        population.resume_from(run.metrics())
    say(f"[evolm] ES on {cfg.model.spec}: {len(params.names)} tensors, {params.numel:,} parameters, "
        f"N={es.population} ({es.estimator}), sigma={es.sigma}, lr={es.lr}, noise={es.noise}, perturb={path}, "
        f"perturbation={es.perturbation}{f' (rank {es.rank})' if es.perturbation == 'lowrank' else ''}; run dir {run.path}")

    sampling_base = dict(n=1, temperature=cfg.generation.temperature, top_p=cfg.generation.top_p,
                         max_new_tokens=cfg.generation.max_new_tokens)
    step, bar = start.step, None
    try:
        if on_population is not None:
            on_population()
        bar = progress_bar(es.iterations * len(layout), "ES", unit="member", initial=start.step * len(layout),
                           enabled=not quiet and cfg.run.progress)
        for iteration in range(start.step, es.iterations):
            if budget_reached(cfg.run, totals, step):  # run.match / run.budget: spent before the update cap
                break
            record = _iteration(cfg, run, population, task, tokenizer, generator, layout, iteration, sampling_base,
                                totals, bar, quiet)
            step = record["step"]
            last = step >= es.iterations or budget_reached(cfg.run, totals, step)  # finish_run probes and saves it
            if not last and ((probe is not None and cfg.probe.every and step % cfg.probe.every == 0)
                             or (cfg.run.checkpoints and step % cfg.run.checkpoint_every == 0)):
                population.sync()  # replicas elsewhere: the driver's copy catches up only when it is read
            if probe is not None and cfg.probe.every and step % cfg.probe.every == 0 and not last:
                run.log_metrics(probe_record(probe, model, step, METHOD))
            if cfg.run.checkpoints and step % cfg.run.checkpoint_every == 0 and not last:
                remote = getattr(population, "remote_weights", lambda: None)()  # Ray actors hold the only weights
                ckpt = run.save_checkpoint(remote or float32_model(model, params), step, {"method": METHOD, **totals},
                                           keep=cfg.run.keep_checkpoints,
                                           write_extra=population.save_masters if remote is not None
                                           else lambda tmp: save_masters(params, tmp))
                population.checkpointed(ckpt, step)
            for cb in callbacks:
                cb(step, record)
        population.sync()
    finally:
        if bar is not None:
            bar.close()
        if not getattr(population, "outlives_train", False):  # Ray actors that evaluate after training: the caller's
            population.close()
    remote = getattr(population, "remote_weights", lambda: None)()  # read from an actor by finish_run's save
    return TrainResult(steps=step, final_model=remote or float32_model(model, params), totals=totals)


def check_scored(task: Task, scores, members: int, step: int) -> None:
    """One line (``rewards.nothing_scored``) when no reward function scored any completion of any of the
    ``members`` (``MemberScores.unscored``): the update would have no fitness signal, nor would a later one."""
    if members and len(scores.unscored) >= members and task.user_rewards is not None:
        raise nothing_scored(task.user_rewards, f"all {members} members at update {step}")


def _iteration(cfg, run: RunDir, population, task, tokenizer, generator, layout, iteration: int, sampling_base: dict,
               totals: dict, bar, quiet: bool) -> dict:
    """One ES update: score, update, log (metrics record + seed-log record); returns the metrics record."""
    es = cfg.es
    t_start = time.perf_counter()
    examples, prompts = training_batch(task, tokenizer, cfg.run.seed, iteration, es.prompts_per_iteration)
    sampling = SamplingParams(seed=seed31(cfg.run.seed, "sampling", iteration), **sampling_base)
    since = getattr(population, "last_fitness_at", None) or t_start  # Ray actors: the driver's time between members
    scores = population.score(iteration, layout, es.sigma, examples, prompts, sampling,
                              on_member=(lambda: bar.update(1)) if bar is not None else None)
    check_scored(task, scores, len(layout), iteration + 1)
    t_update = time.perf_counter()
    update = compute_update(scores.fitness, estimator=es.estimator, shaping=es.shaping, lr=es.lr, sigma=es.sigma,
                            divide_by_sigma=es.divide_by_sigma, errors=scores.errors)
    update = population.apply_update(iteration, update) or update
    seconds_update = time.perf_counter() - t_update
    errors = population.params.error_metrics() if hasattr(getattr(population, "params", None), "error_metrics") else {}
    step = iteration + 1
    extra = {"fitness": scores.fitness, "update_status": update.status,
             "update_norm_coef": float(math.sqrt(sum(c * c for c in update.coefficients))) * update.scale,
             "seconds_generate": scores.seconds["generate"], "seconds_perturb": scores.seconds["perturb"],
             "seconds_restore": scores.seconds["restore"], "seconds_update": seconds_update, **scores.extra, **errors}
    if getattr(population, "first_member_at", None) is not None:  # from the last fitness before to the first member
        extra["driver_seconds"] = population.first_member_at - since
    if update.message:
        extra["message"] = update.message
        if not quiet:
            (bar.write if bar is not None else print)(f"[evolm] update {step}: {update.message}")
    if es.eval_center_every and step % es.eval_center_every == 0:
        where = generator.generate
        if getattr(population, "evaluates", False):  # on an actor (its weights are the centre's), as one call
            where = population.generate
        else:
            population.sync()
        t0 = time.perf_counter()
        extra["center_reward"], _, _ = score_completions(task, examples, where(prompts, sampling), prompts)
        extra["seconds_center"] = time.perf_counter() - t0
    seconds = time.perf_counter() - t_start
    totals["seconds_total"] += seconds
    totals["gen_sequences_total"] += scores.gen_sequences
    totals["gen_tokens_total"] += scores.gen_tokens
    record = train_record(step, METHOD, scores.fitness, seconds=seconds, gen_sequences=scores.gen_sequences,
                          gen_tokens=scores.gen_tokens, totals=totals, **extra)
    end_step = getattr(getattr(population, "params", None), "end_step", None)  # artifact: replicas synced now?
    synced = bool(end_step(step)) if end_step is not None else False
    divergence = getattr(population.params, "last_sync_divergence", None) if synced else None
    if divergence:
        record["replica_divergence"] = divergence
    run.log_seed({"step": step, "iteration": iteration, "coefficients": update.coefficients, "scale": update.scale,
                  "status": update.status, "fitness": scores.fitness, **({"engine_sync": True} if synced else {})})
    run.log_metrics(record)
    if bar is not None:
        bar.set_postfix(update=step, reward="nan" if record["reward_mean"] is None else f"{record['reward_mean']:.3f}")
    return record


def _resume_replicas(params, run: RunDir, step: int) -> None:
    """Artifact arithmetic resumed from saved weights: set every replica to them, which is the run only if
    the replicas were synced after update ``step`` (checkpoints and the last update are; see evolm/es/artifact.py)."""
    record = next((r for r in run.seed_log() if r.get("kind") != "header" and int(r.get("step", -1)) == step), None)
    if step and params.engines > 1 and not (record or {}).get("engine_sync"):
        raise ConfigError(f"the weights saved at update {step} were not synced across the run's {params.engines} engine "
                          "replicas (es.arithmetic='artifact'), so the other replicas are lost; resume by replay: move "
                          "checkpoints/ and final/ out of the run directory")
    params.sync_replicas()


def replay(model, seed_log: list[dict], cfg) -> ParamSet:
    """Re-apply a run's logged updates to ``model`` (the base weights) in order; returns the ParamSet.
    The noise is rebuilt from the log's header (checked against ``cfg``). With reference or artifact
    arithmetic (``es.arithmetic``) restore is not exact, so every logged iteration's members are
    perturbed and restored again, in layout order (artifact: each on its engine's replica), before its
    update, and the artifact's replicas are synced where the log says (``engine_sync``): the run's
    rounding, bit for bit."""
    params = build_paramset(model, cfg, seed_log_header(seed_log))
    replay_into(params, seed_log, cfg)
    return params


def replay_into(params: ParamSet, seed_log: list[dict], cfg) -> None:
    """Apply ``seed_log``'s updates, in order, to ``params`` (built on the base weights with the log's
    header): ``replay``'s loop, also the start of a resume without weights (``jobs.Start.replay``). With
    reference or artifact arithmetic every logged iteration's members are perturbed and restored first (its
    rounding), and the artifact's replicas are synced after the updates whose record says ``engine_sync``."""
    header = seed_log_header(seed_log)
    lossy = cfg.es.arithmetic in ("reference", "artifact")
    layout = [tuple(m) for m in header["layout"]] if lossy else []
    for record in seed_log:
        if lossy and "iteration" in record:
            for direction, sign in layout:
                params.perturb(int(record["iteration"]), direction, sign, float(header["sigma"]))
                params.restore()
        if record.get("status") == "applied":
            if not params.apply_update(int(record["iteration"]), record["coefficients"], float(record["scale"])):
                raise ValueError(f"seed-log update {record.get('step')} would make weights non-finite")
        if record.get("engine_sync"):
            params.sync_replicas()
    if hasattr(params, "activate"):
        params.activate(0)  # replica 0 in the model: what the run saved
