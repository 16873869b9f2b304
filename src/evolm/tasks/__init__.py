"""Task registry: ``TASKS[name]`` is a ``Task`` subclass; ``make_task`` builds one from config values."""

from __future__ import annotations

from typing import Any

from evolm.errors import ConfigError
from evolm.tasks.base import Example, Task

TASKS: dict[str, type[Task]] = {}


def register(cls: type[Task]) -> type[Task]:
    TASKS[cls.name] = cls
    return cls


def make_task(name: str, reward: str = "qiu", system_prompt: str | None = None, **params: Any) -> Task:
    if name not in TASKS:
        raise ConfigError(f"unknown task '{name}'; known tasks: {', '.join(sorted(TASKS))}")
    try:
        return TASKS[name](reward=reward, system_prompt=system_prompt, **params)
    except TypeError as e:
        raise ConfigError(f"task '{name}': {e}") from None


# registration (each module @register's its Task subclasses)
from evolm.tasks import arithmetic, countdown  # noqa: E402,F401  procedural, seeded
from evolm.tasks import arc, csqa, gpqa, gsm8k, hotpotqa, math500, sst2  # noqa: E402,F401  dataset-backed
from evolm.tasks import humaneval, mbpp  # noqa: E402,F401  code, checked in evolm.sandbox

__all__ = ["Example", "Task", "TASKS", "make_task", "register"]
