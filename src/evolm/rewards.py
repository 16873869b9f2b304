"""Reward conventions: pure functions from a checker's ``Verdict`` to a scalar reward.

Two conventions are used in the ES-for-LLMs literature and both are provided by name:

- ``qiu`` (Qiu et al. 2025, "Evolution Strategies at Scale"): additive, ``0.1 * format + 1.0 * answer``,
  so a correct, well-formatted completion earns 1.1.
- ``tinyzero`` (TinyZero's countdown reward): ``1.0`` if correct, else ``0.1`` if the answer format
  was followed, else ``0``.

Both are monotone in correctness, so z-scored ES fitness and GRPO advantages are driven by the answer
checker; the small format term gives a signal before the model answers anything correctly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Verdict:
    """What an answer checker says about one completion."""

    format_ok: bool
    """The completion states a final answer in the form the task asks for."""
    correct: bool
    """That answer is right."""
    answer: str | None = None
    """The extracted final answer (None when there is none)."""


def qiu_reward(verdict: Verdict) -> float:
    return 0.1 * float(verdict.format_ok) + 1.0 * float(verdict.correct)


def tinyzero_reward(verdict: Verdict) -> float:
    if verdict.correct:
        return 1.0
    return 0.1 if verdict.format_ok else 0.0


REWARDS: dict[str, Callable[[Verdict], float]] = {"qiu": qiu_reward, "tinyzero": tinyzero_reward}
