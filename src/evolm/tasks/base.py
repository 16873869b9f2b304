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

import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from evolm.errors import ConfigError
from evolm.rewards import EXACT, REWARDS, Verdict, resolve_reward
from evolm.tasks.canonical import canonical_text


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

    def __init__(self, reward: str = "format_answer", system_prompt: str | None = None, **params: Any):
        reward = resolve_reward(reward)
        if reward in EXACT and reward not in self.exact_conventions:
            from evolm.tasks import TASKS  # the registry imports this module: look it up when it is complete

            owners = ", ".join(sorted(n for n, cls in TASKS.items() if reward in cls.exact_conventions)) or "no task"
            raise ConfigError(f"task.reward = '{reward}' reproduces {EXACT[reward]} and exists only for {owners}, "
                              f"not '{self.name}'; use format_answer or tiered")
        self.reward_name = reward
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
        """The task's reward under its configured convention (pure)."""
        if self.reward_name in EXACT:
            return self.exact_reward(completion, example)
        return REWARDS[self.reward_name](self.check(completion, example))

    def exact_reward(self, completion: str, example: Example) -> float:
        """The reward of a reference convention listed in ``exact_conventions`` (tasks that list one implement this)."""
        raise NotImplementedError(f"task '{self.name}' does not implement {self.reward_name}")

    def is_correct(self, completion: str, example: Example) -> bool:
        return self.check(completion, example).correct

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
