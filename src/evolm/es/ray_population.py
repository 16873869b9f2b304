"""The Ray population: K Ray actors, each a model replica that scores ES members; seeds on the wire.

``RayPopulation`` implements the engine's population calls (``score``, ``apply_update``, plus
``checkpointed`` and ``close``) over K actors. Each actor (``Replica``) is the engine's population
(``engine.make_population``) in its own process: it loads the model from the run's spec (or checkpoint),
builds its ``Generator`` with ``backends.make_generator`` from ``[generation]`` and then its ``ParamSet``
with the engine's ``build_paramset`` (from the run's seed-log header on resume), as ``jobs.run_es`` does,
and scores one member per call (a block of ``es.member_batch`` low-rank members). ``jobs.run_es`` hands ``factory(...)`` to ``engine.train`` when
``distributed.workers >= 2`` (this module sits beside ``population`` and ``engine`` and imports them,
never the other way round).

Design decisions:

- **Seeds and scalars on the wire, never weights.** Per member the driver sends ``(iteration,
  direction, sign, sigma)`` plus a reference to the iteration's batch (examples, rendered prompts,
  sampling parameters; put in Ray's object store once per iteration) and gets back a scalar fitness,
  the reward error if any, and cost counters (seconds, sequences, tokens). An update goes out as
  ``(iteration, coefficients, scale)`` and every actor applies it to its own replica. A member's
  result is a pure function of those keys and the replica's weights, so the run cannot depend on K or
  on which actor scored which member.
- **Dynamic scheduling.** Every actor holds at most one member; ``ray.wait`` returns the first
  finished one and that actor takes the next unscored member. Fitnesses are stored by member index. One
  scheduler (``_schedule``: send to free actors, collect, replace the dead, resend their work) serves the
  members (``score``) and an evaluation's generator calls (``generate_many``) alike.
- **The driver keeps the record, the actors keep the weights (HF actors; vLLM actors that evaluate, with
  ``generation.eval_backend = "same"``).** Once the actors are up and agree
  (checksums, actor 0's the reference), ``free_driver`` moves the driver's model, the ParamSet's tensors
  and its masters to the ``meta`` device (``jobs.run_es`` asks for it unless a probe function was handed in,
  which may read the model): no replica on the driver, only the seed log, the noise and the shapes.
  Checkpoints, ``masters.safetensors`` and ``final/`` are written by the driver from one actor's tensors
  (the live actor with the lowest id), fetched tensor by tensor in pieces of at most ``PIECE_BYTES``
  (``Replica.piece``; a vLLM actor reads them from its engine's worker, ``es_piece``) and streamed into the files by ``evolm.streamsave`` (``fetch``; the names, shapes and
  tied aliases were taken from the real model before it left), so the files are byte for byte a
  one-process run's (tested, float32 and bfloat16 with masters). The seed log header is written before the
  population starts. If every actor dies during an update the run stops (resume it).
- **Otherwise (vLLM actors evaluating on the driver, a probe handed in) the driver keeps a copy it brings up to date only when it
  reads it.** An update goes to the actors and is queued on the driver's ``ParamSet`` (``defer_update``),
  so an iteration costs the actors' in-place step, not a CPU pass over the driver's copy beside them.
  Before the driver's weights are read — checkpoints, probes, ``es.eval_center_every``, ``final/`` and
  held-out evaluation at the end — the engine calls ``sync``, which applies the queue in order (the same
  arithmetic as applying each update when it came, so bit-identical) and checks the result against the
  actors' checksums. Cost: one model's memory in the driver (for SmolLM2-135M on CPU ~0.7 GB), and the
  catch-up at those points.
- **Evaluation where the weights are (HF actors).** ``jobs.run_es`` makes the run's held-out generator an
  ``ActorsOrDriver``, which the population is attached to once its actors are up: held-out evaluation before
  training (``engine.train`` calls ``jobs.measure_start`` once the population is up) and after it, probes and the centre's score (``es.eval_center_every``) run on the actors' unperturbed replicas
  (``Replica.generate``, under ``heldout.isolated`` as on the driver). ``evaluate`` hands an evaluation's
  generator calls to ``generate_many`` all at once; each call goes whole to the first free actor, with the
  batch and the per-call seed (``seeding.ids_seed`` of its problems' ids) it has in one process, so the
  tables are bit-identical to a one-process run's (tested: 2 actors, before/after tables, probes, centre).
  The population then outlives ``engine.train`` and ``jobs.run_es`` closes it after ``finish_run``. vLLM
  actors leave every evaluation to the driver's HF copy (their engines would give other samples).
- **The driver's time is measured.** Each update's metrics record holds ``driver_seconds``: the wall time
  from the previous update's last fitness (the iteration's start for the first update of a process) to this
  update's first member being sent, i.e. everything the actors wait on the driver for: the update's
  arithmetic, sending it, logging, probes and checkpoints between.
- **The driver does not wait for an update it can prove finite.** It keeps an upper bound of
  every selected tensor's ``max |theta|`` (the first actor's ``peaks`` at start, computed in the engine's worker
  for a vLLM actor, plus each applied update's
  ``ParamSet.update_bound``); when ``params.within_bounds`` proves the update cannot make a weight non-finite
  (the same test each replica makes before it writes), the update is sent and counted applied, and the next
  members are sent behind it at once (Ray runs one caller's calls to an actor in order); the actors'
  answers (applied, checksums) are checked by ``confirm_update`` as soon as that work is out (``_schedule``),
  and before any save or ``sync``. An update the bound cannot prove (near overflow; every low-rank update,
  whose ``|A B^T|`` has no cheap bound) is waited for as before. ``ray_update_seconds`` in the next record is the slowest actor's time
  applying and checksumming it: actor time, the same work as in one process.
- **Replicas stay bit-identical, checked on their device.** After loading and after every applied update
  each actor returns ``checksum.tensor_checksum`` per selected tensor (the float32 masters first when
  generation runs in lower precision, then the weights generation reads): an integer reduction of the
  bit patterns computed where the tensor lives (no host copy on CUDA; ~0.1 s (timed once, under load) per 134M parameters on
  one CPU thread). The first actor's answer is the reference for the others after an update (and
  whether the update applied: a non-finite update is refused by every replica alike); at start-up and
  when the driver catches up, the driver's copy is. Any difference stops the run with a one-line
  ``DistributedError`` naming the actor and the first differing tensor.
- **vLLM actors** (``generation.backend = "vllm"``, ``backends.actors_generate``). Each actor starts
  its own engine, which loads the weights once from the spec's files and the checkpoint's (the actor's HF
  model is a structure on ``meta``: ``models.load_structure``; a spec without local safetensors files is
  loaded into an HF copy first, dropped to ``meta`` once the engine is up), and ``build_paramset`` wraps
  the ParamSet into it (``EngineParamSet``), so a member is perturbed inside the engine that generates it,
  exactly as in a single-process vLLM run. The checksums
  the actor reports are computed inside the engine's worker on the engine's own tensors (``EngineParamSet.engine_checksums``), not on the actor's HF mirror. The
  driver starts no engine (``backends.make_generators``): with ``generation.eval_backend = "same"`` the
  actors' engines run held-out evaluation and probes and the driver drops its copy (above); with ``"hf"``
  its HF copy (brought up to date by ``sync``) runs them. On CUDA
  each engine takes the GPU(s) Ray reserves (``distributed.gpus``) and the driver's model stays on the
  CPU (``model.device = "cuda"`` is refused so the driver cannot take GPU 0). ``close`` asks every
  actor to shut its generator down (an engine's processes) before killing it.
- **Same arithmetic everywhere.** Actors use the driver's torch thread count (``distributed.threads``,
  default ``model.threads``; from the cluster for ``"auto"`` when joining one, below) and its ``EVOLM_FUSED`` choice; the driver builds the fused CPU kernel
  (``evolm.es.fused``) before any actor starts, so actors on its machine only load it (the kernel and
  the torch ops give bit-identical perturbations anyway: ``params.PERTURB_ARITHMETIC``). With the
  same threads, a run with K actors reaches bit-identical weights, fitnesses and seed log to a local
  run (tested).
- **Faults.** An actor that dies (process killed, Ray's memory monitor, node lost; at start-up too,
  unless its own ``__init__`` raised, which is a setup error and stops the run) is replaced, up to
  ``distributed.max_restarts`` times per run, and its unfinished member goes back to the queue; past
  the budget it is dropped and the others carry on. A replacement loads the same spec (or checkpoint)
  and then receives a live actor's selected tensors and float32 masters, a piece of at most
  ``PIECE_BYTES`` at a time from actor to actor through Ray's object store (``_copy_weights``; the
  driver waits meanwhile, one piece in flight, which it also reads to learn the source is alive), so it
  replays nothing; vLLM actors read the pieces from their engine's worker and write each tensor, once
  whole, into it (``es_piece``, ``es_put``). One with no live actor to copy loads the same spec, or the
  newest checkpoint the driver wrote, and replays the updates applied since (the seed log's
  coefficients and scales, kept in memory).
  Either way it must report the other actors' checksums before it takes work; the records count
  ``ray_copied`` and ``ray_replayed`` (updates replayed by replacements). Before an update is sent, replacements still loading are waited for, so every
  live actor receives every update.
- **Where the actors' weights come from.** The model spec (``model.spec``) when the engine loaded the
  model from it; the resumed checkpoint on ``--resume``; and for a model handed to ``run_es`` in
  memory (pipelines, tests), a copy the driver writes once into ``<run>/replica_init/`` and deletes on
  ``close``. On a multi-node cluster these paths must be readable from every node (a shared
  filesystem) and evolm, with the same torch and NumPy versions, must be installed on every node.
- **Placement that cannot hang.** Before anything loads (``jobs.run_es`` calls ``reserve``), one Ray placement
  group reserves a bundle per actor (``{"CPU": threads}``, plus ``"GPU": distributed.gpus``), spread over the
  nodes, and waits at most ``distributed.placement_timeout_s`` for it; what does not fit is one line naming
  the bundle, what the cluster has (per node too) and the settings that would fit. Actors, replacements
  included, go into free bundles (``PlacementGroupSchedulingStrategy``). A replacement for an actor whose
  node was lost starts once Ray has placed that node's bundle again (on a node with room), within the same
  bound, else the run carries on without it. No memory is reserved: an actor's footprint is not known before it
  loads, and Ray's ``memory`` resource is a number it never enforces. ``model.threads = "auto"`` on a cluster
  (not a private instance, which is sized from the threads) gives every actor the most CPUs with which all
  of them fit (``cluster_threads``), the same count for all (a sampled logit's last bits depend on it), and
  each actor reads its count from Ray (``assigned_cpus``) instead of taking the driver's core count.
- **Ray itself.** ``distributed.address = ""`` starts a private local instance (``address="local"``,
  so a cluster started with ``ray start`` on the machine is never joined by accident; no dashboard;
  ``workers x threads`` CPUs; a small object store, since only scalars and prompts travel; actors at the
  driver's priority, ``WORKER_NICENESS``) and shuts it down on ``close``; ``"auto"``, ``"ray://..."`` or ``HOST:PORT`` join an existing cluster. A Ray
  already initialised in the process (a notebook, a test fixture) is used as it is and left running.
  GPUs a private instance does not have are refused in one line before anything loads
  (``check_local_gpus``) and again once connected; joining a cluster that has too few says so, and the
  placement's bounded wait decides.
- **No orphaned engines.** A vLLM actor's engine processes die with it: ``VLLMGenerator`` marks its process
  as the engine's parent and every engine process arms ``PR_SET_PDEATHSIG`` (``backends.vllm.die_with_parent``:
  the engine core through evolm's ``vllm.general_plugins`` entry point, its workers as they import
  ``evolm.es.vllm_worker``), so an actor killed with SIGKILL, or whose
  node's raylet died, does not leave an engine holding the GPU its replacement needs. (Ray 2.60's raylets
  also kill a dead worker's process group, unless turned off; older Rays do not.)
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import socket
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from evolm import models
from evolm.backends import engine_options, heldout_backend, make_generator
from evolm.errors import UserError
from evolm.es import fused
from evolm.checksum import tensor_checksum
from evolm.es.engine import load_masters, save_masters, build_paramset, float32_model, make_population
from evolm.es.params import within_bounds
from evolm.es.population import NON_FINITE_WEIGHTS, MemberScores
from evolm.es.update import Update
from evolm.runs import load_weights, write_model_weights

OBJECT_STORE_BYTES = 256 * 1024 * 1024
"""Object store of a private local Ray instance: per iteration only the prompts travel through it."""
WORKER_NICENESS = 0
"""Nice value of a private local instance's workers. Ray starts workers at nice 15 by default (its
``worker_niceness``), which on a machine shared with other jobs left the actors, who do all the
scoring, with the CPU the other jobs did not want (measured here: ~5% of a core beside two busy
processes); an existing cluster keeps its own setting."""


PIECE_BYTES = 64 * 1024 * 1024
"""The most bytes of one tensor the driver fetches from an actor per call when it saves weights it does not hold."""

CLOSE_SECONDS = 60.0
"""How long ``RayPopulation.close`` waits for the actors to close their generators before killing them."""


class DistributedError(UserError):
    """The Ray population cannot go on (replicas diverged, every actor died, Ray unreachable); one line."""


# -- pure helpers -----------------------------------------------------------------------------------

def weights_checksum(params) -> list[int]:
    """``checksum.tensor_checksum`` of every selected tensor in ``params`` order, computed on the tensor's
    device: the float32 masters first when kept, then the weights generation reads. A replica whose
    ``ParamSet`` lives in a vLLM engine (``EngineParamSet``) reports the engine's own tensors, computed
    inside its worker (``es_replica_checksums``)."""
    engine = getattr(params, "engine_checksums", None)
    if engine is not None:
        return engine()
    return [tensor_checksum(t) for t in (params.masters or [])] + [tensor_checksum(t) for t in params.tensors]


def checksum_names(params) -> list[str]:
    """The tensor each entry of ``weights_checksum`` covers."""
    masters = [f"{n} (float32 master)" for n in params.names] if params.keeps_masters else []
    return masters + list(params.names)


def gpu_capacity(gpus: float, per_actor: float) -> int:
    """How many actors reserving ``per_actor`` GPUs each fit on ``gpus`` whole GPUs (a fraction below 1
    packs ``floor(1 / per_actor)`` actors onto one GPU; Ray never splits an actor across GPUs)."""
    whole = math.floor(gpus + 1e-9)
    if per_actor < 1:
        return whole * math.floor(1 / per_actor + 1e-9)
    return math.floor(whole / math.ceil(per_actor - 1e-9))


def check_local_gpus(cfg) -> None:
    """Before anything loads: a private Ray instance (``distributed.address = ""``) has this machine's
    GPUs, so actors that cannot all get theirs are refused in one line (``RayPopulation`` checks Ray's
    own count again once connected, and warns for a cluster it joins)."""
    d = cfg.distributed
    if d.workers < 2 or not d.gpus or d.address.strip():
        return
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    fit = gpu_capacity(have, d.gpus)
    if fit < d.workers:
        raise UserError(f"distributed.workers={d.workers} actors x distributed.gpus={d.gpus:g} GPU need more GPUs than "
                        f"this machine's {have} (room for {fit} actors); set distributed.workers <= {fit}, or a smaller "
                        "distributed.gpus to share a GPU (0.5: two actors per GPU)")


def bundles_on(node: dict, bundle: dict) -> int:
    """How many actor bundles (``{"CPU": c, "GPU": g}``) fit on a node with resources ``node`` (Ray's totals)."""
    fits = []
    for name, amount in bundle.items():
        have = float(node.get(name, 0.0))
        fits.append(gpu_capacity(have, amount) if name == "GPU" else math.floor(have / amount + 1e-9))
    return min(fits) if fits else 0


def cluster_threads(nodes: list[dict], workers: int, gpus: float = 0.0) -> int:
    """The most CPUs per actor (its torch threads) with which ``workers`` equal bundles fit on ``nodes``; 1
    when none does (the placement then says what is missing). Every actor gets the same count: a sampled
    logit's last bits depend on the thread count, so actors with different counts would score the same
    member differently."""
    most = max((int(n.get("CPU", 0)) for n in nodes), default=1)
    for c in range(most, 0, -1):
        bundle = {"CPU": c, **({"GPU": gpus} if gpus else {})}
        if sum(bundles_on(n, bundle) for n in nodes) >= workers:
            return c
    return 1


def placement_shortfall(nodes: list[dict], workers: int, bundle: dict) -> str | None:
    """One line saying why ``workers`` bundles do not fit on ``nodes`` (None when they do), with the
    settings that would fit."""
    room = sum(bundles_on(n, bundle) for n in nodes)
    if room >= workers:
        return None
    need = ", ".join(f"{k}: {v:g}" for k, v in bundle.items())
    have = []
    for name in bundle:
        amounts = [float(n.get(name, 0.0)) for n in nodes]
        have.append(f"{sum(amounts):g} {name}s on {len(nodes)} node{'s' if len(nodes) != 1 else ''} "
                    f"(at most {max(amounts, default=0):g} per node)")
    fixes = []
    gpus = bundle.get("GPU", 0.0)
    threads = cluster_threads(nodes, workers, gpus)
    if threads < bundle.get("CPU", 0) and sum(bundles_on(n, {**bundle, "CPU": threads}) for n in nodes) >= workers:
        fixes.append(f"set distributed.threads={threads}")
    if room:
        fixes.append(f"distributed.workers={room}")
    fixes.append("add nodes")
    return (f"distributed.workers={workers} actors need {workers} x {{{need}}} but the cluster has {', '.join(have)}: "
            f"room for {room} actor{'s' if room != 1 else ''}; {', or '.join(fixes)}")


def first_mismatch(names: list[str], expected: list[int], got: list[int]) -> str | None:
    """The first tensor whose checksum differs (or a length message), None when all agree."""
    if len(expected) != len(got):
        return f"{len(got)} tensors instead of {len(expected)}"
    for name, a, b in zip(names, expected, got):
        if a != b:
            return name
    return None


def _one_or_all(values: set):
    """The value when all agree, else all of them sorted (a metrics field)."""
    return next(iter(values)) if len(values) == 1 else sorted(values)


def actor_failure(error: BaseException) -> str:
    """One line saying why an actor died: the Python exception its creation raised, else Ray's reason
    (e.g. the worker process was killed, or Ray's memory monitor killed it)."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if getattr(error, "actor_init_failed", False) or "creation task" in lines[0]:
        for line in reversed(lines):
            if re.match(r"^[\w.]*(Error|Exception|Exit|Interrupt)\b", line):
                return line
    fields = re.compile(r"^(class_name|actor_id|pid|name|namespace|ip):")
    rest = [line for line in lines[1:] if not fields.match(line)]
    return (rest[0] if rest else lines[0])[:300]


# -- the actor --------------------------------------------------------------------------------------

@dataclass
class ReplicaRecipe:
    """Everything an actor needs to build its replica at the driver's current weights (no weights)."""

    cfg: Any
    """The run's ``ESJob``: model dtype/device, ``[generation]``, ``[es]`` (noise, parameter selection)."""
    spec: str
    """Model spec the actor loads (architecture, tokenizer, base weights)."""
    checkpoint: str | None
    """Directory whose safetensors weights (and ``masters.safetensors``) replace the spec's weights."""
    header: dict | None
    """The run's seed-log header on resume (the noise is rebuilt from it, as the driver's is), else None."""
    task: Any
    """The training task (small, picklable; rewards are computed in the actor)."""
    replay: list[tuple[int, list[float], float]] = field(default_factory=list)
    """Updates ``(iteration, coefficients, scale)`` applied since ``checkpoint`` (or the spec), in order."""
    threads: int = 1
    """torch threads of the actor; 0: the CPUs Ray assigned it (its placement bundle's, ``model.threads = "auto"``
    on a cluster)."""
    fused: bool = False
    """Whether the driver perturbs with the fused CPU kernel (the actor must use the same path)."""


class Replica:
    """One actor's state: a model replica behind the population ``engine.make_population`` builds (a
    ``LocalPopulation``, or a low-rank one that scores a block of members per call). Plain class; Ray wraps it.

    The generator is built first, then the ParamSet through ``build_paramset(..., generator)``, as in
    ``jobs.run_es``: with ``generation.backend = "vllm"`` the actor starts its own engine and the ParamSet
    wraps into the engine's (``attach_paramset``), so members are perturbed where they are generated, and
    the checksums it reports are the engine's. The weights are loaded once, by the engine, from the spec's
    safetensors files and then the checkpoint's (its HF model is only a structure on ``meta``:
    ``models.load_structure``); a spec without local safetensors files (a hub model not in this node's cache)
    is loaded into an HF copy first, which the engine starts from and the actor then drops."""

    def __init__(self, recipe: ReplicaRecipe):
        t0 = time.perf_counter()
        os.environ["EVOLM_FUSED"] = "1" if recipe.fused else "0"
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        self.threads = recipe.threads or assigned_cpus()
        recipe = replace(recipe, threads=self.threads)
        torch.set_num_threads(recipe.threads)
        cfg = recipe.cfg
        g = cfg.generation
        revision = cfg.model.revision if recipe.spec == cfg.model.spec else ""
        engine = {**engine_options(cfg), "threads": recipe.threads}
        one_load = g.backend == "vllm" and models.weights_location(recipe.spec, revision) is not None
        if g.backend == "vllm":
            _check_engine_device(cfg)
        if one_load:  # the engine loads the weights (the spec's files, then the checkpoint's); the HF model is on meta
            model, tokenizer = models.load_structure(recipe.spec, dtype=cfg.model.dtype, revision=revision,
                                                     trust_remote_code=cfg.model.trust_remote_code)
            engine["checkpoint"] = recipe.checkpoint
        else:
            model, tokenizer = models.load(recipe.spec, dtype=cfg.model.dtype, threads=recipe.threads, device=cfg.model.device,
                                           revision=revision, trust_remote_code=cfg.model.trust_remote_code)
            if recipe.checkpoint:
                load_weights(model, Path(recipe.checkpoint))
        self.hf_loads = 0 if one_load else 1  # times the actor read the weights into an HF model (ready() reports it)
        self.engine = g.backend == "vllm"  # the weights live in a vLLM engine's worker (pieces, copies, processes)
        # a vLLM engine starts from these weights, with the actor's thread count
        generator = make_generator(g.backend, model, tokenizer, g.batch_size, g.prefix_cache, cpu_matmul=g.cpu_matmul,
                                   **engine)
        self.generator = generator
        self.model = model
        try:
            params = build_paramset(model, cfg, recipe.header, generator)  # vLLM: perturbs inside the engine
            if recipe.checkpoint:
                load_masters(params, Path(recipe.checkpoint), model)
            generator.sync_weights()  # masters loaded into the HF copy reach the engine
            for iteration, coefficients, scale in recipe.replay:
                params.apply_update(iteration, coefficients, scale)
            generator.sync_weights()
            release = getattr(generator, "release_hf_copy", None)  # vLLM: the engine holds the weights from here on
            if release is not None:
                release()
        except BaseException:
            generator.close()
            raise
        self.population = make_population(cfg, params, generator, recipe.task)  # low-rank: a block in one call
        self._incoming: dict[tuple[str, str], torch.Tensor] = {}  # a vLLM actor's pieces being copied in (put_piece)
        self.fused = cfg.model.device == "cpu" and fused.kernel() is not None
        self.seconds_start = time.perf_counter() - t0

    def ready(self) -> dict:
        """Who the actor is, its checksums and, for an HF replica, ``max |theta|`` per selected tensor (``peaks``:
        the driver bounds later updates with it)."""
        params = self.population.params
        return {"pid": os.getpid(), "host": socket.gethostname(), "node": _node_id(), "threads": self.threads,
                "fused": self.fused, "checksum": weights_checksum(params), "seconds_start": self.seconds_start,
                "peaks": params.peaks(),  # HF: read here; vLLM: in the engine's worker
                "hf_copy_bytes": sum(p.numel() * p.element_size() for p in self.model.parameters() if p.device.type != "meta"),
                "hf_loads": self.hf_loads, "engine_pids": self._engine_pids()}

    def _engine_pids(self) -> list[int]:
        """The pids of this actor's vLLM engine-core processes (none for HF): tests check that each actor has its
        own and that none outlives the run."""
        if not self.engine:
            return []
        import psutil

        found = []
        for child in psutil.Process().children(recursive=True):
            try:
                if any("EngineCore" in part for part in (child.name(), *child.cmdline()[:1])):
                    found.append(child.pid)
            except psutil.Error:
                continue
        return found

    def score(self, iteration: int, members: list[tuple[int, int]], sigma: float, batch) -> dict:
        """Score a block of members ``(direction, sign)``: one member of a full-rank population, a block of a
        low-rank one (its population scores the block in one batched call: HF rows, or vLLM LoRA adapters)."""
        examples, prompts, sampling = batch
        s = self.population.score(iteration, [tuple(m) for m in members], sigma, examples, prompts, sampling)
        return {"fitness": list(s.fitness), "errors": dict(s.errors), "unscored": list(s.unscored), "seconds": s.seconds,
                "gen_sequences": s.gen_sequences, "gen_tokens": s.gen_tokens}

    def apply_update(self, iteration: int, coefficients: list[float], scale: float) -> dict:
        """Apply the update to this replica; whether the weights took it (non-finite: refused), the checksums,
        and the seconds both took here."""
        t0 = time.perf_counter()
        done = self.population.apply_update(iteration, Update(coefficients, scale, "applied"))
        return {"applied": done.applies, "checksum": weights_checksum(self.population.params),
                "seconds": time.perf_counter() - t0}

    def piece(self, kind: str, name: str, start: int, stop: int) -> torch.Tensor:
        """Elements ``start:stop`` of one stored tensor, flattened, on the CPU: ``kind`` "weights" (what a save
        writes under ``name``: the float32 master in place of a lower-precision tensor) or "master"
        (``masters.safetensors``). The driver assembles a checkpoint or ``final/`` from these, a bounded
        piece at a time (``RayPopulation.fetch``)."""
        params = self.population.params
        if self.engine:  # a vLLM actor: from its engine's worker (TP 1: validation)
            from safetensors.torch import load

            return load(self.generator.rpc("es_piece", kind, name, start, stop)[0])["piece"]
        if kind == "master":
            tensor = dict(zip(params.names, params.masters or []))[name]
        elif kind == "tensor":  # a selected tensor as generation reads it (a replacement copies these and the masters)
            tensor = params.tensors[params.names.index(name)]
        else:
            from evolm.streamsave import ModelWeights, saved_tensors

            weights = float32_model(self.model, params)
            weights = weights if isinstance(weights, ModelWeights) else ModelWeights(weights)
            tensor = saved_tensors(weights.model, weights.replace)[name]
        return tensor.detach().reshape(-1)[start:stop].to("cpu", copy=True)

    def loaded(self) -> bool:
        """Whether ``__init__`` finished (a replacement that copies a live actor's weights is then sent them)."""
        return True

    def put_piece(self, kind: str, name: str, start: int, values: torch.Tensor) -> int:
        """Write a piece another actor's ``piece`` returned ("tensor" or "master") into this replica."""
        params = self.population.params
        k = params.names.index(name)
        if self.engine:  # a vLLM actor: a whole tensor at a time into its engine's worker
            from safetensors.torch import save

            numel = params.tensors[k].numel()
            whole = self._incoming.setdefault((kind, name), torch.empty(numel, dtype=values.dtype))
            whole[start:start + values.numel()] = values
            if start + values.numel() == numel:
                self.generator.rpc("es_put", kind, name, save({"piece": self._incoming.pop((kind, name))}))
            return values.numel()
        target = params.masters[k] if kind == "master" else params.tensors[k]
        target.view(-1)[start:start + values.numel()].copy_(values.to(target.dtype))
        return values.numel()

    def copied(self) -> dict:
        """After the pieces: the generator sees the new weights; what ``ready`` reports."""
        self.generator.sync_weights()
        if self.engine:  # a vLLM engine's weights changed under its prefix cache
            self.generator.reset_prefix_cache()
        return self.ready()

    def generate(self, prompts: list[str], sampling) -> list:
        """Completions of the replica's current (unperturbed) weights: one generator call of an evaluation
        (held-out, probe, the centre's score), measured as ``heldout.isolated`` measures on the driver."""
        from evolm.heldout import isolated

        with isolated(self.model):
            return self.generator.generate(prompts, sampling)

    def close(self) -> None:
        """Release the generator (a vLLM engine's processes) before the actor is killed."""
        self.generator.close()


def assigned_cpus() -> int:
    """The CPUs Ray assigned this actor (its placement bundle's); 1 outside Ray."""
    try:
        import ray

        if not ray.is_initialized():  # get_runtime_context() would start a Ray instance in a plain process
            return 1
        return max(1, int(ray.get_runtime_context().get_assigned_resources().get("CPU", 1)))
    except Exception:  # not in a Ray worker
        return 1


def _node_id() -> str:
    try:
        import ray

        if not ray.is_initialized():
            return ""
        return ray.get_runtime_context().get_node_id()
    except Exception:  # not in a Ray worker
        return ""


def _check_engine_device(cfg) -> None:
    """A CUDA build of vLLM needs the GPU Ray reserves for the actor (``distributed.gpus``); one line if none."""
    if cfg.distributed.gpus > 0 or torch.cuda.is_available():
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        raise UserError("generation.backend='vllm' in a Ray actor: this vLLM build generates on GPUs but "
                        "distributed.gpus is 0, so Ray gave the actor none; set distributed.gpus=1 (one engine per GPU)")


# -- the driver's side ------------------------------------------------------------------------------

def _import_ray(workers: int):
    try:
        import ray  # optional (the distributed extra) and heavy: imported when a Ray population starts
    except ImportError:
        raise UserError(f"distributed.workers={workers} needs Ray: pip install 'evolm[distributed]' "
                        "(or set distributed.workers=0 to score in this process)") from None
    return ray


def _connect(ray, address: str, num_cpus: int) -> bool:
    """Initialise Ray unless it already is; True when this call started (and so owns) it."""
    if ray.is_initialized():
        return False
    try:
        if not address:
            ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, logging_level=logging.ERROR,
                     object_store_memory=OBJECT_STORE_BYTES, _system_config={"worker_niceness": WORKER_NICENESS})
        else:
            ray.init(address=address, logging_level=logging.ERROR)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = f"distributed.address='{address}'" if address else "a local Ray instance"
        hint = ""
        if "AuthenticationError" in type(e.__cause__).__name__ and os.environ.get("RAY_AUTH_MODE") != "token":
            hint = ("; the cluster uses token authentication: set RAY_AUTH_MODE=token and its token "
                    "(~/.ray/auth_token or RAY_AUTH_TOKEN) for evolm es")
        raise DistributedError(f"could not start Ray ({where}): {str(e).splitlines()[0] if str(e) else type(e).__name__}{hint}") from None
    return True


def threads_auto(cfg) -> bool:
    """Whether the actors' thread count is the user's ``"auto"``: ``distributed.threads`` unset and
    ``model.threads`` resolved by ``config.resolve_auto`` (its notes name the fields it resolved)."""
    return not cfg.distributed.threads and any(n.startswith("model.threads = ") for n in getattr(cfg, "auto_notes", []))


def _check_gpus(ray, dist, owns_ray: bool, say: Callable[..., None]) -> None:
    """GPUs a private instance does not have are refused in one line (its count is this machine's); a
    cluster that was joined may grow, so it is said and the placement's bounded wait decides."""
    if not dist.gpus:
        return
    have = float(ray.cluster_resources().get("GPU", 0))
    fit = gpu_capacity(have, dist.gpus)
    if fit >= dist.workers:
        return
    message = (f"distributed.workers={dist.workers} actors x distributed.gpus={dist.gpus:g} GPU need more GPUs than "
               f"the {have:g} Ray sees (room for {fit} actors)")
    if owns_ray:
        raise DistributedError(f"{message}; set distributed.workers <= {fit}, or a smaller distributed.gpus "
                               "to share a GPU (0.5: two actors per GPU)")
    say(f"[evolm] warning: {message}; waiting up to distributed.placement_timeout_s={dist.placement_timeout_s:g} s "
        "for the cluster to have them")


@dataclass
class Placement:
    """Ray, connected, and one placement group holding a bundle per actor (``reserve``)."""

    ray: Any
    group: Any
    """The placement group: ``workers`` bundles of ``bundle``, spread over the nodes where Ray can."""
    bundle: dict
    """One actor's reservation, e.g. ``{"CPU": 1}`` or ``{"CPU": 1, "GPU": 0.5}``."""
    threads: int
    """CPUs (torch threads) of every actor."""
    auto: bool
    """The thread count came from the cluster (``model.threads = "auto"``): actors read it from Ray."""
    owns_ray: bool
    """``reserve`` started Ray (a private instance) or connected to a cluster, and lets go of it in ``release``."""
    where: str
    timeout: float

    def strategy(self):
        """Ray scheduling that puts an actor into any free bundle of the group (a replacement: the dead one's)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(placement_group=self.group, placement_group_bundle_index=-1)

    def whole(self) -> bool:
        """Wait (at most ``timeout``) until every bundle is placed: after a node is lost Ray places its bundles
        again on nodes with room, or keeps them pending."""
        return bool(self.group.wait(timeout_seconds=self.timeout))

    def release(self) -> None:
        if self.group is not None and self.ray.is_initialized():
            try:
                from ray.util import remove_placement_group

                remove_placement_group(self.group)
            except Exception:  # the cluster is gone
                pass
        self.group = None
        if self.owns_ray and self.ray.is_initialized():
            self.ray.shutdown()
        self.owns_ray = False


def reserve(cfg, say: Callable[..., None] = print) -> Placement:
    """Connect to Ray and reserve every actor's resources before anything loads: one placement group,
    a bundle per actor, placed within ``distributed.placement_timeout_s`` or refused in one line naming
    what is missing. ``model.threads = "auto"`` on a cluster gives each actor the most CPUs that let all of
    them fit (``cluster_threads``), not the driver's core count."""
    dist = cfg.distributed
    ray = _import_ray(dist.workers)
    address = dist.address.strip()
    threads = dist.threads or cfg.model.threads
    owns_ray = _connect(ray, address, dist.workers * threads)
    where = address or ("a private local Ray instance" if owns_ray else "the Ray instance of this process")
    try:
        from ray.util import placement_group, remove_placement_group

        nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
        auto = threads_auto(cfg) and not (owns_ray and not address)  # a private instance was sized by threads
        if auto:
            threads = cluster_threads(nodes, dist.workers, dist.gpus)
        _check_gpus(ray, dist, owns_ray and not address, say)
        bundle = {"CPU": float(threads), **({"GPU": float(dist.gpus)} if dist.gpus else {})}
        short = placement_shortfall(nodes, dist.workers, bundle)
        if short and owns_ray and not address:
            raise DistributedError(short)
        if short:
            say(f"[evolm] {short}; waiting up to distributed.placement_timeout_s={dist.placement_timeout_s:g} s "
                "for the cluster to grow")
        group = placement_group([dict(bundle) for _ in range(dist.workers)], strategy="SPREAD")
        if not group.wait(timeout_seconds=dist.placement_timeout_s):
            remove_placement_group(group)
            now = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
            raise DistributedError(placement_shortfall(now, dist.workers, bundle) or (
                f"distributed.workers={dist.workers} actors x {{{', '.join(f'{k}: {v:g}' for k, v in bundle.items())}}} "
                f"were not placed within distributed.placement_timeout_s={dist.placement_timeout_s:g} s although the "
                "cluster's nodes have room: other jobs hold it (`ray status`); wait, or ask for less"))
    except BaseException:
        if owns_ray and ray.is_initialized():
            ray.shutdown()
        raise
    return Placement(ray=ray, group=group, bundle=bundle, threads=threads, auto=auto, owns_ray=owns_ray, where=where,
                     timeout=dist.placement_timeout_s)


class RayPopulation:
    """Scores ES members on K Ray actors and applies updates everywhere (see the module docstring)."""

    def __init__(self, cfg, params, generator, task, *, spec: str, checkpoint: str | None = None,
                 header: dict | None = None, cleanup: Path | None = None, placement: Placement | None = None,
                 say: Callable[..., None] = print):
        """``placement``: the resources ``reserve`` holds for the actors (``jobs.run_es`` reserves them before
        anything loads and releases them); None: reserved here and released by ``close``."""
        dist = cfg.distributed
        self.params = params
        self.generator = generator
        self.block = (cfg.es.member_batch or cfg.es.population) if cfg.es.perturbation == "lowrank" else 1
        """Members per actor call: 1 (full-rank), ``es.member_batch`` (low-rank, resolved to ceil(N / K) from 0)."""
        self.say = say
        self.workers = dist.workers
        self._cleanup = cleanup
        self._actors: dict[int, Any] = {}
        self._starting: dict[Any, tuple[int, Any, list[int]]] = {}
        self.ray = _import_ray(dist.workers)
        from ray.exceptions import OutOfMemoryError, RayActorError  # Ray: optional, see _import_ray

        self._died = (RayActorError, OutOfMemoryError)  # OutOfMemoryError: Ray's memory monitor killed the worker
        self._own_placement = placement is None
        self.placement = placement = placement or reserve(cfg, say)
        threads = placement.threads
        self._names = checksum_names(params)
        self._evaluates = heldout_backend(cfg) == cfg.generation.backend  # HF actors; vLLM ones with eval_backend "same"
        self.outlives_train = False  # True: jobs.run_es closes it, after the evaluation after training (on the actors)
        uses_fused = cfg.model.device == "cpu" and fused.kernel() is not None  # built here, before any actor
        self._recipe = ReplicaRecipe(cfg=cfg, spec=spec, checkpoint=checkpoint, header=header, task=task,
                                     threads=0 if placement.auto else threads, fused=uses_fused)
        self._replay: list[tuple[int, list[float], float]] = []
        self._peaks: list[float] | None = None
        """An upper bound of ``max |theta|`` per selected tensor (``apply_update``), from the first actor's peaks."""
        self.unwaited = 0
        """Updates sent without waiting for their answers (``apply_update``; checked later by ``confirm_update``)."""
        self._limits = params.finite_limits()
        self._pending: tuple[int, dict] | None = None
        """An update sent without waiting for its answers (``apply_update``), checked by ``confirm_update``."""
        self.update_seconds: float | None = None
        """The slowest actor's seconds applying (and checksumming) the last update whose answers came back."""
        self._checksum = weights_checksum(params)
        self._restarts_left = dist.max_restarts
        self.remote = False
        self.replayed = 0
        """Updates replacements replayed (from the spec or the newest checkpoint) so far."""
        self.copied = 0
        """Replacements that copied a live actor's weights instead of replaying."""
        self._copying: set[int] = set()
        """True once ``free_driver`` dropped the driver's weights: saves fetch them from an actor."""
        self._model = None
        self._layout: dict[str, torch.Tensor] = {}
        self._master_layout: dict[str, torch.Tensor] | None = None
        self.first_member_at: float | None = None
        """When ``score`` sent its first member (``time.perf_counter``); with ``last_fitness_at``, when its last
        fitness came back, the engine measures ``driver_seconds``."""
        self.last_fitness_at: float | None = None
        self.restarts = 0
        self._next_id = 0
        self._info: dict[int, dict] = {}
        resources = {"num_cpus": threads, **({"num_gpus": dist.gpus} if dist.gpus else {})}
        self._actor_class = self.ray.remote(Replica).options(max_restarts=0, max_task_retries=0,
                                                             scheduling_strategy=placement.strategy(), **resources)
        t0 = time.perf_counter()
        self._initial = True
        try:
            for _ in range(dist.workers):
                self._start()
            self._settle_starting()
        except BaseException:
            self.close()
            raise
        self._initial = False
        nodes = len({info.get("node") for info in self._info.values()})
        say(f"[evolm] Ray population: {len(self._actors)} actors x {threads} thread(s)"
            + (" (auto: the cluster's CPUs per actor)" if placement.auto else "")
            + (f" x {dist.gpus:g} GPU" if dist.gpus else "") + f" on {placement.where} ({nodes} node"
            + ("s" if nodes != 1 else "") + f"), ready in {time.perf_counter() - t0:.1f} s")

    # -- actors ------------------------------------------------------------------------------------
    def _start(self) -> None:
        """Start an actor at the driver's current weights; returns at once. At start-up, or with no live actor:
        spec or checkpoint + replay of the updates since; a replacement while another actor lives: the spec,
        then the live actor's selected tensors (and masters) copied in (``_copy_weights``), no replay."""
        aid = self._next_id
        self._next_id += 1
        copy = not self._initial and bool(self._actors)
        recipe = replace(self._recipe, replay=[] if copy else list(self._replay))
        handle = self._actor_class.remote(recipe)
        if copy:
            self._copying.add(aid)
            self._starting[handle.loaded.remote()] = (aid, handle, list(self._checksum))
        else:
            self.replayed += len(self._replay)
            self._starting[handle.ready.remote()] = (aid, handle, list(self._checksum))

    def _copy_weights(self, handle) -> dict:
        """Copy a live actor's selected tensors and masters into the new actor ``handle``, a piece of at most
        ``PIECE_BYTES`` at a time through Ray's object store (each piece goes from actor to actor; one in flight,
        the driver waits); returns the new actor's ``ready`` answer, checked by the caller."""
        params = self.params
        kinds = [("tensor", params.tensors)] + ([("master", params.masters)] if params.masters is not None else [])
        for kind, tensors in kinds:
            for name, like in zip(params.names, tensors):
                numel, start = like.numel(), 0
                step = max(1, PIECE_BYTES // max(4, like.element_size()))
                while start < numel:
                    if not self._actors:
                        raise DistributedError("no live Ray actor to copy the weights from; continue with evolm es --resume RUN_DIR")
                    source_id = min(self._actors)
                    source = self._actors[source_id]
                    piece = source.piece.remote(kind, name, start, min(numel, start + step))
                    try:
                        self.ray.get(piece)
                    except self._died as e:  # the source died: another live actor is the source
                        self._on_death(source_id, source, e)
                        continue
                    start += self.ray.get(handle.put_piece.remote(kind, name, start, piece))
        return self.ray.get(handle.copied.remote())

    def _on_started(self, future) -> int | None:
        aid, handle, expected = self._starting.pop(future)
        try:
            info = self.ray.get(future)
            if aid in self._copying:
                self._copying.discard(aid)
                info = self._copy_weights(handle)
                self.copied += 1
        except self._died as e:
            self._on_death(aid, handle, e)
            return None
        self._info[aid] = info
        self._check(aid, info["checksum"], expected, "after loading")
        if self._peaks is None and info.get("peaks") is not None:  # the first actor up
            self._peaks = [float(p) for p in info["peaks"]]
        self._actors[aid] = handle
        return aid

    def _settle_starting(self) -> None:
        """Wait until no actor is still starting (replacements of actors that die meanwhile included)."""
        while self._starting:
            done, _ = self.ray.wait(list(self._starting), num_returns=1)
            self._on_started(done[0])

    def _on_death(self, aid: int, handle, error: BaseException) -> None:
        reason = actor_failure(error)
        self._actors.pop(aid, None)
        info = self._info.pop(aid, {})
        try:
            self.ray.kill(handle)
        except Exception:
            pass
        if self._initial and getattr(error, "actor_init_failed", False):  # its __init__ raised: a setup error
            raise DistributedError(f"Ray actor {aid} failed to start: {reason}")
        who = f"Ray actor {aid}" + (f" (pid {info['pid']} on {info['host']})" if info else "")
        placed = self._restarts_left > 0 and self.placement.whole()  # a lost node's bundle is placed again, or not
        if placed:
            self._restarts_left -= 1
            self.restarts += 1
            source = self._recipe.checkpoint or self._recipe.spec
            self.say(f"[evolm] {who} died ({reason}); starting a replacement from {source} + {len(self._replay)} "
                     f"replayed updates ({self._restarts_left} restarts left)")
            self._start()
        elif self._actors or self._starting:
            why = ("no restarts left (distributed.max_restarts)" if self._restarts_left <= 0 else
                   f"the cluster had no room for its bundle {self.placement.bundle} within "
                   f"distributed.placement_timeout_s={self.placement.timeout:g} s (a node lost?)")
            self.say(f"[evolm] {who} died ({reason}); {why}, carrying on with {len(self._actors) + len(self._starting)} "
                     "actors")
        else:
            raise DistributedError(f"every Ray actor has died (last: {reason}) and distributed.max_restarts is used up; "
                                   "continue the run with evolm es --resume RUN_DIR")

    def _check(self, aid: int, got: list[int], expected: list[int], when: str) -> None:
        bad = first_mismatch(self._names, expected, got)
        if bad is not None:
            host = self._info.get(aid, {}).get("host", "?")
            raise DistributedError(
                f"Ray actor {aid} on {host} diverged from the driver's weights {when} (first differing tensor: {bad}); "
                "every node needs the same model files and the same torch/NumPy versions")

    # -- the population calls ------------------------------------------------------------------------
    def _schedule(self, items: int, send: Callable[[Any, int], Any], done: Callable[[int, int, Any], None],
                  nobody: str) -> list[int]:
        """The one scheduler of ``score`` and ``generate_many``: work items ``0 .. items - 1``, each sent to the
        first free actor (``send(handle, index)`` returns its future; every actor holds at most one), and
        ``done(aid, index, result)`` as each returns, in the order they finish. An item whose actor died goes
        back to the front of the queue (``_on_death`` starts a replacement, which takes items once it is up, as
        does any actor still starting). ``nobody``: the ``DistributedError`` when no actor is left. Returns the
        items sent again after their actor died (once per time)."""
        ray = self.ray
        todo = deque(range(items))
        busy: dict[Any, tuple[int, int]] = {}
        idle = deque(sorted(self._actors))
        again: list[int] = []
        while todo or busy:
            while idle and todo:
                aid = idle.popleft()
                if aid not in self._actors:
                    continue
                index = todo.popleft()
                busy[send(self._actors[aid], index)] = (aid, index)
            self.confirm_update()  # the update sent before this work, checked while the work waits behind it
            if not busy and not self._starting:
                raise DistributedError(f"{nobody}; continue with evolm es --resume RUN_DIR")
            ready, _ = ray.wait(list(busy) + list(self._starting), num_returns=1)
            future = ready[0]
            if future in self._starting:
                aid = self._on_started(future)
                if aid is not None:
                    idle.append(aid)
                continue
            aid, index = busy.pop(future)
            try:
                result = ray.get(future)
            except self._died as e:
                if aid in self._actors:  # else its death was met already (the update sent before this work)
                    self._on_death(aid, self._actors[aid], e)
                todo.appendleft(index)
                again.append(index)
                continue
            done(aid, index, result)
            idle.append(aid)
        return again

    def score(self, iteration: int, layout: list[tuple[int, int]], sigma: float, examples, prompts, sampling,
              on_member: Callable[[], None] | None = None):
        """The members in blocks, one block per actor call: one member each (full-rank), or ``es.member_batch``
        members each (low-rank: the actor scores its block in one batched call, as a one-process run with the
        same ``es.member_batch`` does, so the blocks and their bits are that run's)."""
        batch = self.ray.put((examples, prompts, sampling))
        out = MemberScores(fitness=[math.nan] * len(layout))
        per_actor: dict[int, int] = {}
        self.first_member_at = None
        blocks = [list(range(start, min(start + self.block, len(layout)))) for start in range(0, len(layout), self.block)]

        def send(handle, block: int):
            future = handle.score.remote(iteration, [layout[m] for m in blocks[block]], sigma, batch)
            if self.first_member_at is None:
                self.first_member_at = time.perf_counter()
            return future

        def scored(aid: int, block: int, result: dict) -> None:
            for j, member in enumerate(blocks[block]):
                out.fitness[member] = result["fitness"][j]
                if j in result["errors"]:
                    out.errors[member] = result["errors"][j]
                if j in result["unscored"]:
                    out.unscored.append(member)
            for k, v in result["seconds"].items():
                out.seconds[k] = out.seconds.get(k, 0.0) + v
            out.gen_sequences += result["gen_sequences"]
            out.gen_tokens += result["gen_tokens"]
            per_actor[aid] = per_actor.get(aid, 0) + len(blocks[block])
            self.last_fitness_at = time.perf_counter()
            if on_member:
                for _ in blocks[block]:
                    on_member()

        rescored = self._schedule(len(blocks), send, scored, "no Ray actor is left to score the population")
        out.extra = {"ray_actors": len(self._actors), "ray_restarts": self.restarts,
                     "ray_rescored": sum(len(blocks[b]) for b in rescored),  # members, whole blocks of them
                     "ray_update_seconds": self.update_seconds,
                     "ray_replayed": self.replayed, "ray_copied": self.copied,
                     "ray_members": {str(a): n for a, n in sorted(per_actor.items())},
                     "ray_nodes": len({self._info.get(a, {}).get("node") for a in self._actors}),
                     "ray_threads": _one_or_all({self._info.get(a, {}).get("threads") for a in self._actors} - {None})}
        return out

    # -- the driver keeps the record, the actors keep the weights -------------------------------------
    def free_driver(self, model) -> bool:
        """Drop the driver's weights (``model`` and the ParamSet's tensors and masters go to the ``meta``
        device; the noise and the selection stay): from here on the actors hold the only replicas, saves
        fetch them from one (``remote_weights``, ``save_masters``) and ``sync`` has nothing to do. Only with
        actors that evaluate (the driver's copy is then never read). False, keeping the copy, for a model
        whose classes convert tensors on saving (streamed saves cannot write it)."""
        from evolm.streamsave import saved_tensors

        params = self.params
        if not self._evaluates or getattr(params, "masters_elsewhere", False):
            return False
        if params.deferred:
            self.sync()
        saved = saved_tensors(model)
        if saved is None:
            return False
        self._layout = {n: torch.empty(t.shape, dtype=t.dtype, device="meta") for n, t in saved.items()}
        if params.masters is not None:
            self._master_layout = {n: torch.empty(m.shape, dtype=torch.float32, device="meta")
                                   for n, m in zip(params.names, params.masters)}
        del saved
        self._save_dtype = torch.float32 if params.masters is not None else None
        model.to("meta")
        named = dict(model.named_parameters(remove_duplicate=False))
        params.tensors = [named[n].data for n in params.names]
        if params.masters is not None:
            params.masters = [torch.empty_like(m, device="meta") for m in params.masters]
        self._model, self.remote = model, True
        return True

    def remote_weights(self):
        """What a save writes when the driver holds no weights (``free_driver``): a ``streamsave.ModelWeights``
        whose tensors are fetched from an actor one at a time, in pieces of at most ``PIECE_BYTES``; None while
        the driver holds its copy (then ``engine.float32_model`` of it)."""
        if not self.remote:
            return None
        from evolm.streamsave import ModelWeights

        return ModelWeights(self._model, {}, self._save_dtype, fetch=lambda name, like: self.fetch("weights", name, like),
                            layout=self._layout)

    def save_masters(self, directory: Path) -> None:
        """A checkpoint's ``masters.safetensors``, fetched from an actor (driver without weights)."""
        if self._master_layout is not None:
            from evolm.streamsave import write_named

            write_named(Path(directory) / "masters.safetensors", self._master_layout,
                        fetch=lambda name, like: self.fetch("master", name, like))

    def fetch(self, kind: str, name: str, like: torch.Tensor) -> torch.Tensor:
        """One stored tensor (``Replica.piece``) from the live actor with the lowest id, ``PIECE_BYTES`` at a
        time (another actor takes over if it dies); refused (RuntimeError) if it holds inf or NaN, as
        ``runs.check_finite`` refuses a local save."""
        self.confirm_update()
        numel = like.numel()
        step = max(1, PIECE_BYTES // max(4, like.element_size()))
        flat, start = None, 0
        while flat is None or start < numel:
            self._settle_starting()
            if not self._actors:
                raise DistributedError("no Ray actor is left to read the weights from; continue with evolm es --resume RUN_DIR")
            aid = min(self._actors)
            handle = self._actors[aid]
            try:
                piece = self.ray.get(handle.piece.remote(kind, name, start, min(numel, start + step)))
            except self._died as e:
                self._on_death(aid, handle, e)
                continue
            if flat is None:
                flat = torch.empty(numel, dtype=piece.dtype)
            flat[start:start + piece.numel()] = piece
            start += piece.numel()
        if flat.is_floating_point() and not bool(torch.isfinite(flat).all()):
            raise RuntimeError(f"refusing to save non-finite weights ({name} holds inf or NaN)")
        return flat.view(like.shape)

    # -- evaluation where the weights are ------------------------------------------------------------
    @property
    def evaluates(self) -> bool:
        """Whether the actors take the driver's evaluations (held-out, probes, the centre's score): when their
        generator is the backend the driver would evaluate with (HF actors; vLLM actors with
        ``generation.eval_backend = "same"``; with "hf" the driver's HF copy evaluates)."""
        return self._evaluates

    def generate(self, prompts: list[str], sampling) -> list:
        """One generator call on one actor (the whole call: its batch is the one-process batch)."""
        out: list = []
        self.generate_many([(prompts, sampling)], lambda index, result: out.append(result))
        return out[0]

    def generate_many(self, calls: list, done: Callable[[int, list], None]) -> None:
        """Run generator ``calls`` ``[(prompts, sampling), ...]`` on the actors, each whole on one actor (its
        batch and seed as in one process, so the same completions bit for bit), the next call to the first
        actor free; ``done(index, completions)`` as each returns. A call whose actor dies goes to another."""
        self._settle_starting()
        self._schedule(len(calls), lambda handle, index: handle.generate.remote(*calls[index]),
                       lambda aid, index, result: done(index, result), "no Ray actor is left to evaluate")

    def apply_update(self, iteration: int, update):
        """Apply ``update`` on every replica and queue it for the driver's copy (``sync``); returns it, or it
        marked skipped when the weights refused it (non-finite: every replica refuses it alike).

        The driver keeps an upper bound of every tensor's ``max |theta|`` (the first actor's ``peaks`` at
        start, plus each applied update's ``ParamSet.update_bound``); when the bound proves the update safe
        (``params.within_bounds``, the test every replica makes before writing) it is sent and the driver goes
        on: the next members queue behind it on each actor (Ray runs an actor's calls in the order they were
        sent) and ``confirm_update`` checks the answers once that work is out. Otherwise (an update the bound
        cannot prove finite: near overflow, or low-rank) the driver waits for the answers here. The first actor's answer is the reference the others must match
        (checksums and whether the update applied); with every actor lost during the update the driver catches
        up and is the reference."""
        if not update.applies:
            return update
        self.confirm_update()
        self._settle_starting()  # every live actor must receive every update
        coefficients, scale = [float(c) for c in update.coefficients], float(update.scale)
        step = self.params.update_bound(coefficients, scale)
        sure = (self._peaks is not None and math.isfinite(scale) and all(math.isfinite(c) for c in coefficients)
                and within_bounds(self._peaks, step, self._limits))
        futures = {handle.apply_update.remote(iteration, coefficients, scale): (aid, handle)
                   for aid, handle in self._actors.items()}
        if sure:
            self._took(iteration, coefficients, scale)
            self._pending = (iteration, futures)
            self.unwaited += 1
        elif not self._settle(iteration, futures, coefficients, scale, queued=False):
            return update.skipped(NON_FINITE_WEIGHTS)
        if self._peaks is not None:  # still an upper bound: no weight moved by more than step
            self._peaks = [p + step for p in self._peaks]
        return update

    def _took(self, iteration: int, coefficients: list[float], scale: float) -> None:
        """An applied update: queued for the driver's copy (``sync``) while it holds one, and for replacements."""
        if not self.remote:
            self.params.defer_update(iteration, coefficients, scale)
        self._replay.append((iteration, coefficients, scale))

    def confirm_update(self) -> None:
        """Check the answers to the update ``apply_update`` sent without waiting (nothing to do when none is
        outstanding): the replicas must agree with the first one, which took it."""
        if self._pending is not None:
            (iteration, futures), self._pending = self._pending, None
            self._settle(iteration, futures, [], 0.0, queued=True)

    def _settle(self, iteration: int, futures: dict, coefficients: list[float], scale: float, *, queued: bool) -> bool:
        """Collect every actor's answer to update ``iteration`` and check them against the first actor's, whose
        checksums become the reference for later actors; actors that died meanwhile are replaced (they replay or
        copy this update too). ``queued``: the update was already taken (``_took``: every actor was sure to
        apply it). With every actor lost the driver's copy decides, if it holds one. Returns whether it applied."""
        answers, dead = [], []
        for future, (aid, handle) in futures.items():
            try:
                answers.append((aid, self.ray.get(future)))
            except self._died as e:
                dead.append((aid, handle, e))
        if answers:
            applied, reference = answers[0][1]["applied"], answers[0][1]["checksum"]
            for aid, got in answers[1:]:
                if got["applied"] != applied:
                    raise DistributedError(f"Ray actor {aid} {'refused' if applied else 'applied'} update {iteration + 1} "
                                           f"and Ray actor {answers[0][0]} did not: the replicas differ")
                self._check(aid, got["checksum"], reference, f"after update {iteration + 1}")
            if queued and not applied:
                raise DistributedError(f"Ray actor {answers[0][0]} refused update {iteration + 1} after it was sure to "
                                       "apply it: the replica is broken")
            self.update_seconds = max(float(got.get("seconds", 0.0)) for _, got in answers)
            if applied and not queued:
                self._took(iteration, coefficients, scale)
        elif self.remote:
            raise DistributedError(f"every Ray actor died during update {iteration + 1} and the driver holds no weights; "
                                   "continue the run with evolm es --resume RUN_DIR")
        else:  # nobody answered: the driver's own copy decides (a queued update is in its queue)
            self.params.catch_up()
            applied = queued or self.params.apply_update(iteration, coefficients, scale)
            self.generator.sync_weights()
            reference = weights_checksum(self.params)
            if applied and not queued:
                self._replay.append((iteration, coefficients, scale))
        self._checksum = list(reference)
        for aid, handle, e in dead:
            if aid in self._actors:  # else met already
                self._on_death(aid, handle, e)  # the replacement replays (or copies) this update too
        return applied

    def sync(self) -> None:
        """Bring the driver's copy up to date (the queued updates, in order) before its weights are read,
        and check it against the replicas' checksums: a driver that replays differently stops the run. Nothing to
        do once the driver holds no weights (``free_driver``)."""
        self.confirm_update()
        if self.remote or not self.params.catch_up():
            return
        self.generator.sync_weights()
        bad = first_mismatch(self._names, self._checksum, weights_checksum(self.params))
        if bad is not None:
            raise DistributedError(f"the driver's copy of the weights, rebuilt from the seed log, differs from the Ray "
                                   f"actors' (first differing tensor: {bad}); the driver and the actors need the same "
                                   "torch/NumPy versions")

    def checkpointed(self, directory: Path, step: int) -> None:
        """Replacements load this checkpoint and replay only later updates."""
        self._recipe = replace(self._recipe, checkpoint=str(directory))
        self._replay = []

    def close(self) -> None:
        handles = [*self._actors.values(), *(h for _, h, _ in self._starting.values())]
        if handles and self.ray.is_initialized():  # let live actors shut their engines down (vLLM: its processes)
            closing = [h.close.remote() for h in self._actors.values()]
            try:
                self.ray.wait(closing, num_returns=len(closing), timeout=CLOSE_SECONDS)
            except Exception:
                pass
        for handle in handles:
            try:
                self.ray.kill(handle)
            except Exception:
                pass
        self._actors, self._starting = {}, {}
        placement = getattr(self, "placement", None)
        if placement is not None and self._own_placement:
            placement.release()
        if self._cleanup is not None:
            shutil.rmtree(self._cleanup, ignore_errors=True)
            self._cleanup = None


class ActorsOrDriver:
    """The generator of the driver's evaluations in an actor layout (``jobs.run_es`` makes it the run's
    held-out generator, so held-out evaluation and probes use it): while a population whose actors evaluate
    (``RayPopulation.evaluates``) is attached, each generator call runs on an actor and an evaluation's calls
    run side by side (``generate_many``); otherwise (before the actors start, vLLM actors with
    ``generation.eval_backend = "hf"``) the driver's own
    generator answers. Anything else is the driver generator's."""

    def __init__(self, driver):
        self.driver = driver
        self.population: RayPopulation | None = None

    def __getattr__(self, name):
        return getattr(self.driver, name)

    def _actors(self) -> RayPopulation | None:
        pop = self.population
        return pop if pop is not None and pop.evaluates and (pop._actors or pop._starting) else None

    def generate(self, prompts: list[str], params) -> list:
        pop = self._actors()
        return pop.generate(prompts, params) if pop is not None else self.driver.generate(prompts, params)

    def generate_many(self, calls: list, done: Callable[[int, list], None]) -> None:
        pop = self._actors()
        if pop is not None:
            return pop.generate_many(calls, done)
        for index, (prompts, params) in enumerate(calls):
            done(index, self.driver.generate(prompts, params))


def factory(comps, run, *, checkpoint: Path | None = None, header: dict | None = None, injected: bool = False,
            placement: Placement | None = None, evaluator: ActorsOrDriver | None = None, free: bool = False,
            say: Callable[..., None] = print) -> Callable:
    """The population factory ``engine.train`` calls as ``factory(cfg, params, generator, task)``.

    ``checkpoint``: the checkpoint the driver resumed from; ``header``: the resumed run's seed-log
    header; ``injected``: the model was handed to ``run_es`` in memory, so the actors load a copy the
    driver writes to ``<run>/replica_init/`` (after the checkpoint, if any, was loaded into it); ``placement``: the
    actors' reserved resources (``reserve``), released by the caller; ``evaluator``: the run's
    held-out generator, which the population is attached to (the caller then closes the population, after the
    evaluation after training, instead of ``engine.train``); ``free``: with ``evaluator``, the driver then
    drops its weights once the actors are up (``RayPopulation.free_driver``; nothing may read them after)."""

    def make(cfg, params, generator, task) -> RayPopulation:
        _import_ray(cfg.distributed.workers)
        cleanup = None
        spec, source = cfg.model.spec, str(checkpoint) if checkpoint else None
        if injected:
            target = run.path / "replica_init"
            shutil.rmtree(target, ignore_errors=True)
            write_model_weights(target, float32_model(comps.model, params))
            comps.tokenizer.save_pretrained(target)
            save_masters(params, target)
            spec = source = str(target)
            cleanup = target
        population = RayPopulation(cfg, params, generator, task, spec=spec, checkpoint=source, header=header,
                                   cleanup=cleanup, placement=placement, say=say)
        if evaluator is not None:
            evaluator.population = population
            population.outlives_train = True
            if free and population.free_driver(comps.model):
                say("[evolm] the driver holds no weights now: the actors do, and checkpoints and final/ are read from one")
        return population

    return make
