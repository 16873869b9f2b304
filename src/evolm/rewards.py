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

import difflib
import inspect
import sys
from dataclasses import dataclass
from typing import Callable

from evolm.errors import ConfigError, UserError


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
    "qiu_exact": "Qiu et al. 2025's countdown reward (the completion, as their vLLM scripts score it)",
    "qiu_hf_exact": "Qiu et al. 2025's countdown reward on prompt + completion, as their HF-generate scripts score it",
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


# -- the user's reward functions --------------------------------------------------------------------

TRL_ONLY = ("completion_ids", "trainer_state", "log_extra", "log_metric", "environments")
"""Keyword arguments TRL 1.16's GRPOTrainer passes to a reward function besides prompts, completions and the
dataset's columns (``GRPOTrainer._calculate_rewards``), which evolm does not pass: evolm's completions are
scored as text outside a TRL trainer (ES has no ``TrainerState`` and no completions table). A function that
requires one is refused when it is loaded; one that defaults it or takes ``**kwargs`` serves both."""


class RewardError(UserError):
    """A reward or correctness function broke its contract (raised, wrong length, not a number, NaN)."""


def nothing_scored(rewards: "RewardFunctions", where: str) -> RewardError:
    """The one line that stops a run when no reward function scored any completion of ``where`` (an ES update's
    members, a GRPO step's completions): that step has no signal, and a reward that never scores gives none later."""
    several = len(rewards.refs) > 1
    return RewardError(
        f"reward function{'s' if several else ''} '{rewards.name}' returned None for every completion of {where}, so "
        "nothing was scored and training has no signal; None means the function cannot score that completion (TRL: "
        "it does not apply to the row): return 0.0 for a wrong or unparseable answer and keep None for rows the "
        "function is not about")


def is_convention(name: str) -> bool:
    """Whether ``name`` is a built-in convention (current or deprecated name), not a reward function."""
    return name in CONVENTIONS or name in DEPRECATED


def _values(fn_name: str, out, n: int, kind: str) -> list:
    """``out`` checked: a sequence of ``n`` values of ``kind`` (float: finite numbers or None; bool: booleans)."""
    if hasattr(out, "tolist") and not isinstance(out, (list, tuple)):  # numpy arrays, torch tensors
        out = out.tolist()
    if not isinstance(out, (list, tuple)):
        raise RewardError(f"{fn_name} returned {type(out).__name__}, not a list; return one {kind} per completion "
                          "(TRL's reward_funcs convention)")
    if len(out) != n:
        raise RewardError(f"{fn_name} returned {len(out)} values for {n} completions; return one per completion")
    values = []
    for i, v in enumerate(out):
        if hasattr(v, "item") and not isinstance(v, (bool, int, float)):
            v = v.item()
        if kind == "bool":
            if not isinstance(v, (bool, int)) or v not in (0, 1):
                raise RewardError(f"{fn_name} returned {v!r} at position {i}; a correctness function returns booleans")
            values.append(bool(v))
            continue
        if v is None:
            values.append(None)
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RewardError(f"{fn_name} returned {v!r} at position {i}; return a number (or None where it does not apply)")
        if v != v or v in (float("inf"), float("-inf")):
            raise RewardError(f"{fn_name} returned {v} at position {i}; rewards must be finite (None where it does not apply)")
        values.append(float(v))
    return values


def _required(fn) -> list[str]:
    """The parameters ``fn`` cannot be called without (no default, passable by name)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.default is inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


class RewardFunctions:
    """Reward functions in TRL's convention, weighted and summed: the fitness of ES, the reward of GRPO.

    Each function is called as ``fn(prompts=[...], completions=[...], **columns) -> list[float | None]``
    with one entry per completion: ``prompts`` the prompts as the data give them (``Task.reward_prompt``:
    a text prompt, or a conversational row's list of messages, as TRL passes them; not the chat-rendered
    text), ``completions`` the decoded completion texts, and every column of the data by name (``answer``,
    and the example's own fields). That is the signature of TRL's ``reward_funcs`` with a standard (text)
    dataset, so one function serves both libraries; TRL's further keywords (``TRL_ONLY``) are not passed. The total is ``sum_i w_i r_i`` over the functions that gave a number (TRL's
    nansum: ``None`` means "does not apply"; a completion no function scored gets 0).

    ``correct`` (same signature, booleans) is the judgement pass@k counts; without it a task uses its
    own checker when it has one, else ``reward >= threshold``.

    Pickles as its references (Ray actors, sweeps): the functions are imported again where it is
    unpickled (``evolm.plugins``).
    """

    def __init__(self, refs, weights=(), correct: str = "", threshold: float = 1.0):
        from evolm.plugins import REWARD_GROUP, entry_points, is_reference, resolve

        self.refs = tuple(str(r) for r in refs)
        if not self.refs and not correct:
            raise ConfigError("task.reward names no reward function")
        self.weights = tuple(float(w) for w in weights) if weights else (1.0,) * len(self.refs)
        if len(self.weights) != len(self.refs):
            raise ConfigError(f"task.reward_weights has {len(self.weights)} weights for {len(self.refs)} reward functions; "
                              "give one per function (or none: all 1)")
        self.correct_ref = str(correct or "")
        self.threshold = float(threshold)
        installed = entry_points(REWARD_GROUP)
        for r in self.refs + ((self.correct_ref,) if self.correct_ref else ()):
            if not is_reference(r) and r not in installed:
                close = difflib.get_close_matches(r, [*installed, *CONVENTIONS], n=1)
                raise ConfigError(f"task.reward must be one of {list(CONVENTIONS)} or reward functions (an entry point of "
                                  f"group {REWARD_GROUP}, package.module:function or path/to/file.py:function) (got '{r}'; "
                                  f"installed reward entry points: {', '.join(sorted(installed)) or 'none'})"
                                  + (f"; did you mean '{close[0]}'?" if close else ""))
        self.functions = [self._callable(resolve(r, REWARD_GROUP, "reward function"), r) for r in self.refs]
        self.correct_fn = self._callable(resolve(self.correct_ref, REWARD_GROUP, "correctness function"),
                                         self.correct_ref) if self.correct_ref else None

    @staticmethod
    def _callable(obj, ref: str):
        if not callable(obj):
            raise ConfigError(f"'{ref}' is a {type(obj).__name__}, not a function fn(prompts, completions, **columns)")
        required = [name for name in _required(obj) if name in TRL_ONLY]
        if required:
            raise ConfigError(f"reward function '{ref}' requires {', '.join(required)}, which TRL's GRPOTrainer passes and "
                              "evolm does not (evolm passes prompts, completions and the data columns); give "
                              f"{'it a default' if len(required) == 1 else 'them defaults'} ({required[0]}=None) or "
                              "take **kwargs")
        return obj

    @property
    def name(self) -> str:
        """The run's name for its reward: the reference, or the references joined by ``+``."""
        return "+".join(self.refs)

    def __getstate__(self):
        return {"refs": self.refs, "weights": self.weights, "correct": self.correct_ref, "threshold": self.threshold}

    def __setstate__(self, state):
        self.__init__(state["refs"], state["weights"], state["correct"], state["threshold"])

    def _call(self, fn, ref: str, prompts: list[str], completions: list[str], columns: dict[str, list], kind: str) -> list:
        missing = [name for name in _required(fn) if name not in columns and name not in ("prompts", "completions")]
        if missing:
            plural = "s" if len(missing) > 1 else ""
            raise RewardError(f"reward function '{ref}' needs the column{plural} {', '.join(repr(m) for m in missing)}, "
                              f"which the data do not have (columns: {', '.join(sorted(columns)) or 'none'}); rename a "
                              "column (task.params), or give the parameter a default")
        try:
            out = fn(prompts=list(prompts), completions=list(completions), **columns)
        except RewardError:
            raise
        except Exception as e:  # noqa: BLE001  (the user's code may raise anything)
            text = (str(e).strip().splitlines() or [""])[0]
            raise RewardError(f"reward function '{ref}' raised {type(e).__name__}: {text}") from e
        return _values(f"reward function '{ref}'", out, len(completions), kind)

    def rewards(self, prompts: list[str], completions: list[str], columns: dict[str, list],
                unscored: float | None = 0.0) -> list[float | None]:
        """The weighted total per completion; ``unscored`` for a completion no function gave a number (0, as
        TRL's nansum; None keeps it apart, which ES uses to tell a reward that scored nothing)."""
        per_fn = [self._call(fn, ref, prompts, completions, columns, "float") for fn, ref in zip(self.functions, self.refs)]
        totals = []
        for i in range(len(completions)):
            got = [(w, values[i]) for w, values in zip(self.weights, per_fn) if values[i] is not None]
            totals.append(float(sum(w * v for w, v in got)) if got else unscored)
        return totals

    def correct(self, prompts: list[str], completions: list[str], columns: dict[str, list]) -> list[bool] | None:
        """The correctness function's judgements, or None when there is none."""
        if self.correct_fn is None:
            return None
        return self._call(self.correct_fn, self.correct_ref, prompts, completions, columns, "bool")

    def provenance(self) -> dict:
        """Where each function came from (``plugins.provenance``), for ``run.json``."""
        from evolm.plugins import provenance

        out = {"rewards": [provenance(fn, ref) for fn, ref in zip(self.functions, self.refs)], "weights": list(self.weights)}
        if self.correct_fn is not None:
            out["correct"] = provenance(self.correct_fn, self.correct_ref)
        return out
