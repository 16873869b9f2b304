"""The Task interface: draw examples, render prompts, extract answers, and score completions.

Design decisions:

- An ``Example`` is plain data (id, question text, gold answer, metadata); a ``Task`` holds only its
  knobs (difficulty, prompt wording) and is otherwise stateless.
- Scoring is split in two pure steps so reward conventions are interchangeable:
  ``task.check(completion, example) -> Verdict`` (did the completion follow the answer format, is the
  answer right) and ``rewards.REWARDS[name](verdict) -> float``. ``task.reward(completion, example)``
  composes them with the task's configured convention. No step has side effects. A reference
  convention (``qiu_exact``, ``tinyzero_exact``) is not a function of a Verdict: a task that lists it
  in ``exact_conventions`` computes it in ``exact_reward`` and its ``check`` then reports the
  reference's own judgement; every other task refuses it at construction (one-line ``ConfigError``).
- ``canonical_answer(answer)`` maps an extracted answer to the key maj@k votes on and distinct-correct
  counts (``evolm.tasks.canonical``); the default collapses whitespace, tasks with structured
  answers (numbers, equations, programs) override it.
- A task whose data carry their own full prompt text returns it from ``verbatim_prompt``; such a
  prompt is fed as is (no chat template, no system message).
- Prompts go through the tokenizer's chat template when it has one (instruct models) and are plain
  text otherwise (base models). The task supplies a short system message, because the default one of
  some templates (SmolLM2's) costs 16 prompt tokens per call and says nothing about the task.
- ``examples(split, count, seed)`` is deterministic in its arguments. Procedural tasks derive the
  split from the seed stream so train and test never share a problem; dataset-backed tasks slice a
  seeded permutation.
"""

from __future__ import annotations

import dataclasses
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from evolm.errors import ConfigError
from evolm.plugins import provenance
from evolm.rewards import EXACT, REWARDS, RewardFunctions, Verdict, is_convention, resolve_reward
from evolm.tasks.canonical import canonical_text



TASKS: dict[str, "type[Task]"] = {}
"""The built-in tasks by name, filled by ``register`` as ``evolm.tasks`` imports its modules (complete
before any task is built: importing this module imports the package first)."""


def register(cls):
    """Class decorator: a built-in task under ``cls.name``."""
    TASKS[cls.name] = cls
    return cls


@dataclass(frozen=True)
class Example:
    """One problem: ``question`` is what the model sees, ``answer`` what the checker compares to."""

    id: str
    question: str
    answer: Any
    meta: dict = field(default_factory=dict, hash=False, compare=False)


class Task(ABC):
    """Base class of every task. Subclasses set ``name`` and implement the abstract methods."""

    name: str = "task"
    splits: tuple[str, ...] = ("train", "test")
    instruction: str = ""
    """Default system message for chat models (overridable per run)."""

    exact_conventions: tuple[str, ...] = ()
    """Reference reward conventions (``rewards.EXACT``) this task reproduces; others are refused."""

    reference: str | None = None
    """The name a user's task was found by (entry point or ``module:Class``), set by ``make_task``; None for built-ins."""

    default_max_new_tokens: int | None = None
    """The completion length ``evolm eval`` gives this task when ``--max-new-tokens`` is not given (gsm8k 256,
    a multiple-choice task 32); None: not declared, and eval uses ``evaluate.FALLBACK_MAX_NEW_TOKENS`` and says
    so. A run's own evaluation uses ``eval.max_new_tokens`` (else ``generation.max_new_tokens``) instead."""

    own_checker: bool = True
    """Whether ``check`` is a real judgement of correctness. With reward functions and no correctness
    function, a task without one (``dataset`` without ``checker``) counts ``reward >= threshold``."""

    def __init__(self, reward: str | list[str] | tuple[str, ...] = "format_answer", system_prompt: str | None = None, *,
                 reward_weights=(), correct: str = "", correct_threshold: float = 1.0, **params: Any):
        refs = [reward] if isinstance(reward, str) else list(reward)
        convention = len(refs) == 1 and is_convention(refs[0])
        if not convention and any(is_convention(r) for r in refs):
            raise ConfigError(f"task.reward mixes a convention with reward functions ({refs}); list functions only")
        functions = [] if convention else refs
        if reward_weights and not functions:
            raise ConfigError("task.reward_weights weigh reward functions; task.reward is a convention")
        self.user_rewards: RewardFunctions | None = (
            RewardFunctions(functions, reward_weights, correct, correct_threshold) if functions or correct else None)
        reward = refs[0] if convention else "format_answer"  # with functions, the checker still reads format and answer
        reward = resolve_reward(reward)
        if reward in EXACT and reward not in self.exact_conventions:
            owners = ", ".join(sorted(n for n, cls in TASKS.items() if reward in cls.exact_conventions)) or "no task"
            raise ConfigError(f"task.reward = '{reward}' reproduces {EXACT[reward]} and exists only for {owners}, "
                              f"not '{self.name}'; use format_answer or tiered")
        self.reward_name = self.user_rewards.name if self.user_rewards and self.user_rewards.refs else reward
        self.system_prompt = self.instruction if system_prompt is None else system_prompt
        self.configure(**params)

    def configure(self, **params: Any) -> None:
        """Take task knobs; the default accepts none."""
        if params:
            raise ConfigError(f"task '{self.name}' takes no params (got {sorted(params)})")

    # -- data --------------------------------------------------------------------------------------
    @abstractmethod
    def examples(self, split: str, count: int | None, seed: int = 0) -> list[Example]:
        """``count`` examples of ``split`` (all of a fixed split when ``count`` is None), deterministic in ``seed``."""

    # -- prompting ---------------------------------------------------------------------------------
    def messages(self, example: Example) -> list[dict[str, str]]:
        msgs = []
        if self.system_prompt:
            msgs.append({"role": "system", "content": self.system_prompt})
        msgs.append({"role": "user", "content": example.question})
        return msgs

    def render_prompt(self, example: Example, tokenizer=None) -> str:
        """The exact text fed to the model: chat template when available, plain text otherwise."""
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(self.messages(example), tokenize=False, add_generation_prompt=True)
        head = f"{self.system_prompt}\n\n" if self.system_prompt else ""
        return f"{bos_text(tokenizer)}{head}{example.question}\n"

    # -- scoring (pure) ----------------------------------------------------------------------------
    @abstractmethod
    def extract_answer(self, completion: str) -> str | None:
        """The final answer written in ``completion`` (None when there is none)."""

    @abstractmethod
    def check(self, completion: str, example: Example) -> Verdict:
        """Whether the completion is well formatted and whether its answer is correct."""

    def reward(self, completion: str, example: Example) -> float:
        """The task's reward under its configured convention (pure); one completion of ``score``."""
        if self.user_rewards is not None and self.user_rewards.refs:
            return self.score([example], [completion])[0]
        if self.reward_name in EXACT:
            return self.exact_reward(completion, example)
        return REWARDS[self.reward_name](self.check(completion, example))

    # -- scoring many completions at once (what ES, GRPO and evaluation call) --------------------------
    def columns(self, examples: list[Example]) -> dict[str, list]:
        """The data columns a reward function receives, one entry per example: ``answer`` and every field of
        the examples' ``meta`` (absent fields are None)."""
        keys: dict[str, None] = {}
        for ex in examples:
            keys.update(dict.fromkeys(k for k in ex.meta if not k.startswith("_")))
        out = {"answer": [ex.answer for ex in examples]}
        for key in keys:
            if key not in out:
                out[key] = [ex.meta.get(key) for ex in examples]
        return out

    def reward_prompt(self, example: Example) -> Any:
        """The prompt a reward function receives for ``example``: the prompt as its data give it, which is what
        TRL's ``GRPOTrainer`` passes as ``prompts`` (a text row's prompt text; the task's problem text for a
        built-in task), never the chat-rendered text the model was fed."""
        return self.verbatim_prompt(example) or example.question

    def score(self, examples: list[Example], completions: list[str], prompts: list[str] | None = None,
              unscored: float | None = 0.0) -> list[float | None]:
        """The reward of each ``completions[i]`` of ``examples[i]``: the reward functions in one batched call when
        the task has them (their ``prompts``: ``reward_prompt`` of each example, as TRL passes them), else the
        convention one by one. ``prompts`` (the rendered texts the model saw) is accepted and not used.
        ``unscored``: the value of a completion no reward function gave a number (all returned None)."""
        if self.user_rewards is None or not self.user_rewards.refs:
            return [float(self.reward(c, ex)) for c, ex in zip(completions, examples, strict=True)]
        return self.user_rewards.rewards([self.reward_prompt(ex) for ex in examples], completions, self.columns(examples),
                                         unscored)

    def judge(self, examples: list[Example], completions: list[str], prompts: list[str] | None = None) -> list[Verdict]:
        """``check`` of each completion, its ``correct`` decided by the correctness function when there is one,
        else by ``reward >= correct_threshold`` for a task without its own checker (``own_checker``)."""
        verdicts = [self.check(c, ex) for c, ex in zip(completions, examples, strict=True)]
        rf = self.user_rewards
        if rf is None:
            return verdicts
        correct = rf.correct([self.reward_prompt(ex) for ex in examples], completions, self.columns(examples))
        if correct is None and not self.own_checker and rf.refs:
            correct = [r >= rf.threshold for r in self.score(examples, completions, prompts)]
        if correct is None:
            return verdicts
        return [dataclasses.replace(v, correct=bool(c)) for v, c in zip(verdicts, correct)]

    def plugins(self) -> dict:
        """Where this task's code and reward functions come from (``plugins.provenance``), for ``run.json``."""
        out: dict = {}
        if getattr(self, "reference", None):  # a task found by entry point or reference (``make_task``)
            out["task"] = provenance(type(self), self.reference)
        if self.user_rewards is not None:
            out.update(self.user_rewards.provenance())
        return out

    def exact_reward(self, completion: str, example: Example) -> float:
        """The reward of a reference convention listed in ``exact_conventions`` (tasks that list one implement this)."""
        raise NotImplementedError(f"task '{self.name}' does not implement {self.reward_name}")

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.judge([example], [completion])[0].correct

    def canonical_answer(self, answer: str | None) -> str | None:
        """The key an extracted answer votes with in maj@k and counts as in distinct-correct (None: no vote)."""
        return canonical_text(answer)

    def verbatim_prompt(self, example: Example) -> str | None:
        """The example's own full prompt text when its data carry one (fed as is), else None."""
        return None


def bos_text(tokenizer) -> str:
    """The beginning-of-sequence token's text when ``tokenizer`` starts plain text with one, else ``""``.

    Generators encode rendered prompts with ``add_special_tokens=False`` (a chat template writes its own
    special tokens), so a plain-text prompt for a base model that expects BOS (Gemma: without it the
    model degenerates) carries the token in its text. SmolLM2's tokenizer adds none.
    """
    bos = getattr(tokenizer, "bos_token", None)
    if tokenizer is None or bos is None:
        return ""
    ids = tokenizer("a")["input_ids"]
    return bos if ids[:1] == [tokenizer.bos_token_id] else ""


# -- helpers shared by answer extractors -----------------------------------------------------------

ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


def tagged_answer(text: str) -> str | None:
    """The content of the last ``<answer>...</answer>`` block, stripped."""
    found = ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def last_number(text: str) -> str | None:
    """The last number in ``text`` (commas removed), e.g. ``"so 1,234."`` -> ``"1234"``."""
    found = NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None


def same_number(a: str | None, b: Any) -> bool:
    """Numeric equality of two answers written as strings or numbers (``"42.0" == 42``)."""
    if a is None:
        return False
    try:
        return abs(float(str(a).replace(",", "")) - float(str(b).replace(",", ""))) < 1e-9
    except ValueError:
        return False


def special_token_affixes(tokenizer) -> tuple[str, str]:
    """The text of the special tokens ``tokenizer(text)`` adds around any text (e.g. Llama's BOS), as (prefix, suffix).

    evolm's generators tokenize prompts with ``add_special_tokens=False``; a prompt that a reference
    tokenized with the tokenizer's defaults gets these affixes written into its text instead (special
    token strings in a prompt are read back as the special tokens).
    """
    plain = tokenizer("x", add_special_tokens=False)["input_ids"]
    full = tokenizer("x", add_special_tokens=True)["input_ids"]
    for start in range(len(full) - len(plain) + 1):
        if full[start:start + len(plain)] == plain:
            rest = full[start + len(plain):]
            return (tokenizer.decode(full[:start]) if start else ""), (tokenizer.decode(rest) if rest else "")
    return "", ""


def check_rewards(task: Task, tokenizer=None, split: str = "train", count: int = 2) -> None:
    """Call the task's reward and correctness functions once on ``count`` examples of ``split`` (each with
    its gold answer as the completion), so a function that does not run, returns the wrong length, a
    non-number or NaN is a one-line ``RewardError`` before a run directory exists. Mid-run, the same
    failure skips that update (``es.population.score_completions``) and the run carries on."""
    if task.user_rewards is None:
        return
    examples = task.examples(split, count, seed=0)
    prompts = [task.render_prompt(ex, tokenizer) for ex in examples]
    completions = ["" if ex.answer is None else str(ex.answer) for ex in examples]
    task.score(examples, completions, prompts)
    task.judge(examples, completions, prompts)
