"""Task registry: ``TASKS[name]`` is a ``Task`` subclass; ``make_task`` builds one from config values."""

from __future__ import annotations

from typing import Any

from evolm.errors import ConfigError
from evolm.tasks.base import Example, Task

TASKS: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    TASKS[cls.name] = cls
    return cls


def make_task(name: str, reward: str = "format_answer", system_prompt: str | None = None, **params: Any) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown task '{name}'; known tasks: {', '.join(sorted(TASKS))}")
    try:
        return TASKS[name](reward=reward, system_prompt=system_prompt, **params)
    except TypeError as e:
        raise ConfigError(f"task '{name}': {e}") from None


def heldout_reward(name: str, reward: str) -> str:
    """The convention a held-out task ``name`` is built with when training uses ``reward``.

    Held-out measurements use only ``check`` (correctness, format, answers), never the scalar reward.
    A reference convention carries over to a task that reproduces it (its ``check`` is then the
    reference's judgement); any other held-out task keeps its own checker (``format_answer``).
    """
    from evolm.rewards import EXACT, resolve_reward

    reward = resolve_reward(reward)
    if reward in EXACT and (name not in TASKS or reward not in TASKS[name].exact_conventions):
        return "format_answer"
    return reward


# registration (each module @register's its Task subclasses)
from evolm.tasks import arithmetic, countdown  # noqa: E402,F401  procedural, seeded
from evolm.tasks import arc, csqa, gpqa, gsm8k, hotpotqa, math500, sst2  # noqa: E402,F401  dataset-backed
from evolm.tasks import humaneval, mbpp  # noqa: E402,F401  code, checked in evolm.sandbox

__all__ = ["Example", "Task", "TASKS", "heldout_reward", "make_task", "register"]
