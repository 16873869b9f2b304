"""Reward functions for examples/: TRL's convention, fn(prompts, completions, **columns) -> list.

Every column of the data reaches a function by name (here `answer` and `difficulty` from
examples/data/sums.jsonl); the same functions can be given to trl.GRPOTrainer(reward_funcs=[...]).
"""

import re


def _last_number(text: str):
    found = re.findall(r"-?\d+", text)
    return found[-1] if found else None


def correct_sum(prompts, completions, answer, **columns) -> list[float]:
    """1.0 when the last number in the completion is the gold answer, else 0.0."""
    return [1.0 if _last_number(c) == str(a) else 0.0 for c, a in zip(completions, answer)]


def brevity(prompts, completions, **columns) -> list[float]:
    """A small bonus for short answers: 1 at <= 8 characters, falling to 0 at 40."""
    return [max(0.0, min(1.0, (40 - len(c.strip())) / 32)) for c in completions]


def is_correct(prompts, completions, answer, **columns) -> list[bool]:
    """The judgement pass@k counts: the gold answer is the last number."""
    return [_last_number(c) == str(a) for c, a in zip(completions, answer)]
