"""Reward conventions: how a task's judgement of one completion becomes a scalar reward.

Two kinds, named so that no name claims more fidelity than the code gives (docs/rewards.md puts
them side by side):

- evolm's lenient conventions, pure functions of a checker's ``Verdict``, available for every task:

  - ``format_answer``: ``0.1 * format + 1.0 * answer`` (a correct, well-formatted completion earns
    1.1). The additive shape of Qiu et al.'s reward, with evolm's lenient answer checkers.
  - ``tiered``: ``1.0`` if correct, else ``0.1`` if the answer format was followed, else ``0``. The
    shape of TinyZero's countdown reward, with evolm's lenient answer checkers.

  Both are monotone in correctness, so z-scored ES fitness and GRPO advantages are driven by the
  answer checker; the small format term gives a signal before the model answers anything correctly.
- Reference conventions, which reproduce published reward code exactly (``evolm.reference_rewards``):
  ``qiu_exact`` (Qiu et al. 2025) and ``tinyzero_exact`` (TinyZero). They are countdown rewards; a task
  lists the ones it implements in ``Task.exact_conventions`` and any other task refuses them with a
  one-line error.

Deprecated names: evolm once called the lenient conventions ``qiu`` and ``tinyzero``. Those names
still load (configs, run directories written before the rename) and mean what they always meant,
``format_answer`` and ``tiered``, never the exact ones; the first use in a process prints a one-line
note on stderr.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

from evolm.errors import ConfigError


@dataclass(frozen=True)
class Verdict:
    """What an answer checker says about one completion."""

    format_ok: bool
    """The completion states a final answer in the form the task asks for."""
    correct: bool
    """That answer is right."""
    answer: str | None = None
    """The extracted final answer (None when there is none)."""


def format_answer_reward(verdict: Verdict) -> float:
    """``0.1 * format + 1.0 * answer``."""
    return 0.1 * float(verdict.format_ok) + 1.0 * float(verdict.correct)


def tiered_reward(verdict: Verdict) -> float:
    """``1.0`` correct, ``0.1`` format only, ``0`` otherwise."""
    if verdict.correct:
        return 1.0
    return 0.1 if verdict.format_ok else 0.0


REWARDS: dict[str, Callable[[Verdict], float]] = {"format_answer": format_answer_reward, "tiered": tiered_reward}
"""The lenient conventions: functions of a ``Verdict``, for every task."""

EXACT: dict[str, str] = {
    "qiu_exact": "Qiu et al. 2025's countdown reward",
    "tinyzero_exact": "TinyZero's countdown reward",
}
"""The reference conventions: implemented by the tasks that list them in ``Task.exact_conventions``."""

DEPRECATED: dict[str, str] = {"qiu": "format_answer", "tinyzero": "tiered"}
"""Old names of the lenient conventions -> their current names."""

CONVENTIONS: tuple[str, ...] = tuple(REWARDS) + tuple(EXACT)
"""Every convention name a config may give (besides the deprecated ones)."""

_NOTED: set[str] = set()


def resolve_reward(name: str, field: str = "task.reward") -> str:
    """The current name of convention ``name``: deprecated names map to the lenient ones (noted once)."""
    if name in DEPRECATED:
        new = DEPRECATED[name]
        if name not in _NOTED:
            _NOTED.add(name)
            exact = f"{name}_exact"
            print(f"evolm: note: {field} = '{name}' is deprecated and means '{new}' (evolm's lenient checker); "
                  f"'{exact}' reproduces the reference's reward (docs/rewards.md)", file=sys.stderr)
        return new
    if name not in CONVENTIONS:
        raise ConfigError(f"{field} must be one of {list(CONVENTIONS)} (got '{name}')")
    return name
