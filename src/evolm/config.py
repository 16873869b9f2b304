"""Typed run configuration: dataclasses with a docstring per field, loaded from TOML and validated.

Design decisions:

- One dataclass per concern (``RunConfig``, ``ModelConfig``, ``TaskConfig``, ``GenerationConfig``,
  ``ESSection``, ``EvalConfig``, ``DistributedConfig``); a job's config (``ESJob``) nests them as TOML
  tables ``[run] [model] [task] [generation] [es] [eval] [probe] [distributed]``. Other jobs (GRPO,
  pipelines) reuse the same sections and add their own.
- ``load(cls, path, overrides)`` builds the dataclass from TOML, applies ``--set key=value``
  overrides (TOML literals: ``es.sigma=0.002``, ``task.params.digits=3``), rejects unknown fields with a
  did-you-mean, checks types, then calls each section's ``validate()``. Every failure is a
  ``ConfigError`` whose one-line message names the field.
- A user's config file (``load(..., paths_from_file=True)``: ``--config FILE`` of a job verb, sweeps,
  ``evolm config --resolve``) has its relative paths looked up beside the file first (``resolve_paths``):
  ``model.spec``, the ``file.py`` of ``task.name`` / ``task.reward`` / ``task.correct`` / ``eval.task`` /
  ``probe.task``, and the data files of ``task.params`` / ``eval.params`` / ``probe.params`` (``PATH_PARAMS``).
  One that exists there becomes that absolute path; one that does not stays as written, relative to
  the working directory (the shipped configs' repo-relative paths, hub ids, built-in names). ``--set``
  values and ``run.out_dir`` are never moved: a run directory goes where the command runs. A run
  directory's ``config.toml`` records the resolved values and is read as written (resume, replay).
- The resolved config (defaults filled in) is written back into every run directory as
  ``config.toml`` so a run is reproducible from its directory alone.
- Field docstrings are read from this file's source (``field_docs``) so ``evolm config`` can print
  them; they are the single place a setting is documented.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import math
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomli_w

from evolm.categories import CATEGORIES
from evolm.errors import ConfigError
from evolm.rewards import EXACT, RewardFunctions, is_convention, resolve_reward
from evolm.tasks import TASKS, find_task


# --------------------------------------------------------------------------------------------------
# sections

AUTO = "auto"
"""The value of the fields resolved from this machine when a config is validated (``resolve_auto``)."""

TRACKERS = ("tensorboard", "wandb")
"""The experiment trackers ``run.report_to`` can name (``evolm.trackers``)."""

# Upper bounds of numeric fields whose larger values can only be a typo (every float field must also be
# finite: ``_coerce`` refuses inf and nan). A run with es.lr = inf "finished" with every weight NaN.
MAX_SIGMA = 10.0
"""es.sigma: perturbations are ~1e-3 of weights that are ~0.05; 10 already replaces the model by noise."""
MAX_ES_LR = 100.0
"""es.lr: Qiu et al. use 5e-4."""
MAX_TEMPERATURE = 100.0
"""Sampling temperatures: beyond ~2 text is already uniform noise."""
MAX_TABLE = 2**33
"""es.noise_table_size: 2^33 float32 entries are 32 GiB."""


@dataclass
class RunConfig:
    name: str = "es-run"
    """Run directory name under ``out_dir``; ``{time}`` is replaced by a timestamp."""
    out_dir: str = "runs"
    """Parent directory of run directories."""
    seed: int = 0
    """Root seed: every random choice (noise, prompts, sampling) is derived from it by key derivation."""
    checkpoint_every: int = 5
    """Save a checkpoint every this many updates (0: only the final weights)."""
    keep_checkpoints: int = 2
    """How many recent checkpoints to keep on disk (older ones are deleted after a new one is written)."""
    progress: bool = True
    """Show progress bars with ETA."""
    save: Literal["all", "final", "none"] = "all"
    """Weights kept on disk: all = checkpoints (every checkpoint_every updates) and final/; final = final/ only (a killed run resumes from the start); none = no weights (an ES run can rebuild any step from its seed log with `evolm replay`)."""
    save_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype of the weights in final/: bfloat16 halves the disk; checkpoints stay float32 so a resume is exact, and `evolm eval --like` reproduces eval_after.json exactly only from float32 weights."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers that receive every metrics record as it is written, with the run's name and config: tensorboard (event files in RUN_DIR/tensorboard), wandb (RUN_DIR/wandb, offline unless wandb_mode = "online"). Install them with pip install 'evolm[trackers]'."""
    tracker_project: str = "evolm"
    """wandb project the run is filed under."""
    wandb_mode: Literal["offline", "online"] = "offline"
    """wandb: offline writes RUN_DIR/wandb/offline-run-* without a network (upload later with `wandb sync`); online streams to the wandb server (needs `wandb login`)."""
    match: Literal["updates", "sequences", "tokens", "seconds"] = "updates"
    """The quantity the training budget is counted in, so ES and GRPO runs can be matched on it (metrics.jsonl logs all four per update). updates: es.iterations / grpo.steps are the budget. sequences, tokens, seconds: training also stops after the update at which the run's total of generated sequences, generated tokens or update seconds reaches run.budget; es.iterations / grpo.steps stay the cap on updates."""
    budget: float = 0.0
    """The budget in run.match units when run.match is not updates (then > 0; the update that reaches it is the last, so a run overshoots by less than one update). 0 with match = updates."""

    def validate(self, p: str) -> None:
        require(bool(self.name.strip()), f"{p}.name must not be empty")
        require(0 <= self.seed < 2**63, f"{p}.seed must be an integer in [0, 2^63) (got {self.seed})")
        if self.match == "updates":
            require(self.budget == 0, f"{p}.budget counts sequences, tokens or seconds (got {self.budget} with {p}.match = "
                                      "'updates'); an update budget is es.iterations / grpo.steps, or set "
                                      f"{p}.match = 'tokens' (or sequences, seconds)")
        else:
            require(self.budget > 0, f"{p}.match = '{self.match}' needs {p}.budget > 0 ({self.match} to spend)")
        require(self.checkpoint_every >= 0, f"{p}.checkpoint_every must be >= 0 (got {self.checkpoint_every})")
        require(self.keep_checkpoints >= 1, f"{p}.keep_checkpoints must be >= 1 (got {self.keep_checkpoints})")
        bad = [t for t in self.report_to if t not in TRACKERS]
        if bad:
            close = difflib.get_close_matches(bad[0], TRACKERS, n=1)
            raise ConfigError(f"{p}.report_to: unknown tracker '{bad[0]}'" + (f" (did you mean '{close[0]}'?)" if close else "")
                              + f"; choose from {', '.join(TRACKERS)}")
        require(len(set(self.report_to)) == len(self.report_to), f"{p}.report_to names a tracker twice ({self.report_to})")
        require(bool(self.tracker_project.strip()), f"{p}.tracker_project must not be empty")

    @property
    def checkpoints(self) -> bool:
        """Whether the training loop writes checkpoints (``save = "all"`` and ``checkpoint_every > 0``)."""
        return self.save == "all" and self.checkpoint_every > 0


@dataclass
class ModelConfig:
    spec: str = "smollm2-135m"
    """Model to train: an embedded name (smollm2-135m, gemma3-270m), a model directory, a run directory, a .gguf file or a hub id."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Dtype the model generates in. ES always keeps float32 master weights; with float32 it perturbs them in place. auto: bfloat16 for ES on CUDA and on a CPU with AMX bf16 matrix units (generation in bf16, about 1.8x float32's speed there; float32 masters, so updates are exact), float32 on other CPUs (EVOLM_CPU_BF16=0/1 overrides the CPU reading) and for GRPO and pipelines (they train the model's own weights)."""
    threads: int | Literal["auto"] = "auto"
    """torch CPU threads. auto: the cores this process may use (OMP_NUM_THREADS when set, else its CPU affinity capped by a cgroup CPU quota); an ES run that auto-chooses 1-thread Ray actors (distributed.workers) runs its driver at 1 thread too, so the whole run equals one process at 1 thread."""
    device: str = "auto"
    """torch device for the model: auto (cuda when torch sees a GPU, else cpu), cpu, cuda, cuda:1, ..."""
    revision: str = ""
    """Hub id specs: the branch, tag or commit to load ("" is the repository's default branch); pin a commit to make a run reproducible. Ignored for local files."""
    trust_remote_code: bool = False
    """Run the Python code a model's repository (or directory) ships for its architecture; only for models whose code you trust."""

    def validate(self, p: str) -> None:
        require(self.threads == AUTO or self.threads >= 1, f"{p}.threads must be >= 1 or 'auto' (got {self.threads})")
        require(self.device in ("cpu", AUTO) or self.device.startswith(("cuda", "mps")),
                f"{p}.device must be auto, cpu, cuda[:i] or mps (got '{self.device}')")


@dataclass
class TaskConfig:
    name: str = "arithmetic"
    """Training task: a built-in task (arithmetic, countdown, gsm8k, ..., or dataset: rows from any file or hub dataset, docs/custom-tasks.md), an entry point of group evolm.tasks from an installed package, or package.module:Class / path/to/file.py:Class (a subclass of evolm.tasks.Task)."""
    reward: str | list[str] = "format_answer"
    """Reward (docs/rewards.md): a convention, format_answer = 0.1 x format + 1.0 x answer or tiered = 1.0 correct / 0.1 format only / 0, both with the task's answer checker (any task); qiu_exact and tinyzero_exact = Qiu et al.'s and TinyZero's countdown reward code reproduced exactly, qiu_hf_exact = Qiu et al.'s reward on prompt + completion as their HF scripts score it (countdown only); or one or more reward functions in TRL's convention fn(prompts, completions, **columns) -> list[float | None], each an entry point of group evolm.rewards, package.module:function or path/to/file.py:function (docs/custom-tasks.md). The old names qiu and tinyzero load as format_answer and tiered."""
    reward_weights: list[float] = field(default_factory=list)
    """Weights of the reward functions in task.reward, one per function (empty: all 1); the reward is their weighted sum."""
    correct: str = ""
    """Correctness function for pass@k, greedy accuracy and every held-out count: same signature as a reward function, returning booleans (entry point, module:function or file.py:function). "": the task's own checker, or reward >= correct_threshold for task.name = "dataset" with reward functions and no checker param."""
    correct_threshold: float = 1.0
    """With reward functions and no checker: a completion counts as correct when its reward is at least this."""
    params: dict[str, Any] = field(default_factory=dict)
    """Task knobs, e.g. {digits = 2, operators = "+", terms = 2} for arithmetic, {numbers = [3, 4]} for countdown, {path = "countdown.json"} for countdown on Qiu et al.'s or TinyZero's data files, or {path = "rows.jsonl", prompt = "question", answer = "answer"} for dataset."""
    system_prompt: str | None = None
    """System message for chat models; None uses the task's own short instruction, "" drops it (the template's default may then appear)."""

    def validate(self, p: str) -> None:
        from evolm.tasks import find_task

        cls = find_task(self.name)
        refs = [self.reward] if isinstance(self.reward, str) else list(self.reward)
        require(bool(refs), f"{p}.reward must name a convention or at least one reward function")
        convention = len(refs) == 1 and is_convention(refs[0])
        if convention:
            self.reward = resolve_reward(refs[0], f"{p}.reward")
            require(not self.reward_weights, f"{p}.reward_weights weigh reward functions; {p}.reward is the convention "
                                             f"'{self.reward}' (give functions, or drop the weights)")
            if self.reward in EXACT:
                owners = sorted(n for n, c in TASKS.items() if self.reward in c.exact_conventions)
                require(self.reward in cls.exact_conventions,
                        f"{p}.reward = '{self.reward}' reproduces {EXACT[self.reward]} and exists only for "
                        f"{', '.join(owners)}, not '{self.name}'; use format_answer or tiered")
        else:
            require(not any(is_convention(r) for r in refs),
                    f"{p}.reward mixes a convention with reward functions ({refs}); list functions only")
        functions = [] if convention else refs
        if functions or self.correct:  # imports them, checks their weights: a one-line error here, before any run
            RewardFunctions(functions, self.reward_weights, self.correct, self.correct_threshold)


@dataclass
class GenerationConfig:
    backend: Literal["hf", "vllm"] = "hf"
    """Generation backend: hf (transformers generate, CPU or GPU) or vllm (vLLM's engine; ES perturbs its weights in its workers; needs `make vllm`, docs/vllm.md)."""
    batch_size: int = 32
    """Prompts per generate() call."""
    max_new_tokens: int = 24
    """Completion length limit in tokens."""
    temperature: float = 0.0
    """Sampling temperature while training; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass while training (ignored when greedy)."""
    prefix_cache: bool = True
    """hf backend: run the token prefix a batch's prompts share (system message, worked demonstrations) once per batch and member, and reuse its KV cache for every row; false prefills each prompt whole. Same completions as without it up to float rounding (the split prefill rounds differently); batches where a sliding attention window could see the padding between prefix and suffix fall back to plain left padding."""
    cpu_matmul: Literal["auto", "onednn", "torch"] = "auto"
    """hf backend on the CPU: the kernels of float32 linear layers while generating. onednn runs them through oneDNN's matmul (AVX-512 on AMD CPUs, where torch's MKL sgemm runs its AVX2 kernels: an ES iteration 1.5x faster on this project's AMD EPYC, docs/benchmarks.md), torch through torch's own BLAS; auto: onednn where torch has oneDNN (every x86 wheel). Rounds differently from torch's (relative ~1e-6: greedy tokens may differ at near-ties); each choice is deterministic and thread-count invariant. Training with gradients (GRPO's loss), bfloat16, CUDA and vLLM are unaffected."""
    verify: Literal["off", "on", "auto"] = "off"
    """ES members on the hf backend, greedy: on decodes the centre's completions once per update and verifies every member against them (one teacher-forced forward; decoding resumes only from a member's first differing token), logging verify_identical / verify_prefix; auto does so and turns itself off for the rest of the run once an update's mean shared-prefix fraction is below 0.5. Same completions up to near-tie argmax rounding (docs/es.md)."""
    eval_backend: Literal["hf", "same"] = "hf"
    """Backend of held-out evaluation and probes: hf (the reference: full-vocabulary token entropy) or same (the training backend; with vllm faster, but token entropy is not measured). With vLLM Ray actors (distributed.workers >= 2), same evaluates on the actors' engines and the driver then holds no weights; hf keeps an HF copy on the driver to evaluate with."""
    vllm_kv_cache_gb: float | Literal["auto"] = "auto"
    """vllm: memory reserved for the engine's KV cache in GiB (RAM on CPU, GPU memory on CUDA), on top of its weights; 0: vLLM sizes it within vllm_gpu_memory_utilization (CUDA engines only). auto (backend vllm): a quarter of the available RAM per engine (CPU, at most 4) or of the free GPU memory per engine on a GPU here (CUDA, at most 16), rounded down to 0.25 GiB, at least 0.25; 0 for engines on GPUs this machine does not have (Ray actors with distributed.gpus); 1.0 with the hf backend (unused)."""
    vllm_max_model_len: int = 2048
    """vllm: longest prompt + completion in tokens the engine accepts."""
    vllm_enforce_eager: bool = False
    """vllm: run the model eagerly instead of torch.compile'd (the engine starts in ~1 min instead of ~2-4 min on this project's CPU)."""
    vllm_tensor_parallel_size: int = 1
    """vllm: worker processes (GPUs on CUDA) one engine's weights are split over (vLLM's tensor_parallel_size). Each rank perturbs its own slice with the counter noise of each element's index in the full Hugging Face tensor (evolm.shards), so members and updates equal a TP = 1 engine's bit for bit (tested at 2 on vLLM's CPU backend). > 1 is refused with the hf backend, es.perturbation = "lowrank", Ray actors (distributed.workers >= 2), a dtype other than float32, non-counter noise, and CUDA (untested); docs/vllm.md, "Tensor parallelism"."""
    vllm_gpu_memory_utilization: float | Literal["auto"] = "auto"
    """vllm on CUDA: fraction of the GPU's memory one engine may take (vLLM's gpu_memory_utilization; the KV cache's size stays vllm_kv_cache_gb); Ray actors sharing a GPU (distributed.gpus < 1) need at most their share. auto: 0.9 of the fraction torch.cuda.mem_get_info finds free (rounded down to 0.01, at most 0.9, at most distributed.gpus when actors share a GPU); without a GPU here 0.9, or the actors' share (ignored on CPU)."""

    def validate(self, p: str) -> None:
        require(self.batch_size >= 1, f"{p}.batch_size must be >= 1 (got {self.batch_size})")
        require(self.max_new_tokens >= 1, f"{p}.max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        require(0 <= self.temperature <= MAX_TEMPERATURE,
                f"{p}.temperature must be in [0, {MAX_TEMPERATURE:g}] (got {self.temperature})")
        require(0 < self.top_p <= 1, f"{p}.top_p must be in (0, 1] (got {self.top_p})")
        require(self.vllm_kv_cache_gb == AUTO or self.vllm_kv_cache_gb >= 0,
                f"{p}.vllm_kv_cache_gb must be >= 0 (0: vLLM sizes it, CUDA engines only; got {self.vllm_kv_cache_gb})")
        require(self.vllm_max_model_len >= 16, f"{p}.vllm_max_model_len must be >= 16 (got {self.vllm_max_model_len})")
        require(self.vllm_tensor_parallel_size >= 1,
                f"{p}.vllm_tensor_parallel_size must be >= 1 (got {self.vllm_tensor_parallel_size})")
        require(self.vllm_gpu_memory_utilization == AUTO or 0 < self.vllm_gpu_memory_utilization <= 1,
                f"{p}.vllm_gpu_memory_utilization must be in (0, 1] (got {self.vllm_gpu_memory_utilization})")


@dataclass
class ESSection:
    iterations: int = 20
    """Number of ES updates."""
    population: int = 8
    """Members evaluated per update (N). For antithetic it counts both signs: N/2 directions."""
    sigma: float = 1e-3
    """Perturbation scale: a member's weights are theta + sigma * eps, eps ~ N(0, I)."""
    lr: float = 5e-4
    """Step size alpha in theta += alpha / N * sum_i c_i eps_i (see divide_by_sigma)."""
    divide_by_sigma: bool = False
    """Also divide the step by sigma (the textbook gradient estimate). Qiu et al. fold 1/sigma into alpha: off."""
    estimator: Literal["one_point", "antithetic"] = "one_point"
    """one_point: N independent directions (Qiu et al.). antithetic: N/2 directions each scored at +eps and -eps."""
    shaping: Literal["zscore", "centered_rank", "none"] = "zscore"
    """Fitness shaping applied to the N member fitnesses before weighting their noise."""
    prompts_per_iteration: int = 32
    """Training prompts drawn per update; a member's fitness is its mean reward over them."""
    noise: Literal["auto", "table", "stream", "counter"] = "auto"
    """auto: counter (on CPU measured at 1.03x table's ES time per member and 0.64x its peak memory; on a GPU it needs no P-sized table in GPU memory and runs as Triton kernels where Triton imports), table for es.perturbation = lowrank (its factors are views into the table). table: key-derived windows into a seeded shared Gaussian table (Salimans et al. 2017; fast; the table holds P + 2^25 floats). stream: a fresh Gaussian stream per (iteration, member, tensor) (slower). counter: a hash of (seed, iteration, member, tensor, element) picking one of 4606 normal quantiles (a quantised Gaussian, |z| <= 4.9), computed in chunks where the weights are (no P-sized buffer; the same bits on CPU and GPU). See docs/es.md."""
    noise_table_size: int = 0
    """noise = "table": entries in the noise table (float32); 0 picks P + 2^25 for P selected parameters, so no table value repeats within a member's noise (smaller values trade memory for that guarantee)."""
    params: list[str] = field(default_factory=lambda: ["all"])
    """Parameter categories ES perturbs: all, norm, attention, mlp, embedding, lm_head (several allowed)."""
    param_regex: str = ""
    """If set, also require parameter names to match this regular expression."""
    eval_center_every: int = 0
    """Score the unperturbed centre on the iteration's prompts every this many updates (0: never)."""
    perturbation: Literal["full", "lowrank"] = "full"
    """full: each member adds sigma x dense Gaussian noise to every selected coordinate, and members are scored one after another. lowrank (EGGROLL): each selected weight matrix W (out x in; Linear weights, the embedding per looked-up row) gets sigma * A B^T / sqrt(rank) with Gaussian A (out x rank), B (in x rank); vectors (norms, biases) get full noise; all members are scored in one batched forward pass (hf backend), or, with generation.backend = "vllm", as one LoRA adapter each in one engine call (es.params must then be attention and mlp only: LoRA cannot perturb norms, biases, embeddings or the LM head). See docs/es.md."""
    rank: int = 4
    """Rank r of each member's matrix perturbation when perturbation = "lowrank" (an update has rank <= N x r)."""
    member_batch: int = 0
    """With perturbation = "lowrank": members per batched generate call (0: all N at once). Rows per call = members x prompts; lower it to bound memory (the KV cache grows with the rows). On vLLM: members (LoRA adapters) per engine call, and the engine's LoRA slots. With Ray actors (distributed.workers = K >= 2) each actor call scores one block of this many members; 0 there resolves to ceil(N / K) at the start (recorded in config.toml: the block size can change a member's last bits, and a one-process run with the same value scores the same blocks)."""
    arithmetic: Literal["exact", "reference", "artifact"] = "exact"
    """exact: float32 masters (or float32 weights perturbed in place with recorded corrections), restore bit for bit, updates accumulated in float32. reference: Qiu et al.'s arithmetic, in the model's own dtype (model.dtype) and in place: perturb adds sigma * eps, restore subtracts the regenerated sigma * eps (not exact in bf16/fp16), the update is accumulated, divided by N and scaled by lr in that dtype (one_point, hf backend, one process; see docs/es.md and evolm/es/reference.py). artifact: the published code of arXiv 2608.27351 (github.com/yunpengba7/understanding-es): float32 noise times sigma cast to model.dtype and added in place, reverted by the same with -sigma (not exact), the update summed in float32 and added in model.dtype, on es.engines replicas that each revert and update on their own, synced from replica 0 every es.engine_sync_every updates, at checkpoints and at the end (one_point, hf backend, one process, CPU; evolm/es/artifact.py)."""
    engines: int = 1
    """With arithmetic = "artifact": the artifact's vLLM engines, simulated as replicas of the selected weights in this process; member m is scored on replica m // ceil(N / engines) (the artifact's split), and replica 0 is the model that is checkpointed, saved and evaluated. Memory: (engines - 1) x P x bytes(model.dtype) beside the model, e.g. 1.9 GB for SmolLM2-135M in bf16 at 8 engines, 21.6 GB for Qwen2.5-1.5B."""
    engine_sync_every: int = 0
    """With arithmetic = "artifact" and engines > 1: copy replica 0 into the others after every update whose number is a multiple of this (the artifact: 117, once per epoch); 0: only at checkpoints and after the last update (always synced there, as the artifact syncs before each checkpoint, so run.checkpoint_every is part of the arithmetic: a multiple of engine_sync_every keeps the artifact's schedule; a run without those checkpoints resumes by replaying its seed log)."""
    reference_error_sample: int = 65536
    """With arithmetic = "reference" or "artifact": coordinates (drawn once, uniformly) on which an exact float32 shadow of the same updates is kept, so every update logs the distance of the weights from it (metrics ref_*); 0: off; at least the number of selected parameters: all of them (4 bytes each)."""

    def validate(self, p: str) -> None:
        require(self.iterations >= 1, f"{p}.iterations must be >= 1 (got {self.iterations})")
        require(self.population >= 2, f"{p}.population must be >= 2 (got {self.population})")
        if self.estimator == "antithetic":
            require(self.population % 2 == 0, f"{p}.population must be even for the antithetic estimator (got {self.population})")
        require(0 < self.sigma <= MAX_SIGMA, f"{p}.sigma must be > 0 and <= {MAX_SIGMA:g} (got {self.sigma})")
        require(0 < self.lr <= MAX_ES_LR, f"{p}.lr must be > 0 and <= {MAX_ES_LR:g} (got {self.lr})")
        require(self.prompts_per_iteration >= 1, f"{p}.prompts_per_iteration must be >= 1 (got {self.prompts_per_iteration})")
        require(0 <= self.noise_table_size <= MAX_TABLE,
                f"{p}.noise_table_size must be in [0, 2^33] (got {self.noise_table_size})")
        require(self.eval_center_every >= 0, f"{p}.eval_center_every must be >= 0 (got {self.eval_center_every})")
        require(self.rank >= 1, f"{p}.rank must be >= 1 (got {self.rank})")
        require(self.member_batch >= 0, f"{p}.member_batch must be >= 0 (got {self.member_batch}; 0 scores all members in one call)")
        require(self.reference_error_sample >= 0, f"{p}.reference_error_sample must be >= 0 (got {self.reference_error_sample}; 0 turns the measurement off)")
        if self.arithmetic in ("reference", "artifact"):  # Qiu et al.'s and the artifact's loops are one-point, alpha / N, full-rank: nothing else is tested
            a = self.arithmetic
            require(self.estimator == "one_point", f"{p}.arithmetic='{a}' transcribes a one-point loop; set {p}.estimator='one_point' or {p}.arithmetic='exact'")
            require(not self.divide_by_sigma, f"{p}.arithmetic='{a}' updates by lr / N (1/sigma folded into lr); set {p}.divide_by_sigma=false or {p}.arithmetic='exact'")
            require(self.perturbation == "full", f"{p}.arithmetic='{a}' perturbs full-rank noise in place; set {p}.perturbation='full' or {p}.arithmetic='exact'")
        require(self.engines >= 1, f"{p}.engines must be >= 1 (got {self.engines})")
        require(self.engine_sync_every >= 0, f"{p}.engine_sync_every must be >= 0 (got {self.engine_sync_every}; 0: only at checkpoints and the end)")
        if self.arithmetic != "artifact":
            require(self.engines == 1 and self.engine_sync_every == 0,
                    f"{p}.engines and {p}.engine_sync_every simulate the artifact's engines; set {p}.arithmetic='artifact' or leave them at 1 and 0")
        else:
            require(self.engines <= self.population, f"{p}.engines={self.engines} is more than {p}.population={self.population}: replicas without members; lower {p}.engines")
        bad = [c for c in self.params if c not in CATEGORIES + ("all",)]
        require(not bad and bool(self.params), f"{p}.params must be a non-empty list of {('all',) + CATEGORIES} (got {self.params})")
        if self.param_regex:
            try:
                re.compile(self.param_regex)
            except re.error as e:
                raise ConfigError(f"{p}.param_regex is not a valid regular expression: {e}") from None


@dataclass
class EvalConfig:
    task: str = ""
    """Held-out task for before/after evaluation ("" = the training task's test split)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Knobs of the held-out task (when it differs from the training task)."""
    count: int = 64
    """Held-out problems."""
    n_samples: int = 8
    """Samples per problem at eval temperature (for pass@k, k <= n_samples)."""
    k: list[int] = field(default_factory=lambda: [1, 4, 8])
    """k values for pass@k."""
    temperature: float = 1.0
    """Sampling temperature for pass@k (greedy accuracy is always reported too)."""
    top_p: float = 1.0
    """Nucleus mass for pass@k sampling."""
    max_new_tokens: int = 0
    """Completion length for evaluation (0: same as generation.max_new_tokens)."""
    before_after: bool = True
    """Evaluate the model before training and after it."""

    def validate(self, p: str) -> None:
        _validate_heldout(self, p)
        require(0 <= self.temperature <= MAX_TEMPERATURE,
                f"{p}.temperature must be in [0, {MAX_TEMPERATURE:g}] (got {self.temperature})")
        if self.task:
            find_task(self.task)


def _validate_heldout(section, p: str) -> None:
    """The checks ``[eval]`` and ``[probe]`` share (problem count, samples, k, nucleus mass, length)."""
    require(section.count >= 1, f"{p}.count must be >= 1 (got {section.count})")
    require(section.n_samples >= 1, f"{p}.n_samples must be >= 1 (got {section.n_samples})")
    require(all(1 <= k <= section.n_samples for k in section.k) and bool(section.k),
            f"{p}.k values must lie in [1, n_samples={section.n_samples}] (got {section.k})")
    require(0 < section.top_p <= 1, f"{p}.top_p must be in (0, 1] (got {section.top_p})")
    require(section.max_new_tokens >= 0, f"{p}.max_new_tokens must be >= 0 (got {section.max_new_tokens})")


@dataclass
class DistributedConfig:
    workers: int | Literal["auto"] = "auto"
    """Ray actors scoring the ES population, each with its own model replica (0 or 1: score in this process, no Ray). Needs the distributed extra: pip install 'evolm[distributed]'. auto: on CPU with >= 2 usable cores and Ray installed, one actor per core (at most es.population) at 1 thread each (distributed.threads), bit-identical to a one-process 1-thread run; else 0 (threads in this process): a GPU run, the vllm backend, es.perturbation = lowrank, or a run too small to pay Ray's start-up (fewer than RAY_MIN_TOKENS = es.iterations x es.population x es.prompts_per_iteration x generation.max_new_tokens generated tokens). The choice is printed at the start and recorded in config.toml."""
    address: str = ""
    """Ray cluster: "" starts a private Ray instance on this machine (no dashboard); "auto" joins the cluster this machine belongs to (ray start); "ray://HOST:10001" connects through Ray Client; HOST:PORT joins that cluster's head."""
    threads: int = 0
    """CPU threads per actor: its Ray CPU reservation and its torch thread count (0: model.threads; with
    model.threads = auto on a local Ray, this machine's usable cores divided among the actors, at least 1, and
    the driver at the same count; the start line warns when workers x threads exceeds the cores). Results match a local run bit for bit when this equals model.threads."""
    gpus: float = 0.0
    """GPUs Ray reserves per actor (a fraction shares one GPU); needed with model.device = "cuda", where each actor uses the GPU Ray assigns it, and for vLLM actors on CUDA, whose engines take it (their models and the driver's stay on the CPU)."""
    max_restarts: int = 3
    """Replacement actors started over the whole run for actors that die (their unfinished members are rescored); past that a dead actor is dropped and the rest carry on."""
    placement_timeout_s: float = 60.0
    """Seconds to wait for the cluster to reserve every actor's CPUs (and GPUs) before anything loads (one Ray placement group, a bundle per actor), and to place a replacement's bundle again after a node is lost. Past it the run stops in one line naming what is missing; a cluster that grows on demand (an autoscaler) may need more."""

    def validate(self, p: str) -> None:
        require(self.workers == AUTO or self.workers >= 0, f"{p}.workers must be >= 0 or 'auto' (got {self.workers})")
        require(self.threads >= 0, f"{p}.threads must be >= 0 (got {self.threads})")
        require(self.gpus >= 0, f"{p}.gpus must be >= 0 (got {self.gpus})")
        require(self.max_restarts >= 0, f"{p}.max_restarts must be >= 0 (got {self.max_restarts})")
        require(self.placement_timeout_s > 0, f"{p}.placement_timeout_s must be > 0 (got {self.placement_timeout_s})")
        address = self.address.strip()
        require(address in ("", "auto") or address.startswith("ray://") or _host_port(address),
                f"{p}.address must be \"\" (a private local Ray), \"auto\", \"ray://HOST:PORT\" or HOST:PORT (got '{self.address}')")


def _importable(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules
        return False


def _host_port(address: str) -> bool:
    host, _, port = address.rpartition(":")
    return bool(host) and port.isdigit()


DEFAULT_PROBE_PARAMS = {"digits": 2, "operators": "+-"}
"""Knobs of the default probe (arithmetic): 2-digit addition and subtraction, test split."""


@dataclass
class ProbeConfig:
    every: int = 0
    """Probe held-out entropy and pass@k every this many updates (0: off). Also probed before and after training."""
    task: str = "arithmetic"
    """Held-out probe task ("" = the training task's test split). Default: 2-digit + and - (see params), where the default model is off the floor and below the ceiling, so a trajectory can move both ways (measured in docs/grpo.md)."""
    params: dict[str, Any] | None = None
    """Knobs of the probe task; unset: {digits = 2, operators = "+-"} when task is arithmetic, else {}."""
    count: int = 32
    """Problems per probe."""
    n_samples: int = 8
    """Samples per problem."""
    k: list[int] = field(default_factory=lambda: [1, 4, 8])
    """k values for pass@k."""
    temperature: float = 1.0
    """Sampling temperature of the probe (its token entropy is measured at this temperature)."""
    top_p: float = 1.0
    """Nucleus mass of the probe."""
    max_new_tokens: int = 0
    """Completion length of the probe (0: same as generation.max_new_tokens)."""

    def __post_init__(self) -> None:
        if self.params is None:
            self.params = dict(DEFAULT_PROBE_PARAMS) if self.task == "arithmetic" else {}

    def validate(self, p: str) -> None:
        require(self.every >= 0, f"{p}.every must be >= 0 (got {self.every})")
        _validate_heldout(self, p)
        require(0 < self.temperature <= MAX_TEMPERATURE,
                f"{p}.temperature must be > 0 and <= {MAX_TEMPERATURE:g} (entropy and pass@k need sampling; got {self.temperature})")
        if self.task and self.every:
            find_task(self.task)


LORA_CATEGORIES = ("attention", "mlp")
"""``es.params`` categories a LoRA population (``es.perturbation = "lowrank"`` on vLLM) can perturb: vLLM's
adapters cover the linear projections; norms, biases, embeddings and the LM head have none per request."""
LORA_MAX_RANK = 512
"""vLLM 0.32's largest ``max_lora_rank`` (``evolm.backends.vllm.LORA_RANKS``)."""


@dataclass
class ESJob:
    """An ES post-training run: ``evolm es --config FILE``."""

    AUTO_DTYPE_FAST = "bfloat16"
    """What ``model.dtype = "auto"`` means on CUDA and on a CPU with AMX bf16 units: bf16 generation, float32
    masters (``resolve_auto``)."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    es: ESSection = field(default_factory=ESSection)
    eval: EvalConfig = field(default_factory=EvalConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    def validate_job(self) -> None:
        d = self.distributed
        if d.workers >= 2:
            require(_importable("ray"), f"distributed.workers={d.workers} needs Ray: pip install 'evolm[distributed]' "
                                        "(or set distributed.workers=0 to score in this process)")
        g = self.generation
        if d.workers >= 2 and g.backend == "vllm":  # every actor perturbs inside its own engine; the driver holds none
            ray_vllm = f"generation.backend='vllm' and distributed.workers={d.workers}"
            require(g.eval_backend == "hf" or self.es.perturbation == "full",
                    f"generation.eval_backend='same' with {ray_vllm} and es.perturbation='lowrank' (LoRA members) is "
                    "not tested; set generation.eval_backend='hf' (held-out evaluation and probes on the driver's HF copy)")
            require(not self.model.device.startswith("cuda"),
                    f"model.device='{self.model.device}' with {ray_vllm} puts the driver's model on GPU 0 beside the "
                    "actors' engines; set model.device='cpu' (the driver's HF copy only evaluates and saves; each actor's "
                    "engine takes the GPU distributed.gpus reserves for it)")
            if 0 < d.gpus < 1:  # Ray packs floor(1 / gpus) actors onto one GPU; vLLM checks its share at start-up
                require(g.vllm_gpu_memory_utilization <= d.gpus,
                        f"distributed.gpus={d.gpus:g} puts {math.floor(1 / d.gpus + 1e-9)} vLLM engines on one GPU, each "
                        f"asking generation.vllm_gpu_memory_utilization={g.vllm_gpu_memory_utilization:g} of its memory; "
                        f"set it to at most {d.gpus:g}")
        if g.vllm_tensor_parallel_size > 1:  # one line per untested combination, then the blanket refusal
            t = f"generation.vllm_tensor_parallel_size={g.vllm_tensor_parallel_size}"
            require(g.backend == "vllm", f"{t} splits a vLLM engine; generation.backend='{g.backend}' has none: set "
                                         "generation.backend='vllm' or vllm_tensor_parallel_size=1")
            require(self.es.perturbation != "lowrank", f"{t} with es.perturbation='lowrank' (LoRA members) is untested: "
                                                       "set es.perturbation='full' or vllm_tensor_parallel_size=1")
            require(d.workers < 2, f"{t} with distributed.workers={d.workers} (Ray actors, one engine each) is untested: "
                                   "set distributed.workers=0 or vllm_tensor_parallel_size=1")
            require(self.model.dtype == "float32", f"{t} with model.dtype='{self.model.dtype}' is untested (masters per "
                                                   "shard): set model.dtype='float32' or vllm_tensor_parallel_size=1")
            require(self.es.noise in ("counter", AUTO), f"{t} with es.noise='{self.es.noise}': TP shards draw counter "
                                                       "noise by global element index; set es.noise='counter'")
            from evolm import machine

            require(not (self.model.device.startswith("cuda") or _vllm_on_cuda(self, machine)),
                    f"{t} on CUDA is untested (tested on vLLM's CPU backend only, docs/vllm.md): set "
                    "vllm_tensor_parallel_size=1")
        if g.backend == "vllm":  # vLLM stops a request at max_model_len where HF does not: rewards would depend on the backend
            require(g.max_new_tokens < g.vllm_max_model_len,
                    f"generation.max_new_tokens={g.max_new_tokens} leaves no room for a prompt in "
                    f"generation.vllm_max_model_len={g.vllm_max_model_len} (vLLM would cut completions HF does not); "
                    f"raise generation.vllm_max_model_len or lower generation.max_new_tokens")
        if self.es.noise == "stream":
            from evolm import machine

            on_gpu = self.model.device.startswith("cuda") or (g.backend == "vllm" and _vllm_on_cuda(self, machine))
            require(not on_gpu, "es.noise='stream' on a GPU draws every direction of a tensor on the CPU and holds them "
                                "at once (28 GB for a 1.5B embedding at N = 30); use es.noise='counter' (or 'table')")
        if d.workers >= 2 and g.backend != "vllm":
            require(not self.model.device.startswith("cuda"),
                    f"model.device='{self.model.device}' with distributed.workers={d.workers} HF actors would put the "
                    "driver's copy on GPU 0 beside actor 0 (never run on GPUs); on GPUs use vLLM actors "
                    "(generation.backend='vllm', model.device='cpu', distributed.gpus=1) or one process "
                    "(distributed.workers=0)")
            require(not d.gpus,
                    f"distributed.gpus={d.gpus:g} with distributed.workers={d.workers} HF actors run on the CPU and would "
                    "hold GPUs they never use; set distributed.gpus=0, or use vLLM actors (generation.backend='vllm')")
        if g.verify != "off":
            v = f"generation.verify='{g.verify}'"
            require(g.backend == "hf", f"{v} verifies members with the hf backend; set generation.verify='off' "
                                       f"for generation.backend='{g.backend}'")
            require(g.temperature == 0, f"{v} needs greedy decoding (the hf sampler's random stream is not keyed by "
                                        f"position, so no acceptance rule is exact); set generation.temperature=0 "
                                        f"(got {g.temperature}) or generation.verify='off'")
            require(self.es.perturbation == "full", f"{v} verifies full-rank members; set generation.verify='off' "
                                                    "for es.perturbation='lowrank' (its members are batched already)")
            require(d.workers < 2, f"{v} is not tested in Ray actors; set generation.verify='off' or "
                                   f"distributed.workers=0 (got {d.workers})")
        if self.es.arithmetic in ("reference", "artifact"):  # in-place rounding happens where the members are perturbed: this process's hf model
            a = self.es.arithmetic
            require(g.backend == "hf", f"es.arithmetic='{a}' perturbs the hf model in place in this process; set generation.backend='hf' (got '{g.backend}') or es.arithmetic='exact'")
            require(d.workers < 2, f"es.arithmetic='{a}' perturbs one model in this process (its rounding history is the run); set distributed.workers=0 (got {d.workers}) or es.arithmetic='exact'")
            require(self.model.device == "cpu", f"es.arithmetic='{a}' is tested bit for bit on the CPU only; set model.device='cpu' (got '{self.model.device}') or es.arithmetic='exact'")
        if self.es.perturbation == "lowrank":
            if g.backend == "vllm":  # members are LoRA adapters (es/lora_population.py): projection matrices only
                require(all(c in LORA_CATEGORIES for c in self.es.params),
                        f"es.perturbation='lowrank' on generation.backend='vllm' perturbs through LoRA adapters, which cover "
                        f"attention and MLP projections only (es.params={list(self.es.params)} also selects norms, embeddings "
                        f"or the LM head); set es.params=['attention','mlp'] (the hf backend's low-rank run with the same "
                        f"es.params draws the same members) or generation.backend='hf'")
                require(self.es.rank <= LORA_MAX_RANK,
                        f"es.rank={self.es.rank} is above vLLM's largest LoRA rank ({LORA_MAX_RANK}); lower es.rank or "
                        f"set generation.backend='hf'")


# --------------------------------------------------------------------------------------------------
# loading, overrides, validation, writing


def require(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, path: str) -> Any:
    """Check ``value`` against annotation ``tp`` (after ``from __future__`` evaluation) and convert."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, path)
            except ConfigError as e:
                errors.append(str(e))
        literals = [v for arg in args if typing.get_origin(arg) is Literal for v in typing.get_args(arg)]
        if literals and errors:  # int | Literal["auto"]: name both
            kinds = {int: "an integer", float: "a number", str: "a string"}
            named = [kinds.get(a, _type_name(a)) for a in args if typing.get_origin(a) is not Literal and a is not type(None)]
            raise ConfigError(f"{path} must be {' or '.join(named + [repr(v) for v in literals])} (got {value!r})")
        raise ConfigError(errors[0] if errors else f"{path} has the wrong type")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path} must be one of {list(args)} (got {value!r})")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a table (got {value!r})")
        return _build(tp, value, path)
    if origin in (list, tuple):
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{path} must be a list (got {value!r})")
        (item_tp, *_) = args or (Any,)
        return [_coerce(v, item_tp, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path} must be a table (got {value!r})")
        return dict(value)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false (got {value!r})")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} must be an integer (got {value!r})")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path} must be a number (got {value!r})")
        if not math.isfinite(value):  # TOML and --set accept inf and nan; no field means them
            raise ConfigError(f"{path} must be a finite number (got {value!r})")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string (got {value!r})")
        return value
    raise ConfigError(f"{path}: unsupported type {_type_name(tp)}")


JOB_SECTIONS = {"es": ("an ES config", "evolm es"), "distributed": ("an ES config", "evolm es"),
                "grpo": ("a GRPO config", "evolm grpo"), "pipeline": ("a pipeline config", "evolm pipeline")}
"""A job's own top-level sections, so a config given to another verb is named as what it is."""
_JOB_VERBS = {"ESJob": ("evolm es", "es"), "GRPOJob": ("evolm grpo", "grpo"), "PipelineJob": ("evolm pipeline", "pipeline")}


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
        if key not in names and not prefix and key in JOB_SECTIONS and cls.__name__ in _JOB_VERBS:
            (what, verb), (this, own) = JOB_SECTIONS[key], _JOB_VERBS[cls.__name__]
            raise ConfigError(f"[{key}] is a section of {what} ({verb}); {this} reads [{own}]: give this config to "
                              f"{verb}, or start from `evolm config {own}`")
        if key not in names:
            where = f"{prefix}.{key}" if prefix else key
            close = difflib.get_close_matches(key, names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else f" (known: {', '.join(names)})"
            raise ConfigError(f"unknown config field '{where}'{hint}")
    kwargs = {}
    for name in names:
        if name in data:
            kwargs[name] = _coerce(data[name], hints[name], f"{prefix}.{name}" if prefix else name)
    return cls(**kwargs)


def parse_value(text: str) -> Any:
    """Parse the right-hand side of ``--set key=value`` as a TOML value; bare words are strings."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict, assignment: str) -> None:
    """Apply one ``dotted.key=value`` assignment to a nested dict in place."""
    if "=" not in assignment:
        raise ConfigError(f"--set expects key=value (got '{assignment}')")
    key, text = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set expects key=value (got '{assignment}')")
    node = data
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"--set {key}: '{part}' is not a table")
    node[parts[-1]] = parse_value(text.strip())


def read_toml(path: str | Path, *, paths_from_file: bool = False) -> dict:
    """The TOML of a config file; ``paths_from_file``: a user's file, whose relative paths are looked up beside
    it first (``resolve_paths``), not a run directory's ``config.toml`` (already resolved)."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    return resolve_paths(data, path.parent) if paths_from_file else data


PATH_PARAMS = ("path", "train_path", "train", "test")
"""The task params that name data files (dataset's ``path`` / ``train`` / ``test``, countdown's and gsm8k's
``path`` / ``train_path``), looked up beside a config file (``resolve_paths``)."""


def _beside(value: Any, base: Path) -> Any:
    """``value`` as ``base / value`` when that exists (a relative path given beside the config file), else as is."""
    if not isinstance(value, str) or not value or Path(value).expanduser().is_absolute() or value.startswith("~"):
        return value
    there = base / value
    return str(there) if there.exists() else value


def _reference_beside(value: Any, base: Path) -> Any:
    """``file.py:NAME`` (also with arguments) with its file looked up beside the config file; anything else as is."""
    if not isinstance(value, str):
        return value
    target, colon, rest = value.partition(":")
    if not colon or not target.endswith(".py"):
        return value
    return f"{_beside(target, base)}:{rest}"


def resolve_paths(data: dict, base: str | Path) -> dict:
    """The raw TOML ``data`` of a config file in directory ``base`` with its relative paths resolved beside it
    where they exist there (module docstring); returns a new dict."""
    base = Path(base).resolve()
    data = _deepcopy(data)
    model = data.get("model")
    if isinstance(model, dict) and "spec" in model:
        model["spec"] = _beside(model["spec"], base)
    for name in ("task", "eval", "probe"):
        section = data.get(name)
        if not isinstance(section, dict):
            continue
        for key in ("name", "task", "correct"):
            if key in section:
                section[key] = _reference_beside(section[key], base)
        if "reward" in section:
            reward = section["reward"]
            section["reward"] = ([_reference_beside(r, base) for r in reward] if isinstance(reward, list)
                                 else _reference_beside(reward, base))
        if isinstance(section.get("params"), dict):
            for key in PATH_PARAMS:
                if key in section["params"]:
                    section["params"][key] = _beside(section["params"][key], base)
    return data


def from_dict(cls, data: dict, overrides: list[str] | tuple[str, ...] = ()):
    """Build and validate a job config from a dict (e.g. parsed TOML) plus ``key=value`` overrides."""
    data = _deepcopy(data)
    for assignment in overrides:
        apply_override(data, assignment)
    cfg = _build(cls, data)
    validate(cfg)
    return cfg


def load(cls, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *,
         paths_from_file: bool = False):
    """Load ``cls`` from a TOML file (or defaults when ``path`` is None), apply overrides, validate.
    ``paths_from_file``: relative paths of the file are looked up beside it first (``read_toml``)."""
    return from_dict(cls, read_toml(path, paths_from_file=paths_from_file) if path else {}, overrides)


def validate(cfg) -> None:
    """Run ``validate(prefix)`` of every section of a job config, resolve its ``"auto"`` fields from this
    machine (``resolve_auto``), then check the job as a whole."""
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        if hasattr(section, "validate"):
            section.validate(f.name)
    resolve_auto(cfg)
    if hasattr(cfg, "validate_job"):
        cfg.validate_job()


# --------------------------------------------------------------------------------------------------
# "auto": where the run is


RAY_MIN_TOKENS = 8192
"""``distributed.workers = "auto"`` starts Ray actors only for runs whose members generate at least this
many tokens in all (es.iterations x es.population x es.prompts_per_iteration x generation.max_new_tokens).
Ray's start-up (the private instance, each actor importing evolm and loading its replica) is paid once
per run: measured as the wall time of a 1-update run whose scoring costs nothing (2 members x 1 prompt x
1 token) with 2 actors minus the same run in one process, on this project's 2-core machine while it was
shared: 28-35 s with a tiny llama (load average 4-5), 38 s with SmolLM2-135M at load 5-7 (102 s at
load 9). One-process scoring of the 135M model runs at 48-120 member tokens/s on one thread (idle
machine: 86 s per update of 8 x 32 x 16 tokens in benchmarks/ray_scaling.py, 34.4 s in
benchmarks/es_overhead.py) and two actors take 1/1.77 of that time: against a ~38 s start-up Ray breaks
even between ~4,000 and ~10,000 tokens; 8192 sits between (the demo generates 49152, an update of
configs/es-arithmetic.toml 4096)."""


def resolve_auto(cfg) -> list[str]:
    """Replace the ``"auto"`` values of a job config with what this machine offers (``evolm.machine``), in
    place, and return one note per resolved choice (``cfg.auto_notes``, printed by the job at its start).
    Explicit values are left as they are. A config read back from a run directory has no ``"auto"`` left:
    resume, replay and ``eval --like`` reuse the values the run resolved (``--set model.threads=auto`` asks
    for this machine's again, where a resume may change the field; ``model.dtype`` may not change).

    - ``model.device``: cuda when torch sees a GPU, else cpu (cpu for the driver of Ray actors without
      ``distributed.gpus``, or of vLLM actors: their engines take the GPUs).
    - ``model.dtype``: bfloat16 for ES on CUDA and on a CPU with AMX bf16 units (``AUTO_DTYPE_FAST`` of the
      job class, ``machine.cpu_bf16_native``; the engine keeps float32 masters, ``evolm.es.params``, so the
      update is float32's), float32 otherwise.
    - ``distributed.workers`` (ES): see its field docstring; Ray actors get ``distributed.threads = 1``.
    - ``distributed.threads`` with an explicit ``distributed.workers`` >= 2 and ``model.threads = "auto"`` (local
      Ray): the usable cores divided among the actors, at least 1 each; the start line says so, and says when
      ``workers x threads`` exceeds the cores.
    - ``model.threads``: the usable cores (``machine.usable_cores``); the actors' count for the driver of Ray
      actors whose threads auto chose.
    - ``generation.vllm_*``: from free GPU memory / available RAM (their field docstrings).
    - ``generation.cpu_matmul``: onednn where torch has oneDNN, else torch."""
    from evolm import machine

    notes: list[str] = []
    model = getattr(cfg, "model", None)
    dist = getattr(cfg, "distributed", None)
    gen = getattr(cfg, "generation", None)
    cores, why = machine.usable_cores()
    if isinstance(model, ModelConfig):
        if model.device == AUTO:
            cuda = machine.cuda_available()
            vllm = gen is not None and gen.backend == "vllm"
            actors = dist is not None and isinstance(dist.workers, int) and dist.workers >= 2 and (not dist.gpus or vllm)
            driver_only = actors or vllm  # a vLLM engine, local or in actors, takes the GPU: the driver's copy stays in RAM
            model.device = "cuda" if cuda and not driver_only else "cpu"
            notes.append(f"model.device = {model.device} (auto: {'a CUDA GPU' if cuda else 'no CUDA GPU'}"
                         + ((", the driver of Ray actors" if actors else ", the driver of a vLLM engine that takes the GPU")
                            if cuda and driver_only else "") + ")")
        if model.dtype == AUTO:
            fast = getattr(type(cfg), "AUTO_DTYPE_FAST", "float32")
            if fast == "float32":  # GRPO and pipelines train the model's own weights
                because = "cpu" if model.device == "cpu" else "trains its own weights"
            elif model.device.startswith("cuda"):
                because = "ES on CUDA, float32 masters"
            elif gen is not None and gen.backend == "vllm" and _vllm_on_cuda(cfg, machine):
                because = "ES in vLLM engines on CUDA, float32 masters in the engines; not this CPU's reading"
            elif model.device == "cpu":
                amx, reading = machine.cpu_bf16_native()
                fast, because = (fast, f"ES on {reading}, float32 masters") if amx else ("float32", f"cpu: {reading}")
            else:
                fast, because = "float32", model.device
            model.dtype = fast
            notes.append(f"model.dtype = {model.dtype} (auto: {because})")
    if dist is not None and dist.workers == AUTO:
        dist.workers, reason = _auto_workers(cfg, cores, why, machine.ray_importable())
        if dist.workers >= 2 and not dist.threads:
            dist.threads = 1
        notes.append(f"distributed.workers = {dist.workers} ({reason})")
    shared = False
    if (dist is not None and isinstance(dist.workers, int) and dist.workers >= 2 and not dist.threads
            and not dist.address.strip() and isinstance(model, ModelConfig) and model.threads == AUTO):
        # explicit workers, auto threads: this machine's cores divided among the actors (never over-subscribed)
        dist.threads, shared = max(1, cores // dist.workers), True
        notes.append(f"distributed.threads = {dist.threads} (auto: {cores} cores shared by {dist.workers} actors)")
    if isinstance(model, ModelConfig) and model.threads == AUTO:
        if dist is not None and dist.workers >= 2 and (dist.threads == 1 or shared):
            # the driver of t-thread actors measures at t threads too: the whole run, held-out tables included
            # (a sampled logit's last bits depend on the thread count), equals the one-process t-thread run
            t = dist.threads
            model.threads = t
            notes.append(f"model.threads = {t} (auto: the driver of {t}-thread Ray actors, as a one-process "
                         f"{t}-thread run)")
        else:
            model.threads = cores
            notes.append(f"model.threads = {cores} (auto: {why})")
    es = getattr(cfg, "es", None)
    if isinstance(es, ESSection) and es.noise == AUTO:
        es.noise = "table" if es.perturbation == "lowrank" else "counter"
        notes.append(f"es.noise = {es.noise} (auto: " + ("low-rank factors are views into the table)" if es.noise == "table"
                     else "no P-sized buffer, the same bits on CPU and GPU; docs/es.md)"))
    if (isinstance(es, ESSection) and es.perturbation == "lowrank" and es.member_batch == 0 and dist is not None
            and isinstance(dist.workers, int) and dist.workers >= 2):
        # a block of members is one batched call; its size can change a member's last bits, so it is recorded
        es.member_batch = -(-es.population // dist.workers)
        notes.append(f"es.member_batch = {es.member_batch} (0 with {dist.workers} Ray actors: a block of ceil(N / K) "
                     f"members per actor call; a one-process run with this es.member_batch scores the same blocks)")
    if isinstance(gen, GenerationConfig):
        notes += _auto_vllm(cfg, gen, dist, machine)
        if gen.cpu_matmul == AUTO:
            gen.cpu_matmul = "onednn" if machine.onednn_available() else "torch"
            if gen.backend == "hf" and isinstance(model, ModelConfig) and model.device == "cpu" and model.dtype == "float32":
                notes.append(f"generation.cpu_matmul = {gen.cpu_matmul} (auto: "
                             + ("float32 linears through oneDNN while generating)" if gen.cpu_matmul == "onednn"
                                else "this torch has no oneDNN)"))
    cfg.auto_notes = getattr(cfg, "auto_notes", []) + notes  # validated again later: nothing auto is left then
    return notes


def _auto_workers(cfg, cores: int, why: str, ray: bool) -> tuple[int, str]:
    """``distributed.workers = "auto"`` of an ES job: (workers, why)."""
    es, dist, gen, model = cfg.es, cfg.distributed, cfg.generation, cfg.model
    if dist.address.strip():  # a cluster's size is known once joined: the number of actors is the user's to say
        return 0, "auto counts this machine's cores only: set distributed.workers to use the Ray cluster at distributed.address"
    tokens = es.iterations * es.population * es.prompts_per_iteration * gen.max_new_tokens
    if model.device != "cpu":
        return 0, f"auto: {model.device} run, one process"
    if gen.backend != "hf":
        return 0, f"auto: the {gen.backend} engine threads in one process"
    if es.perturbation != "full":
        return 0, f"auto: es.perturbation = {es.perturbation} scores in one process"
    if getattr(es, "arithmetic", "exact") != "exact":
        return 0, f"auto: es.arithmetic = {es.arithmetic} perturbs one model in this process"
    if getattr(gen, "verify", "off") != "off":
        return 0, f"auto: generation.verify = {gen.verify} verifies members in one process"
    if cores < 2:
        return 0, f"auto: {why}"
    if not ray:
        return 0, "auto: Ray is not installed (pip install 'evolm[distributed]')"
    if tokens < RAY_MIN_TOKENS:
        return 0, f"auto: {tokens} member tokens < {RAY_MIN_TOKENS}, too few to pay Ray's start-up"
    return min(cores, es.population), f"auto: {why}"


def _auto_vllm(cfg, gen, dist, machine) -> list[str]:
    notes = []
    vllm = gen.backend == "vllm"
    cuda = vllm and machine.cuda_available()  # vLLM's GPU build runs on CUDA whatever model.device says
    engines_on_cuda = vllm and _vllm_on_cuda(cfg, machine)  # actors reserving GPUs have one though this machine may not
    workers = dist.workers if dist is not None and isinstance(dist.workers, int) else 0
    share = dist.gpus if dist is not None and workers >= 2 and 0 < dist.gpus < 1 else 1.0
    if gen.vllm_gpu_memory_utilization == AUTO:
        if cuda:
            free, total = machine.cuda_free_fraction()
            gen.vllm_gpu_memory_utilization = max(0.01, min(0.9, share, math.floor(90 * free / total) / 100))
            notes.append(f"generation.vllm_gpu_memory_utilization = {gen.vllm_gpu_memory_utilization:g} "
                         f"(auto: {free:.1f} of {total:.1f} GiB free)")
        else:  # no GPU here (a Ray cluster's actors may have one): vLLM's own default, within the actors' share
            gen.vllm_gpu_memory_utilization = min(0.9, share)
    if gen.vllm_kv_cache_gb == AUTO:
        if engines_on_cuda and not cuda:  # GPUs elsewhere (Ray actors): vLLM sizes the KV cache on the GPU it gets
            gen.vllm_kv_cache_gb = 0
            notes.append("generation.vllm_kv_cache_gb = 0 (auto: the engines' GPUs are not on this machine; vLLM sizes "
                         "the KV cache within generation.vllm_gpu_memory_utilization of each)")
        elif vllm:
            if cuda:  # each actor has its own GPU unless distributed.gpus < 1 packs several onto one
                engines = math.floor(1 / share + 1e-9) if share < 1 else 1
                pool, where = machine.cuda_free_fraction()[0] / engines, "free GPU memory"
            else:
                pool, where = machine.available_ram_gb() / max(1, workers), "available RAM"
            gen.vllm_kv_cache_gb = min(16.0 if cuda else 4.0, max(0.25, math.floor(pool) / 4))  # pool / 4 in 0.25 GiB steps
            notes.append(f"generation.vllm_kv_cache_gb = {gen.vllm_kv_cache_gb:g} (auto: a quarter of {pool:.1f} GiB "
                         f"{where} per engine)")
        else:
            gen.vllm_kv_cache_gb = 1.0
    return notes


def _vllm_on_cuda(cfg, machine) -> bool:
    """Whether this run's vLLM engines generate on CUDA: actors that reserve GPUs (``distributed.gpus``), or a
    local engine on a machine whose torch sees a GPU (vLLM's GPU build takes it whatever ``model.device`` says)."""
    dist = getattr(cfg, "distributed", None)
    if dist is not None and isinstance(dist.workers, int) and dist.workers >= 2:
        return dist.gpus > 0
    return machine.cuda_available()


def parallelism(cfg) -> str:
    """One line saying where an ES job scores its members and why (printed at the start of the run):
    ``parallelism: 2 Ray actors x 1 thread (auto: 2 cores)``."""
    from evolm import machine

    d, m = cfg.distributed, cfg.model
    over = ""
    if d.workers >= 2:
        t = d.threads or m.threads
        where = f"{d.workers} Ray actors x {t} thread{'s' if t != 1 else ''}"
        cores = machine.usable_cores()[0]
        if not d.address.strip() and d.workers * t > cores:  # a local Ray: its actors share this machine's cores
            over = (f"; {d.workers * t} threads on {cores} core{'s' if cores != 1 else ''}: over-subscribes, "
                    f"set distributed.threads = {max(1, cores // d.workers)} or fewer distributed.workers")
    else:
        where = f"one process x {m.threads} thread{'s' if m.threads != 1 else ''} on {m.device}"
    notes = {n.split(" = ")[0]: n for n in getattr(cfg, "auto_notes", [])}
    note = notes.get("distributed.workers") or notes.get("distributed.threads") or notes.get("model.threads")
    how = note[note.index("("):] if note else "(as configured)"
    threads = notes.get("model.threads", "").split("(auto: ")[-1]
    if "distributed.workers" in notes and threads and d.workers < 2 and threads[:-1] not in how:
        how = how[:-1] + f"; {threads}"
    if over:
        how = how[:-1] + over + ")"
    return f"parallelism: {where} {how}"


def _deepcopy(d):
    if isinstance(d, dict):
        return {k: _deepcopy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deepcopy(v) for v in d]
    return d


def _drop_none(d):
    if isinstance(d, dict):
        return {k: _drop_none(v) for k, v in d.items() if v is not None}
    if isinstance(d, list):
        return [_drop_none(v) for v in d]
    return d


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


def to_toml(cfg) -> str:
    """The resolved config as TOML (None values are omitted: TOML has no null)."""
    return tomli_w.dumps(_drop_none(to_dict(cfg)))


# --------------------------------------------------------------------------------------------------
# resume: which fields a resume may change


RESUME_MAY_CHANGE = ("run.name", "run.out_dir", "run.checkpoint_every", "run.keep_checkpoints", "run.progress",
                     "model.threads", "model.device", "generation.batch_size", "generation.prefix_cache",
                     "generation.cpu_matmul",
                     "eval.before_after", "probe.every", "run.save", "run.save_dtype", "run.report_to",
                     "run.tracker_project", "run.wandb_mode", "distributed.workers", "distributed.address",
                     "distributed.threads", "distributed.gpus", "distributed.max_restarts",
                     "distributed.placement_timeout_s",
                     "generation.vllm_kv_cache_gb", "generation.vllm_max_model_len", "generation.vllm_enforce_eager",
                     "generation.vllm_gpu_memory_utilization")
"""Fields ``--resume`` may change besides a job's budget: where, how often and in what dtype the run saves,
where its metrics go, how it runs (threads, device, generation batch, Ray workers, vLLM engine sizes; a
Ray population is bit-identical to a local one), whether it still measures. Every other field describes how the
updates already made were computed or measured (seed, model, task, reward, noise, sigma, learning
rate, sampling, held-out set), so changing it on resume would make ``config.toml`` lie about the run.
A resumed run reuses the values its ``"auto"`` fields resolved to (recorded in ``config.toml``); ``--set
model.threads=auto`` resolves one again on the resuming machine, and ``model.dtype`` (not listed) stays."""


LEGACY_DEFAULTS = {"model.device": "cpu", "model.dtype": "float32", "model.threads": 1, "distributed.workers": 0,
                   "generation.vllm_kv_cache_gb": 1.0, "generation.vllm_gpu_memory_utilization": 0.9, "es.noise": "table",
                   "generation.cpu_matmul": "torch"}
"""The defaults of the fields that became "auto": what a run directory's config.toml that lacks one of
them (written by an evolm older than the field) ran with (``config_changes``)."""


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):  # an empty table has no leaves: same as absent
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def config_changes(before: dict, cfg) -> dict[str, dict]:
    """The fields whose value in job config ``cfg`` differs from ``before`` (a run's ``config.toml`` as
    a dict): ``{"es.sigma": {"old": 0.001, "new": 0.002}, ...}``, nested tables compared key by key. A
    field ``before`` lacks (older evolm, or None omitted from TOML) counts as its default."""
    merged = to_dict(type(cfg)())
    for key, value in LEGACY_DEFAULTS.items():  # what a config.toml without the field ran with
        section, name = key.split(".")
        if isinstance(merged.get(section), dict) and merged[section].get(name) == AUTO:
            merged[section][name] = value
    for section, fields in before.items():
        if isinstance(fields, dict) and isinstance(merged.get(section), dict):
            merged[section].update(fields)
        else:
            merged[section] = fields
    old, new = _flatten(merged), _flatten(to_dict(cfg))
    return {k: {"old": old.get(k), "new": new.get(k)} for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)}


def field_docs(cls) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (read from source)."""
    try:
        tree = ast.parse(inspect.getsource(cls))
    except (OSError, TypeError):
        return {}
    docs: dict[str, str] = {}
    body = tree.body[0].body
    for prev, node in zip(body, body[1:]):
        if (isinstance(prev, ast.AnnAssign) and isinstance(prev.target, ast.Name)
                and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            docs[prev.target.id] = inspect.cleandoc(node.value.value)
    return docs


def toml_inline(value) -> str:
    """A TOML value on one line (what ``--set key=...`` takes): ``8``, ``0.001``, ``"a"``, ``["norm", "mlp"]``,
    ``{ digits = 2 }``; keys that are not bare words are quoted."""
    if isinstance(value, dict):
        keys = [k if re.fullmatch(r"[A-Za-z0-9_-]+", str(k)) else json.dumps(str(k)) for k in value]
        return "{ " + ", ".join(f"{k} = {toml_inline(v)}" for k, v in zip(keys, value.values())) + " }" if value else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_inline(v) for v in value) + "]"
    return tomli_w.dumps({"v": value})[4:].strip()


def describe(cls, prefix: str = "") -> list[str]:
    """Lines ``section.field = default  # doc`` for every field of a job config (for ``evolm config``)."""
    lines = []
    docs = field_docs(cls)
    defaults = cls()
    for f in dataclasses.fields(cls):
        value = getattr(defaults, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            lines.append(f"[{key}]")
            lines += describe(type(value), prefix=f"{key}.")
        else:
            shown = toml_inline(value) if value is not None else "(unset)"
            lines.append(f"  {key} = {shown}    # {docs.get(f.name, '')}")
    return lines
