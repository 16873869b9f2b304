"""evolm from Python, in TRL's shape: ``ESTrainer`` + ``ESConfig`` and ``GRPOTrainer`` + ``GRPOConfig``.

    from evolm import ESTrainer, ESConfig
    trainer = ESTrainer(model="smollm2-135m", reward_funcs=[my_reward], args=ESConfig(output_dir="runs/mine"),
                        train_dataset=rows)
    trainer.train()

Design decisions:

- A trainer builds the same job config the CLI builds (``config.ESJob`` / ``grpo.GRPOJob``) and calls the
  same entry point (``jobs.run_es`` / ``jobs.run_grpo``), injecting nothing: a run started from Python is
  the CLI's run directory, resumable with ``evolm es --resume``, replayable, reportable, and bit-identical
  to the CLI run of the same settings (tested).
- The config is flat, as TRL's are: the knobs users turn most, each with a docstring, mapped onto the
  config's sections (``to_overrides``); any other field goes through ``overrides`` (the CLI's ``--set``)
  or ``config_file`` (a TOML config to start from). TRL's name for a field evolm has is accepted
  (``max_completion_length``); a TRL field without an evolm twin (``per_device_train_batch_size``) and any
  unknown name are one-line errors naming evolm's field.
- Everything a run needs must be found again by another process (a resume, ``replay``, ``eval --like``,
  Ray actors), so nothing is kept only in memory: reward functions become references
  (``plugins.reference_of``: ``module:function``, or ``file.py:function`` for a script's own function;
  lambdas and closures are refused in one line); datasets given in memory (``datasets.Dataset``, a list
  of dicts) are written once as JSONL under ``<output_dir's parent>/.datasets/<sha256>-{train,test}.jsonl``
  and read by the ``dataset`` task like a user file; a ``PreTrainedModel`` is saved once under
  ``.models/<fingerprint>/`` and trained from there.
- Switching method is one line: ``GRPOTrainer`` takes the same arguments (``model``, ``reward_funcs``,
  ``train_dataset``, ``eval_dataset``, ``processing_class``) and runs evolm's GRPO baseline (TRL's
  ``GRPOTrainer`` underneath, ``evolm.grpo``) on the same task, rewards and held-out measurements.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Sequence

from evolm import config as config_mod
from evolm.errors import UserError
from evolm.plugins import reference_of, refuse_run_on_import

DATA_DIR = ".datasets"
MODEL_DIR = ".models"


@dataclass
class _Common:
    output_dir: str = "runs/evolm-run"
    """The run directory (created; its parent holds .datasets/ and .models/ for data and models given in memory)."""
    seed: int = 0
    """Root seed of every random choice (run.seed)."""
    max_new_tokens: int = 24
    """Completion length limit in tokens (generation.max_new_tokens)."""
    system_prompt: str | None = None
    """System message for chat models (task.system_prompt; None: the task's own)."""
    prompt_column: str = "prompt"
    """Column of train_dataset / eval_dataset holding the prompt (plain text or chat messages)."""
    answer_column: str = "answer"
    """Column holding the gold answer (handed to reward functions as `answer`; may be absent)."""
    test_fraction: float = 0.1
    """Without eval_dataset: share of train_dataset's distinct prompts held out for evaluation (seeded)."""
    reward_weights: list[float] = field(default_factory=list)
    """One weight per reward function (empty: all 1)."""
    correct_threshold: float = 1.0
    """Without a correctness function or checker: reward >= this counts as correct in pass@k."""
    eval_count: int = 64
    """Held-out problems measured before and after training (eval.count)."""
    eval_samples: int = 8
    """Samples per held-out problem (eval.n_samples)."""
    eval_k: list[int] = field(default_factory=lambda: [1, 4, 8])
    """k of pass@k (eval.k)."""
    before_after: bool = True
    """Evaluate before and after training (eval.before_after)."""
    dtype: str = "auto"
    """Dtype the model generates in (model.dtype; auto: bfloat16 for ES on CUDA and on a CPU with AMX, else float32)."""
    device: str = "auto"
    """torch device (model.device; auto: cuda when torch sees a GPU, else cpu)."""
    threads: int | str = "auto"
    """torch CPU threads (model.threads; auto: the cores this process may use)."""
    save: str = "all"
    """Weights kept on disk (run.save: all, final, none)."""
    report_to: list[str] = field(default_factory=list)
    """Experiment trackers (run.report_to: tensorboard, wandb)."""
    progress: bool = True
    """Show progress bars (run.progress)."""
    config_file: str | None = None
    """A TOML config to start from; the fields above and overrides are applied on top."""
    overrides: list[str] = field(default_factory=list)
    """Any other config field, as the CLI's --set: ["es.shaping='centered_rank'", "probe.every=5"]."""

    def common_overrides(self) -> list[str]:
        out = Path(self.output_dir)
        sets = {"run.out_dir": str(out.parent), "run.name": out.name, "run.seed": self.seed,
                "generation.max_new_tokens": self.max_new_tokens, "eval.count": self.eval_count,
                "eval.n_samples": self.eval_samples, "eval.k": list(self.eval_k), "eval.before_after": self.before_after,
                "model.dtype": self.dtype, "model.device": self.device, "model.threads": self.threads,
                "run.save": self.save, "run.report_to": list(self.report_to), "run.progress": self.progress,
                "task.correct_threshold": self.correct_threshold, "task.reward_weights": list(self.reward_weights)}
        if self.system_prompt is not None:
            sets["task.system_prompt"] = self.system_prompt
        return [f"{k}={config_mod.toml_inline(v)}" for k, v in sets.items()]


@dataclass
class ESConfig(_Common):
    """Arguments of ``ESTrainer`` (the common fields, then ES's own)."""

    iterations: int = 20
    """ES updates (es.iterations)."""
    population: int = 8
    """Members per update, N (es.population)."""
    sigma: float = 1e-3
    """Perturbation scale (es.sigma)."""
    learning_rate: float = 5e-4
    """Step size alpha (es.lr)."""
    prompts_per_iteration: int = 32
    """Training prompts per update; a member's fitness is its mean reward over them (es.prompts_per_iteration)."""
    temperature: float = 0.0
    """Sampling temperature of the members' completions; 0 is greedy (generation.temperature)."""
    shaping: str = "zscore"
    """Fitness shaping (es.shaping: zscore, centered_rank, none)."""
    estimator: str = "one_point"
    """one_point or antithetic (es.estimator)."""
    workers: int | str = "auto"
    """Ray actors scoring the population (distributed.workers; 0: this process; auto: one per core on CPU when Ray is installed and the run is large enough)."""

    def to_overrides(self) -> list[str]:
        sets = {"es.iterations": self.iterations, "es.population": self.population, "es.sigma": self.sigma,
                "es.lr": self.learning_rate, "es.prompts_per_iteration": self.prompts_per_iteration,
                "generation.temperature": self.temperature, "es.shaping": self.shaping, "es.estimator": self.estimator,
                "distributed.workers": self.workers}
        return self.common_overrides() + [f"{k}={config_mod.toml_inline(v)}" for k, v in sets.items()] + list(self.overrides)


@dataclass
class GRPOConfig(_Common):
    """Arguments of ``GRPOTrainer`` (the common fields, then GRPO's own; TRL's names where TRL has one)."""

    max_steps: int = 20
    """Optimizer steps (grpo.steps)."""
    learning_rate: float = 1e-5
    """AdamW learning rate (grpo.lr)."""
    num_generations: int = 8
    """Completions per prompt, the group size G (grpo.num_generations)."""
    prompts_per_step: int = 4
    """Training problems per step (grpo.prompts_per_step)."""
    temperature: float = 1.0
    """Rollout sampling temperature (grpo.temperature)."""
    beta: float = 0.0
    """KL coefficient toward the starting weights (grpo.beta)."""
    loss_type: str = "grpo"
    """TRL's loss formulation (grpo.loss_type)."""

    def to_overrides(self) -> list[str]:
        sets = {"grpo.steps": self.max_steps, "grpo.lr": self.learning_rate, "grpo.num_generations": self.num_generations,
                "grpo.prompts_per_step": self.prompts_per_step, "grpo.temperature": self.temperature,
                "grpo.beta": self.beta, "grpo.loss_type": self.loss_type}
        return self.common_overrides() + [f"{k}={config_mod.toml_inline(v)}" for k, v in sets.items()] + list(self.overrides)


TRL_ALIASES = {"max_completion_length": "max_new_tokens"}
"""TRL's name for a field -> evolm's, accepted by ``ESConfig`` and ``GRPOConfig`` (both names at once: refused)."""
TRL_REFUSED = {
    "per_device_train_batch_size": "evolm's GRPOConfig counts training problems per step: set prompts_per_step (a step "
                                   "samples prompts_per_step x num_generations completions)",
    "num_train_epochs": "set max_steps (GRPOConfig) or iterations (ESConfig)",
    "gradient_accumulation_steps": "evolm steps once per prompts_per_step x num_generations completions; other TRL "
                                   "fields go in overrides=[\"grpo.FIELD=VALUE\"] (evolm config grpo lists them)",
}
"""TRL field names with no one-to-one evolm field: a one-line ``UserError`` naming evolm's."""


def _accept_trl_names(cls):
    """Let ``cls(...)`` take TRL's field names (``TRL_ALIASES``) and refuse any other unknown name in one line."""
    init = cls.__init__
    names = [f.name for f in fields(cls)]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        for trl, ours in TRL_ALIASES.items():
            if trl in kwargs:
                if ours in kwargs:
                    raise UserError(f"{cls.__name__} got both {trl} (TRL's name) and {ours}; give one")
                kwargs[ours] = kwargs.pop(trl)
        for key in kwargs:
            if key in TRL_REFUSED:
                raise UserError(f"{cls.__name__}: {key} is TRL's, with no evolm field of that meaning; {TRL_REFUSED[key]}")
            if key not in names:
                close = difflib.get_close_matches(key, names + list(TRL_ALIASES), n=2)
                hint = f"did you mean {' or '.join(repr(c) for c in close)}?" if close else f"its fields: {', '.join(names)}"
                raise UserError(f"{cls.__name__} has no field '{key}' ({hint}); any config field goes in "
                                "overrides=['section.field=value']")
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls


_accept_trl_names(ESConfig)
_accept_trl_names(GRPOConfig)


@dataclass
class TrainOutput:
    """What ``train()`` returns: the run directory and the numbers a user looks at first."""

    run_dir: Path
    steps: int
    eval_before: dict | None
    """The held-out summary before training (greedy, pass@k, entropy), when measured."""
    eval_after: dict | None
    """The same after training."""


def _rows(dataset: Any, what: str) -> list[dict]:
    if dataset is None:
        return []
    if hasattr(dataset, "to_list"):  # datasets.Dataset
        rows = dataset.to_list()
    elif isinstance(dataset, Sequence) and not isinstance(dataset, (str, bytes)):
        rows = list(dataset)
    else:
        raise UserError(f"{what} must be a datasets.Dataset or a list of dicts (got {type(dataset).__name__})")
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise UserError(f"{what} must hold at least one row, each a dict of columns")
    return rows


def write_rows(rows: list[dict], root: Path, split: str) -> Path:
    """``rows`` as JSONL under ``root/.datasets/``, named by their content's SHA-256 (written once)."""
    try:
        text = "".join(json.dumps(r, sort_keys=True, ensure_ascii=False) + "\n" for r in rows)
    except TypeError as e:
        raise UserError(f"the {split} dataset has a value JSON cannot hold ({e}); convert it to text or numbers") from None
    path = root / DATA_DIR / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}-{split}.jsonl"
    if not path.exists():
        from evolm.runs import atomic_write_text

        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, text)
    return path


def save_model(model, tokenizer, root: Path) -> Path:
    """A ``PreTrainedModel`` (and its tokenizer) saved once under ``root/.models/<fingerprint>/``: the spec it trains from."""
    from evolm.state import model_fingerprint

    if tokenizer is None:
        raise UserError("pass the tokenizer as processing_class together with a loaded model")
    from evolm.runs import save_model_dir

    path = root / MODEL_DIR / model_fingerprint(model)[:16]
    if not (path / "config.json").exists():  # atomic, in the umask's usual modes (safetensors alone writes 0600)
        save_model_dir(path, model, tokenizer, extra={})
    return path


class _Trainer:
    kind = ""
    config_class: type = _Common

    def __init__(self, model: Any = "smollm2-135m", reward_funcs: Sequence[Callable | str] | Callable | str | None = None,
                 args: _Common | None = None, train_dataset: Any = None, eval_dataset: Any = None,
                 processing_class: Any = None, *, task: str | None = None, task_params: dict | None = None,
                 correct_func: Callable | str | None = None):
        """``model``: a spec (embedded name, model directory, run directory, .gguf, hub id) or a loaded
        ``PreTrainedModel`` with its tokenizer as ``processing_class``. ``reward_funcs``: functions in TRL's
        convention ``fn(prompts, completions, **columns) -> list[float | None]`` (or their references);
        None: the task's own reward convention. ``train_dataset`` / ``eval_dataset``: a ``datasets.Dataset``
        or a list of dicts (the ``dataset`` task); or ``task`` (a built-in task, entry point or reference)
        with ``task_params``. ``correct_func``: the correctness function pass@k counts (same signature,
        booleans)."""
        refuse_run_on_import()  # a script's unguarded training call, reached again by evolm importing the script
        self.args = args if args is not None else self.config_class()
        if not isinstance(self.args, self.config_class):
            raise UserError(f"{type(self).__name__} takes args={self.config_class.__name__}(...) "
                            f"(got {type(self.args).__name__})")
        root = Path(self.args.output_dir).parent
        funcs = [] if reward_funcs is None else [reward_funcs] if callable(reward_funcs) or isinstance(reward_funcs, str) \
            else list(reward_funcs)
        sets = self.args.to_overrides()
        if funcs:
            sets.append(f"task.reward={config_mod.toml_inline([reference_of(f, 'reward function') for f in funcs])}")
        if correct_func is not None:
            sets.append(f"task.correct={config_mod.toml_inline(reference_of(correct_func, 'correctness function'))}")
        sets += self._task_overrides(root, task, task_params, train_dataset, eval_dataset)
        if isinstance(model, str):
            spec = model
        else:
            spec = str(save_model(model, processing_class, root))
        sets.append(f"model.spec={config_mod.toml_inline(spec)}")
        data = config_mod.read_toml(self.args.config_file, paths_from_file=True) if self.args.config_file else {}
        self.job = config_mod.from_dict(self._job_class(), data, sets)

    def _task_overrides(self, root: Path, task, task_params, train_dataset, eval_dataset) -> list[str]:
        if train_dataset is None:
            if eval_dataset is not None:
                raise UserError("eval_dataset needs a train_dataset (or give task= for a built-in or registered task)")
            sets = [f"task.name={config_mod.toml_inline(task)}"] if task else []
            return sets + ([f"task.params={config_mod.toml_inline(dict(task_params))}"] if task_params else [])
        if task is not None:
            raise UserError("give either train_dataset (the dataset task) or task=, not both")
        params = {"train": str(write_rows(_rows(train_dataset, "train_dataset"), root, "train")),
                  "prompt": self.args.prompt_column, "answer": self.args.answer_column,
                  "test_fraction": self.args.test_fraction, **(task_params or {})}
        if eval_dataset is not None:
            params["test"] = str(write_rows(_rows(eval_dataset, "eval_dataset"), root, "test"))
        return ["task.name='dataset'", f"task.params={config_mod.toml_inline(params)}"]

    def _job_class(self) -> type:
        raise NotImplementedError

    @property
    def run_dir(self) -> Path:
        return Path(self.job.run.out_dir) / self.job.run.name

    def train(self, resume: bool = False) -> TrainOutput:
        """Run the job (``resume``: continue the run directory ``output_dir`` where it stopped, as ``--resume``)."""
        from evolm.registry import job_kind
        from evolm.runs import RunDir

        refuse_run_on_import()
        target = self.run_dir if resume else None
        if resume and not (self.run_dir / "run.json").exists():
            raise UserError(f"nothing to resume at {self.run_dir}; call train() without resume to start it")
        run = job_kind(self.kind).run(self.job, target)
        run = run if isinstance(run, RunDir) else RunDir.open(run)
        summary = {label: _summary(run.path / f"eval_{label}.json") for label in ("before", "after")}
        steps = int(run.info().get("steps") or 0)
        return TrainOutput(run.path, steps, summary["before"], summary["after"])

    def config_toml(self) -> str:
        """The resolved config this trainer runs (what ``config.toml`` of its run directory holds)."""
        return config_mod.to_toml(self.job)


def _summary(path: Path) -> dict | None:
    if not path.exists():
        return None
    return json.loads(path.read_text()).get("summary")


class ESTrainer(_Trainer):
    """ES post-training (``evolm es``) from Python; see the module docstring."""

    kind = "es"
    config_class = ESConfig

    def _job_class(self) -> type:
        return config_mod.ESJob


class GRPOTrainer(_Trainer):
    """evolm's GRPO baseline (``evolm grpo``: TRL's GRPOTrainer on the same task and rewards) from Python."""

    kind = "grpo"
    config_class = GRPOConfig

    def _job_class(self) -> type:
        from evolm.grpo import GRPOJob

        return GRPOJob


__all__ = ["ESConfig", "ESTrainer", "GRPOConfig", "GRPOTrainer", "TrainOutput"]
