"""Typed run configuration: dataclasses with a docstring per field, loaded from TOML and validated.

Design decisions:

- One dataclass per concern (``RunConfig``, ``ModelConfig``, ``TaskConfig``, ``GenerationConfig``,
  ``ESConfig``, ``EvalConfig``); a job's config (``ESJob``) nests them as TOML tables
  ``[run] [model] [task] [generation] [es] [eval]``. Other jobs (GRPO, pipelines) reuse the same
  sections and add their own.
- ``load(cls, path, overrides)`` builds the dataclass from TOML, applies ``--set key=value``
  overrides (TOML literals: ``es.sigma=0.002``, ``task.params.digits=3``), rejects unknown fields with a
  did-you-mean, checks types, then calls each section's ``validate()``. Every failure is a
  ``ConfigError`` whose one-line message names the field.
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
from evolm.rewards import EXACT, resolve_reward
from evolm.tasks import TASKS


# --------------------------------------------------------------------------------------------------
# sections


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

    def validate(self, p: str) -> None:
        require(bool(self.name.strip()), f"{p}.name must not be empty")
        require(self.checkpoint_every >= 0, f"{p}.checkpoint_every must be >= 0 (got {self.checkpoint_every})")
        require(self.keep_checkpoints >= 1, f"{p}.keep_checkpoints must be >= 1 (got {self.keep_checkpoints})")


@dataclass
class ModelConfig:
    spec: str = "smollm2-135m"
    """Model to train: an embedded name (smollm2-135m, gemma3-270m), a model directory, a run directory, a .gguf file or a hub id."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Dtype the model generates in. ES always keeps float32 master weights; with float32 it perturbs them in place."""
    threads: int = 1
    """torch CPU threads (1 is steadiest on a shared 2-core machine)."""
    device: str = "cpu"
    """torch device for the model: cpu, cuda, cuda:1, ..."""

    def validate(self, p: str) -> None:
        require(self.threads >= 1, f"{p}.threads must be >= 1 (got {self.threads})")
        require(self.device == "cpu" or self.device.startswith(("cuda", "mps")),
                f"{p}.device must be cpu, cuda[:i] or mps (got '{self.device}')")


@dataclass
class TaskConfig:
    name: str = "arithmetic"
    """Training task: arithmetic or countdown (procedural), or any task in ``evolm.tasks.TASKS``."""
    reward: str = "format_answer"
    """Reward convention (docs/rewards.md): format_answer = 0.1 x format + 1.0 x answer and tiered = 1.0 correct / 0.1 format only / 0, both with evolm's lenient answer checkers (any task); qiu_exact and tinyzero_exact = Qiu et al.'s and TinyZero's countdown reward code reproduced exactly (countdown only). The old names qiu and tinyzero load as format_answer and tiered."""
    params: dict[str, Any] = field(default_factory=dict)
    """Task knobs, e.g. {digits = 2, operators = "+", terms = 2} for arithmetic, {numbers = [3, 4]} for countdown, or {path = "countdown.json"} for countdown on Qiu et al.'s or TinyZero's data files."""
    system_prompt: str | None = None
    """System message for chat models; None uses the task's own short instruction, "" drops it (the template's default may then appear)."""

    def validate(self, p: str) -> None:
        require(self.name in TASKS, f"{p}.name must be one of {sorted(TASKS)} (got '{self.name}')")
        self.reward = resolve_reward(self.reward, f"{p}.reward")
        if self.reward in EXACT:
            owners = sorted(n for n, cls in TASKS.items() if self.reward in cls.exact_conventions)
            require(self.reward in TASKS[self.name].exact_conventions,
                    f"{p}.reward = '{self.reward}' reproduces {EXACT[self.reward]} and exists only for "
                    f"{', '.join(owners)}, not '{self.name}'; use format_answer or tiered")


@dataclass
class GenerationConfig:
    backend: Literal["hf"] = "hf"
    """Generation backend: hf (transformers generate, CPU or GPU). Others implement evolm.backends.base.Generator."""
    batch_size: int = 32
    """Prompts per generate() call."""
    max_new_tokens: int = 24
    """Completion length limit in tokens."""
    temperature: float = 0.0
    """Sampling temperature while training; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass while training (ignored when greedy)."""
    prefix_cache: bool = True
    """Run a prefix shared by a batch's prompts (system message, worked demonstrations) once and reuse its KV cache."""

    def validate(self, p: str) -> None:
        require(self.batch_size >= 1, f"{p}.batch_size must be >= 1 (got {self.batch_size})")
        require(self.max_new_tokens >= 1, f"{p}.max_new_tokens must be >= 1 (got {self.max_new_tokens})")
        require(self.temperature >= 0, f"{p}.temperature must be >= 0 (got {self.temperature})")
        require(0 < self.top_p <= 1, f"{p}.top_p must be in (0, 1] (got {self.top_p})")


@dataclass
class ESConfig:
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
    noise: Literal["table", "stream"] = "table"
    """table: key-derived windows into a seeded shared Gaussian table (Salimans et al. 2017; fast). stream: a fresh Gaussian stream per (iteration, member, tensor) (slower)."""
    noise_table_size: int = 0
    """Entries in the noise table (float32); 0 picks max(2^25, 1.25 x largest tensor)."""
    params: list[str] = field(default_factory=lambda: ["all"])
    """Parameter categories ES perturbs: all, norm, attention, mlp, embedding, lm_head (several allowed)."""
    param_regex: str = ""
    """If set, also require parameter names to match this regular expression."""
    eval_center_every: int = 0
    """Score the unperturbed centre on the iteration's prompts every this many updates (0: never)."""
    perturbation: Literal["full", "lowrank"] = "full"
    """full: each member adds sigma x dense Gaussian noise to every selected coordinate, and members are scored one after another. lowrank (EGGROLL): each selected weight matrix W (out x in; Linear weights, the embedding per looked-up row) gets sigma * A B^T / sqrt(rank) with Gaussian A (out x rank), B (in x rank); vectors (norms, biases) get full noise; all members are scored in one batched forward pass (hf backend). See docs/es.md."""
    rank: int = 4
    """Rank r of each member's matrix perturbation when perturbation = "lowrank" (an update has rank <= N x r)."""
    member_batch: int = 0
    """With perturbation = "lowrank": members per batched generate call (0: all N at once). Rows per call = members x prompts; lower it to bound memory (the KV cache grows with the rows)."""

    def validate(self, p: str) -> None:
        require(self.iterations >= 1, f"{p}.iterations must be >= 1 (got {self.iterations})")
        require(self.population >= 2, f"{p}.population must be >= 2 (got {self.population})")
        if self.estimator == "antithetic":
            require(self.population % 2 == 0, f"{p}.population must be even for the antithetic estimator (got {self.population})")
        require(self.sigma > 0, f"{p}.sigma must be > 0 (got {self.sigma})")
        require(self.lr > 0, f"{p}.lr must be > 0 (got {self.lr})")
        require(self.prompts_per_iteration >= 1, f"{p}.prompts_per_iteration must be >= 1 (got {self.prompts_per_iteration})")
        require(self.noise_table_size >= 0, f"{p}.noise_table_size must be >= 0 (got {self.noise_table_size})")
        require(self.eval_center_every >= 0, f"{p}.eval_center_every must be >= 0 (got {self.eval_center_every})")
        require(self.rank >= 1, f"{p}.rank must be >= 1 (got {self.rank})")
        require(self.member_batch >= 0, f"{p}.member_batch must be >= 0 (got {self.member_batch}; 0 scores all members in one call)")
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
        require(self.temperature >= 0, f"{p}.temperature must be >= 0 (got {self.temperature})")
        if self.task:
            require(self.task in TASKS, f"{p}.task must be one of {sorted(TASKS)} (got '{self.task}')")


def _validate_heldout(section, p: str) -> None:
    """The checks ``[eval]`` and ``[probe]`` share (problem count, samples, k, nucleus mass, length)."""
    require(section.count >= 1, f"{p}.count must be >= 1 (got {section.count})")
    require(section.n_samples >= 1, f"{p}.n_samples must be >= 1 (got {section.n_samples})")
    require(all(1 <= k <= section.n_samples for k in section.k) and bool(section.k),
            f"{p}.k values must lie in [1, n_samples={section.n_samples}] (got {section.k})")
    require(0 < section.top_p <= 1, f"{p}.top_p must be in (0, 1] (got {section.top_p})")
    require(section.max_new_tokens >= 0, f"{p}.max_new_tokens must be >= 0 (got {section.max_new_tokens})")


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
        require(self.temperature > 0, f"{p}.temperature must be > 0 (entropy and pass@k need sampling; got {self.temperature})")
        if self.task and self.every:
            require(self.task in TASKS, f"{p}.task must be one of {sorted(TASKS)} (got '{self.task}')")


@dataclass
class ESJob:
    """An ES post-training run: ``evolm es --config FILE``."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    generation: GenerationConfig = field(default_factory=GenerationConfig)
    es: ESConfig = field(default_factory=ESConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    probe: ProbeConfig = field(default_factory=ProbeConfig)

    def validate_job(self) -> None:
        if self.es.perturbation == "lowrank":
            require(self.generation.backend == "hf",
                    f"es.perturbation='lowrank' scores members in batched forward passes of the hf backend; "
                    f"set generation.backend='hf' (got '{self.generation.backend}') or es.perturbation='full'")


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
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string (got {value!r})")
        return value
    raise ConfigError(f"{path}: unsupported type {_type_name(tp)}")


def _build(cls, data: dict, prefix: str = ""):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in data:
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


def read_toml(path: str | Path) -> dict:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None


def from_dict(cls, data: dict, overrides: list[str] | tuple[str, ...] = ()):
    """Build and validate a job config from a dict (e.g. parsed TOML) plus ``key=value`` overrides."""
    data = _deepcopy(data)
    for assignment in overrides:
        apply_override(data, assignment)
    cfg = _build(cls, data)
    validate(cfg)
    return cfg


def load(cls, path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()):
    """Load ``cls`` from a TOML file (or defaults when ``path`` is None), apply overrides, validate."""
    return from_dict(cls, read_toml(path) if path else {}, overrides)


def validate(cfg) -> None:
    """Run ``validate(prefix)`` of every section of a job config."""
    for f in dataclasses.fields(cfg):
        section = getattr(cfg, f.name)
        if hasattr(section, "validate"):
            section.validate(f.name)
    if hasattr(cfg, "validate_job"):
        cfg.validate_job()


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
