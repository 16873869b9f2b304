"""What the seeded, generated tasks (arithmetic, countdown) share: seeded streams, the split rule, knobs.

Design decisions:

- A call ``examples(split, count, seed)`` draws from its own ``random.Random`` seeded with the string
  ``"<task>:<split>:<seed>"`` (string seeds go through SHA-512, so the stream is the same on every
  machine and Python run, whatever ``PYTHONHASHSEED`` is). Same arguments and knobs, same examples.
- Train and test never share a problem: every problem has a canonical *key* (what makes two problems
  the same, e.g. the sorted numbers and target of a countdown), and a hash of ``"<task>:<key>"``
  assigns it to exactly one split (``TEST_FRACTION`` of all problems are test problems). A split's
  stream rejects problems of the other split, so disjointness holds for every pair of seeds.
- Problems are distinct within one call while the split has fresh ones. Some spaces are small
  (1-digit addition has 100 problems, ~20 of them test; default countdown has ~2,600, ~500 test, of
  which only ~30 test problems use 2 numbers), so a call never fails for want of fresh problems:
  after ``_FRESH_TRIES`` draws without a new problem of a *stratum* it repeats problems of that
  stratum. A stratum (countdown: how many numbers) is drawn first for each example, so the mix of
  strata a knob asks for (``numbers=[2, 3]``: half and half) holds at every count instead of
  drifting toward the larger stratum as the smaller one runs dry.
- ``count=None`` means ``DEFAULT_COUNT`` examples: a generated task has no fixed split size.
- Prompts may open with ``shots`` worked demonstrations (chat turns user/assistant; plain text
  "question\nreply\n\n"). SmolLM2-135M-Instruct ignores format instructions but copies a
  demonstrated reply, which is what makes it answer in the first few tokens (numbers in the task
  modules). Demonstrations are train problems drawn from a stream of their own with the task's knobs.
- The answer is read from the last ``<answer>`` block, else from the first non-empty line only.
- Task knobs arrive from TOML (``[task] params``), so they are type-checked here with one-line
  ``ConfigError`` messages naming the knob; unknown knobs are refused by name.
"""

from __future__ import annotations

import hashlib
import random
from abc import abstractmethod
from typing import Any, Iterable

from evolm.errors import ConfigError
from evolm.tasks.base import Example, Task, bos_text, tagged_answer

TEST_FRACTION = 0.2
"""Share of all problems (by key hash) that belong to the test split."""
DEFAULT_COUNT = 500
"""Examples returned by ``examples(split, None, seed)``."""
_FRESH_TRIES = 100
"""Draws of already-chosen problems of a stratum after which that stratum may repeat problems."""
_MAX_DRAWS = 20_000
"""Draws without any problem of the wanted split before giving up (the split is empty)."""


def split_of(task_name: str, key: str) -> str:
    """The split ("train" or "test") a problem belongs to, from a hash of its canonical key."""
    digest = hashlib.sha256(f"{task_name}:{key}".encode()).digest()
    return "test" if int.from_bytes(digest[:8], "big") < TEST_FRACTION * 2**64 else "train"


def split_stream(task_name: str, split: str, seed: int) -> random.Random:
    """The random stream of one (task, split, seed); independent of the global random state."""
    return random.Random(f"{task_name}:{split}:{seed}")


class ProceduralTask(Task):
    """A task whose problems are generated: subclasses implement ``sample(rng, stratum) -> (key, Example)``."""

    shots: int = 1
    """Worked demonstrations shown before the question (set by the subclass's ``configure``)."""
    default_max_new_tokens = 256  # evolm eval's length (kept from before tasks declared it; the configs train with less)

    def stratum(self, rng: random.Random) -> Any:
        """The stratum of the next example (drawn before its problem); one stratum by default."""
        return None

    @abstractmethod
    def sample(self, rng: random.Random, stratum: Any) -> tuple[str, Example]:
        """One random problem of ``stratum`` and its canonical key (same key, same problem)."""

    @abstractmethod
    def demonstration_answer(self, example: Example) -> str:
        """The reply shown for ``example`` when it is used as a worked demonstration."""

    def examples(self, split: str, count: int | None = None, seed: int = 0) -> list[Example]:
        if split not in self.splits:
            raise ConfigError(f"task '{self.name}': split must be one of {', '.join(self.splits)} (got '{split}')")
        count = DEFAULT_COUNT if count is None else count
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError(f"task '{self.name}': count must be a non-negative integer (got {count!r})")
        return self._draw(split, count, split_stream(self.name, split, seed))

    def _draw(self, split: str, count: int, rng: random.Random) -> list[Example]:
        seen: set[str] = set()
        saturated: set[Any] = set()
        out: list[Example] = []
        for _ in range(count):
            stratum = self.stratum(rng)
            repeats = draws = 0
            while True:
                key, example = self.sample(rng, stratum)
                draws += 1
                if split_of(self.name, key) != split:
                    if draws > _MAX_DRAWS:
                        raise ConfigError(f"task '{self.name}': no {split} problems found with {self.knobs()}; "
                                          "make the task larger (more digits, numbers or a higher max)")
                    continue
                if key not in seen or stratum in saturated:
                    break
                repeats += 1
                if repeats >= _FRESH_TRIES:
                    saturated.add(stratum)
                    break
            seen.add(key)
            out.append(example)
        return out

    # -- prompting ---------------------------------------------------------------------------------
    def demonstrations(self) -> list[tuple[str, str]]:
        """The ``shots`` worked (question, reply) pairs shown before every question.

        They are train problems drawn with the current knobs from a stream of their own, so they are
        the same for every prompt, follow the task's difficulty, and are never test problems.
        """
        rng = split_stream(self.name, "demonstrations", 0)
        return [(e.question, self.demonstration_answer(e)) for e in self._draw("train", self.shots, rng)]

    def messages(self, example: Example) -> list[dict[str, str]]:
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for question, reply in self.demonstrations():
            msgs += [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        return msgs + [{"role": "user", "content": example.question}]

    def render_prompt(self, example: Example, tokenizer=None) -> str:
        if tokenizer is not None and getattr(tokenizer, "chat_template", None):
            return super().render_prompt(example, tokenizer)
        head = f"{self.system_prompt}\n\n" if self.system_prompt else ""
        shown = "".join(f"{question}\n{reply}\n\n" for question, reply in self.demonstrations())
        return f"{bos_text(tokenizer)}{head}{shown}{example.question}\n"

    def knobs(self) -> dict[str, Any]:
        """The task's difficulty knobs (for messages and run records)."""
        return {}


# -- answer extraction -----------------------------------------------------------------------------

def answer_text(completion: str) -> tuple[str | None, bool]:
    """Where a generated task's answer is read: ``(text, tagged)``.

    The content of the last ``<answer>...</answer>`` block when there is one (``tagged`` True),
    otherwise the completion's first non-empty line, stripped (None for an empty completion). Reading
    only the first line means a long completion cannot earn credit for a number it mentions later.
    """
    tagged = tagged_answer(completion)
    if tagged is not None:
        return tagged, True
    for line in completion.splitlines():
        if line.strip():
            return line.strip(), False
    return None, False


# -- knob checking ---------------------------------------------------------------------------------

def reject_unknown(task_name: str, unknown: dict[str, Any], known: Iterable[str]) -> None:
    if unknown:
        names = ", ".join(f"'{k}'" for k in sorted(unknown))
        raise ConfigError(f"task '{task_name}' has no param {names}; its params are: {', '.join(known)}")


def int_knob(task_name: str, knob: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise ConfigError(f"task '{task_name}': {knob} must be an integer in [{lo}, {hi}] (got {value!r})")
    return value
