"""GRPO baseline: Hugging Face TRL's ``GRPOTrainer`` on the same models, tasks and rewards as ES.

``evolm grpo --config FILE`` trains with TRL (pinned to ``trl>=1.16,<1.17`` in the ``grpo`` extra) and
writes the same run directory as an ES run (``evolm.runs``), so every evaluation and analysis reads both.

Design decisions:

- evolm owns the settings. ``GRPOSection`` names every knob that changes the algorithm and maps it
  explicitly onto TRL's ``GRPOConfig`` (``trl_args``); nothing is left to TRL defaults that differ
  between versions. In particular ``loss_type`` defaults to ``"grpo"`` (the paper's per-sequence
  length normalisation; TRL's own default is now ``"dapo"``), ``scale_rewards`` to ``"group"``
  (advantage = (r - group mean) / group std, as in DeepSeekMath), ``beta`` to 0 (no KL term, no
  reference model; measured fastest here and TRL's default too), a constant learning rate and
  ``num_iterations = 1`` (each generation batch feeds exactly one optimizer step, so the importance
  ratio is 1 and the PPO clip is inert: the on-policy GRPO of the paper).
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
  progress printing and vLLM are off; evolm writes the run directory from a ``TrainerCallback``.
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

import argparse
import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal

from evolm.config import EvalConfig, GenerationConfig, ModelConfig, ProbeConfig, RunConfig, TaskConfig, _require
from evolm.errors import UserError

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
    """TRL loss formulation. grpo = the paper's (token losses averaged per sequence, then over sequences); TRL's own default is dapo."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantage scaling: group = (r - group mean) / group std (the paper's GRPO); batch = divide by the batch std; none = no division (Dr. GRPO)."""
    beta: float = 0.0
    """KL coefficient toward the starting weights (TRL: beta * KL(policy || reference) per token); 0 loads no reference model."""
    num_generations: int = 8
    """Completions sampled per prompt (the group size G, >= 2)."""
    prompts_per_step: int = 4
    """Training problems per update; one update samples prompts_per_step x num_generations completions. With 1, many groups have equal rewards and SmolLM2-135M did not learn 2-digit addition in 20 updates; 4 did (docs/grpo.md)."""
    temperature: float = 1.0
    """Sampling temperature of the training rollouts (> 0); TRL also divides the policy logits by it in the loss."""
    top_p: float = 1.0
    """Nucleus sampling mass of the training rollouts."""
    max_completion_length: int = 32
    """Completion length limit of the training rollouts, in tokens."""
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

    def validate(self, p: str) -> None:
        _require(self.steps >= 1, f"{p}.steps must be >= 1 (got {self.steps})")
        _require(self.lr > 0, f"{p}.lr must be > 0 (got {self.lr})")
        _require(self.loss_type in LOSS_TYPES, f"{p}.loss_type must be one of {list(LOSS_TYPES)} (got '{self.loss_type}')")
        _require(self.beta >= 0, f"{p}.beta must be >= 0 (got {self.beta})")
        _require(self.num_generations >= 2, f"{p}.num_generations must be >= 2: GRPO compares completions within a group (got {self.num_generations})")
        _require(self.prompts_per_step >= 1, f"{p}.prompts_per_step must be >= 1 (got {self.prompts_per_step})")
        _require(self.temperature > 0, f"{p}.temperature must be > 0: GRPO samples its rollouts (got {self.temperature})")
        _require(0 < self.top_p <= 1, f"{p}.top_p must be in (0, 1] (got {self.top_p})")
        _require(self.max_completion_length >= 1, f"{p}.max_completion_length must be >= 1 (got {self.max_completion_length})")
        _require(self.gradient_accumulation_steps >= 1,
                 f"{p}.gradient_accumulation_steps must be >= 1 (got {self.gradient_accumulation_steps})")
        batch = self.prompts_per_step * self.num_generations
        _require(batch % self.gradient_accumulation_steps == 0,
                 f"{p}.gradient_accumulation_steps={self.gradient_accumulation_steps} must divide the batch "
                 f"prompts_per_step x num_generations = {batch}")
        _require(self.epsilon > 0, f"{p}.epsilon must be > 0 (got {self.epsilon})")
        _require(self.max_grad_norm >= 0, f"{p}.max_grad_norm must be >= 0 (got {self.max_grad_norm})")
        _require(self.train_examples == 0 or self.train_examples >= self.prompts_per_step,
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
        device = self.model.device
        _require(device in ("cpu", "cuda", "cuda:0", "mps"),
                 f"model.device '{device}' is not supported by evolm grpo: use cpu, cuda or mps "
                 "(pick the GPU with CUDA_VISIBLE_DEVICES)")
        _require(not (self.grpo.bf16 and self.model.dtype != "float32"),
                 f"grpo.bf16 autocast needs model.dtype = float32 master weights (got {self.model.dtype})")


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
        max_completion_length=g.max_completion_length,
        temperature=g.temperature,
        top_p=g.top_p,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        use_vllm=False,
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
    template) and ``example_index`` (row -> ``examples[i]``, for the reward).

    TRL tokenizes plain text with the tokenizer's special tokens, so the BOS that ``render_prompt``
    writes for base models (Gemma) is left to TRL: the token ids are those ES generates from."""
    from evolm.tasks.base import bos_text

    chat = bool(getattr(tokenizer, "chat_template", None))
    bos = bos_text(tokenizer)
    prompts = [task.messages(ex) if chat else task.render_prompt(ex, tokenizer).removeprefix(bos) for ex in examples]
    return {"prompt": prompts, "example_index": list(range(len(examples)))}


def make_dataset(rows: dict[str, list]):
    """A ``datasets.Dataset`` of ``rows`` with a content-hash fingerprint.

    ``Dataset.from_dict`` fingerprints the table by pickling it with dill, which fails on some Python
    3.12 + pyarrow combinations (seen on the GPU machine: "Can't pickle <class 'MonthDayNano'>"); a
    SHA-256 of the rows' JSON is as deterministic and needs no pickling.
    """
    import hashlib
    import json

    from datasets import Dataset
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
    """A TRL reward function returning ``task.reward(text, example)`` for every completion.

    The text is ``tokenizer.decode(completion_ids, skip_special_tokens=True)``: the decoding the ES
    generation backend uses, so both methods score the same strings.
    """

    def reward(prompts, completions, completion_ids, example_index, **_):
        out = []
        for ids, i in zip(completion_ids, example_index, strict=True):
            ex = examples[int(i)]
            text = tokenizer.decode(ids, skip_special_tokens=True)
            r = float(task.reward(text, ex))
            out.append(r)
            if meter is not None:
                meter.rewards.append(r)
                meter.correct.append(bool(task.is_correct(text, ex)))
                meter.tokens.append(len(ids))
        return out

    reward.__name__ = f"{task.name}_{task.reward_name}"
    return reward


# --------------------------------------------------------------------------------------------------
# metrics records


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MiB."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


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
    """One training record of metrics.jsonl (pure). ``totals`` holds the running totals after this step."""
    n = len(rollouts.rewards)
    mean = sum(rollouts.rewards) / n if n else float("nan")
    std = math.sqrt(sum((r - mean) ** 2 for r in rollouts.rewards) / n) if n else float("nan")
    record = {
        "step": step,
        "method": METHOD,
        "kind": "train",
        "reward_mean": mean,
        "reward_std": std,
        "reward_min": min(rollouts.rewards) if n else float("nan"),
        "reward_max": max(rollouts.rewards) if n else float("nan"),
        "accuracy": sum(rollouts.correct) / n if n else float("nan"),
        "seconds": seconds,
        "seconds_total": totals["seconds_total"],
        "gen_sequences": n,
        "gen_tokens": sum(rollouts.tokens),
        "gen_sequences_total": totals["gen_sequences_total"],
        "gen_tokens_total": totals["gen_tokens_total"],
        "peak_rss_mb": peak_rss_mb(),
    }
    for key, name in TRL_FIELDS.items():
        if trl_logs.get(key) is not None:
            record[name] = float(trl_logs[key])
    return record


# --------------------------------------------------------------------------------------------------
# training


def _import_trl():
    try:
        import datasets  # noqa: F401
        import trl
    except ImportError as e:
        raise UserError(f"evolm grpo needs TRL and datasets ({e.name} is missing): pip install 'evolm[grpo]'") from None
    major_minor = tuple(int(x) for x in trl.__version__.split(".")[:2])
    if major_minor != (1, 16):
        print(f"[evolm] warning: evolm grpo is tested with trl 1.16.x, found {trl.__version__}", file=sys.stderr)
    return trl


def _make_callback(trainer_ref: dict, run, cfg: GRPOJob, meter: RolloutMeter, totals: dict, probe):
    """The TrainerCallback that writes metrics, probes and checkpoints after every optimizer step."""
    from transformers import TrainerCallback

    from evolm.heldout import probe_record

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
            if cfg.run.checkpoint_every and step % cfg.run.checkpoint_every == 0:
                trainer = trainer_ref["trainer"]

                def write_trainer_files(tmp: Path) -> None:
                    trainer._save_optimizer_and_scheduler(str(tmp))
                    trainer._save_rng_state(str(tmp))
                    trainer.state.save_to_json(str(tmp / "trainer_state.json"))

                run.save_checkpoint(model, step, state={"method": METHOD, **totals},
                                    keep=cfg.run.keep_checkpoints, write_extra=write_trainer_files)
            self.session_seconds += self.seconds
            self.session_steps += 1
            if cfg.run.progress:
                eta = (g.steps - step) * self.session_seconds / self.session_steps
                print(f"[grpo] step {step}/{g.steps}  reward {record['reward_mean']:.3f}  acc {record['accuracy']:.2f}  "
                      f"loss {record.get('loss', float('nan')):+.4f}  {self.seconds:.1f} s  eta {eta / 60:.1f} min  "
                      f"rss {record['peak_rss_mb']:.0f} MB", flush=True)

    return RunDirCallback()


def _open_or_create_run(cfg: GRPOJob, run_dir, resume, info: dict):
    """(RunDir, checkpoint dir or None, checkpoint state) for a fresh or resumed run."""
    from evolm import config
    from evolm.runs import RunDir, atomic_write_text

    if resume is not None:
        run = resume if isinstance(resume, RunDir) else RunDir.open(resume)
        kind = run.info().get("kind")
        if kind not in (None, METHOD):
            raise UserError(f"{run.path} is a '{kind}' run, not a GRPO run; resume it with `evolm {kind} --resume`")
        atomic_write_text(run.config_path, config.to_toml(cfg))
        latest = run.latest_checkpoint()
        if latest is None:
            run.truncate_after(0)  # keeps the step-0 held-out records (eval before, first probe)
            run.update_info(status="running", resumed_from_step=0)
            return run, None, {}
        ckpt, state = latest
        missing = [f for f in TRAINER_FILES if not (ckpt / f).exists()]
        if missing:
            raise UserError(f"checkpoint {ckpt} lacks {', '.join(missing)}; it cannot be resumed faithfully")
        run.truncate_after(int(state["step"]))
        run.update_info(status="running", resumed_from_step=int(state["step"]))
        return run, ckpt, state
    if run_dir is not None:
        path = Path(run_dir.path if isinstance(run_dir, RunDir) else run_dir)
        out_dir, name = path.parent, path.name
    else:
        out_dir, name = Path(cfg.run.out_dir), cfg.run.name
    run = RunDir.create(out_dir, name, config.to_toml(cfg), kind=METHOD, info=info)
    return run, None, {}


def run_grpo(cfg: GRPOJob, model=None, tokenizer=None, task=None, run_dir=None, init_state_dict=None,
             probe: Callable | None = None, resume=None, callbacks: list | None = None):
    """Train with TRL's GRPOTrainer and write a run directory; returns its ``RunDir``.

    - ``model``/``tokenizer``: use these objects instead of loading ``cfg.model.spec``.
    - ``task``: a ``Task`` instead of building ``cfg.task`` with ``evolm.tasks.make_task``.
    - ``run_dir``: directory to create, absent or empty (default ``cfg.run.out_dir / cfg.run.name``).
    - ``init_state_dict``: starting weights loaded into the model before training (pipelines).
    - ``probe(model, step) -> dict``: held-out probe, logged at step 0, every ``probe.every`` updates
      and at the end (default: ``heldout.make_probe`` from ``[probe]``, None when ``probe.every = 0``).
    - ``resume``: a GRPO ``RunDir`` (or path) to continue from its newest checkpoint up to ``grpo.steps``.
      Pass the same ``model``/``init_state_dict`` as the original call (they define the starting
      weights, and with ``beta > 0`` the reference); the checkpoint's weights replace them.
    - ``callbacks``: extra ``transformers.TrainerCallback`` objects (tests use one to interrupt a run).
    """
    import tempfile

    import torch

    from evolm import models
    from evolm.backends import make_generator
    from evolm.config import validate
    from evolm.heldout import heldout_eval, make_probe, probe_record
    from evolm.plots import plot_training
    from evolm.tasks import make_task

    validate(cfg)
    trl = _import_trl()
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    g = cfg.grpo
    torch.set_num_threads(cfg.model.threads)
    if task is None:
        task = make_task(cfg.task.name, reward=cfg.task.reward, system_prompt=cfg.task.system_prompt, **cfg.task.params)
    injected = model is not None
    if model is None:
        model, loaded_tok = models.load(cfg.model.spec, dtype=cfg.model.dtype, threads=cfg.model.threads,
                                        device=cfg.model.device)
        tokenizer = tokenizer or loaded_tok
    if tokenizer is None:
        raise UserError("run_grpo: pass the tokenizer together with an injected model")
    if init_state_dict is not None:
        model.load_state_dict(init_state_dict)

    run, ckpt, ckpt_state = _open_or_create_run(cfg, run_dir, resume, info={"model": cfg.model.spec, "task": task.name})
    start_step = int(ckpt_state.get("step", 0))
    totals = {k: ckpt_state.get(k, 0) for k in ("seconds_total", "gen_sequences_total", "gen_tokens_total")}
    totals["seconds_total"] = float(totals["seconds_total"])

    examples = task.examples("train", train_count(g), cfg.run.seed)
    if len(examples) < g.prompts_per_step:
        raise UserError(f"task '{task.name}' gave {len(examples)} training problems; an update needs "
                        f"grpo.prompts_per_step={g.prompts_per_step}")
    dataset = make_dataset(training_rows(task, examples, tokenizer))
    meter = RolloutMeter()
    reward_fn = make_reward_fn(task, examples, tokenizer, meter)

    generator = None
    if cfg.eval.before_after or (probe is None and cfg.probe.every):
        generator = make_generator(cfg.generation.backend, model, tokenizer, cfg.generation.batch_size,
                                   cfg.generation.prefix_cache)
    if probe is None:
        probe = make_probe(cfg, tokenizer, generator, task)
    logged = {(r.get("kind"), r.get("step")) for r in run.metrics()}
    if cfg.eval.before_after and start_step == 0 and ("eval", 0) not in logged:
        heldout_eval(cfg, model, tokenizer, generator, task, run, label="before", step=0, say=_say(cfg))
    if probe is not None and start_step == 0 and ("probe", 0) not in logged:
        run.log_metrics(probe_record(probe, model, 0, METHOD))

    name_or_path = model.config._name_or_path
    use_cache = getattr(model.config, "use_cache", None)  # TRL turns it off for gradient checkpointing
    if g.beta > 0:
        reference = run.path / "reference"
        if injected or init_state_dict is not None or not (Path(name_or_path or "_") / "config.json").exists():
            if not (reference / "config.json").exists():
                run._save_model_dir(reference, model, None, extra={})
            model.config._name_or_path = str(reference)

    trainer_ref: dict = {}
    callback = _make_callback(trainer_ref, run, cfg, meter, totals, probe)
    with tempfile.TemporaryDirectory(prefix="evolm-trl-") as trl_out, warnings.catch_warnings():
        # TRL 1.16 toggles checkpointing around every generate() through transformers' deprecated names
        warnings.filterwarnings("ignore", message=r".*gradient_checkpointing.*deprecated", category=FutureWarning)
        args = trl.GRPOConfig(**trl_args(cfg, trl_out))
        trainer = trl.GRPOTrainer(model=model, reward_funcs=[reward_fn], args=args, train_dataset=dataset,
                                  processing_class=tokenizer, callbacks=[callback, *(callbacks or [])])
        model.config._name_or_path = name_or_path
        trainer_ref["trainer"] = trainer
        for cb in (PrinterCallback, ProgressCallback):
            trainer.remove_callback(cb)
        if start_step < g.steps:
            try:
                trainer.train(resume_from_checkpoint=str(ckpt) if ckpt is not None else None)
            except BaseException as e:
                run.update_info(status="interrupted", stopped_at_step=int(trainer.state.global_step), error=repr(e))
                raise
        final_step = max(start_step, int(trainer.state.global_step))

    _restore_plain_model(model, use_cache)
    logged_probes = {r["step"] for r in run.metrics() if r.get("kind") == "probe"}
    if probe is not None and final_step not in logged_probes:
        run.log_metrics(probe_record(probe, model, final_step, METHOD))
    run.save_final(model, tokenizer, state={"step": final_step, "method": METHOD, **totals})
    if cfg.eval.before_after:
        heldout_eval(cfg, model, tokenizer, generator, task, run, label="after", step=final_step, say=_say(cfg))
    plot_training(run)
    run.finish(steps=final_step, peak_rss_mb=peak_rss_mb(), **totals)
    return run


def _say(cfg):
    return (lambda *a: print(*a, flush=True)) if cfg.run.progress else (lambda *a: None)


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


# --------------------------------------------------------------------------------------------------
# command line


def _cmd_grpo(args) -> int:
    from evolm import config
    from evolm.runs import RunDir

    if args.resume:
        run = RunDir.open(args.resume)
        cfg = config.load(GRPOJob, run.config_path, args.overrides)
        out = run_grpo(cfg, resume=run)
    elif not args.config:
        raise UserError("evolm grpo needs --config FILE (or --resume RUN_DIR); `evolm config grpo` prints every field")
    else:
        cfg = config.load(GRPOJob, args.config, args.overrides)
        out = run_grpo(cfg)
    print(out.path)
    return 0


def add_cli(sub) -> None:
    p = sub.add_parser(
        "grpo", help="GRPO post-training (TRL GRPOTrainer) from a TOML config",
        description="Train with Hugging Face TRL's GRPOTrainer on the same model, task and reward as ES. Writes "
                    "runs/<name>/ (config.toml, run.json, metrics.jsonl with per-update cost, checkpoints/, final/) "
                    "in the same format as `evolm es`, and prints the run directory. `evolm config grpo` lists "
                    "every field.",
        epilog="example: evolm grpo --config configs/grpo-arithmetic.toml --set grpo.steps=5",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", "-c", metavar="FILE", help="TOML config file (see `evolm config grpo`)")
    p.add_argument("--set", "-s", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config field, e.g. --set grpo.lr=2e-5 (repeatable; values are TOML literals)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a killed GRPO run from its newest checkpoint (weights, AdamW state, RNG and data "
                        "position are restored); --set grpo.steps=N extends the budget")
    p.set_defaults(func=_cmd_grpo)


__all__ = ["GRPOSection", "GRPOJob", "run_grpo", "trl_args", "training_rows", "make_reward_fn", "step_record",
           "RolloutMeter", "LOSS_TYPES", "add_cli"]
