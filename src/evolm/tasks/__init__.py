"""Task registry: ``TASKS[name]`` is a built-in ``Task`` subclass; ``find_task`` also finds a user's task (an
entry point of group ``evolm.tasks`` or a ``module:Class`` / ``file.py:Class`` reference, ``evolm.plugins``);
``make_task`` builds one from config values."""

from __future__ import annotations

from typing import Any

from evolm.errors import ConfigError
from evolm.tasks.base import TASKS, Example, Task, register  # noqa: F401  the registry lives in base (one home)


def find_task(name: str) -> type[Task]:
    """The task class called ``name``: a built-in task, an entry point of group ``evolm.tasks``, or a
    reference ``package.module:Class`` / ``path/to/file.py:Class`` (``evolm.plugins``)."""
    if name in TASKS:
        return TASKS[name]
    from evolm.plugins import TASK_GROUP, entry_points, is_reference, resolve

    if name not in entry_points(TASK_GROUP) and not is_reference(name):
        raise ConfigError(f"unknown task '{name}'; known tasks: {', '.join(sorted(TASKS))}, entry points of group "
                          f"{TASK_GROUP} ({', '.join(sorted(entry_points(TASK_GROUP))) or 'none installed'}), or "
                          "package.module:Class / path/to/file.py:Class")
    cls = resolve(name, TASK_GROUP, "task")
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise ConfigError(f"task '{name}' is a {type(cls).__name__}, not a subclass of evolm.tasks.Task")
    return cls


def make_task(name: str, reward="format_answer", system_prompt: str | None = None, *, reward_weights=(),
              correct: str = "", correct_threshold: float = 1.0, **params: Any) -> Task:
    """A task built from its config values: ``name`` (``find_task``), ``reward`` (a convention, or reward
    functions with ``reward_weights``), ``correct`` (a correctness function), the system prompt, its knobs."""
    cls = find_task(name)
    try:
        task = cls(reward=reward, system_prompt=system_prompt, reward_weights=reward_weights, correct=correct,
                   correct_threshold=correct_threshold, **params)
    except TypeError as e:
        raise ConfigError(f"task '{name}': {e}") from None
    if name not in TASKS:  # found by entry point or reference: the name runs record and verbs reopen it by
        task.reference = name
    return task


def task_from_config(t) -> Task:
    """The training task of a ``[task]`` section (``config.TaskConfig``)."""
    return make_task(t.name, t.reward, t.system_prompt, reward_weights=t.reward_weights, correct=t.correct,
                     correct_threshold=t.correct_threshold, **t.params)


def heldout_reward(name: str, reward: str) -> str:
    """The convention a held-out task ``name`` is built with when training uses ``reward``.

    Held-out measurements use only ``check`` (correctness, format, answers), never the scalar reward.
    A reference convention carries over to a task that reproduces it (its ``check`` is then the
    reference's judgement); any other held-out task keeps its own checker (``format_answer``).
    """
    from evolm.rewards import EXACT, is_convention, resolve_reward

    if not isinstance(reward, str) or not is_convention(reward):  # the training task's reward functions stay with it
        return "format_answer"
    reward = resolve_reward(reward)
    if reward in EXACT and (name not in TASKS or reward not in TASKS[name].exact_conventions):
        return "format_answer"
    return reward


# registration (each module @register's its Task subclasses)
from evolm.tasks import arithmetic, countdown  # noqa: E402,F401  procedural, seeded
from evolm.tasks import arc, csqa, gpqa, gsm8k, hotpotqa, math500, sst2  # noqa: E402,F401  dataset-backed
from evolm.tasks import humaneval, mbpp  # noqa: E402,F401  code, checked in evolm.sandbox
from evolm.tasks import dataset  # noqa: E402,F401  any dataset, by configuration

__all__ = ["Example", "Task", "TASKS", "find_task", "heldout_reward", "make_task", "register", "task_from_config"]
