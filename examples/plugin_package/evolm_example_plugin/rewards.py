"""Reward functions in TRL's convention, ``fn(prompts, completions, **columns) -> list``: the same
function can be handed to evolm (``task.reward = "vowel_share"``) and to ``trl.GRPOTrainer(reward_funcs=[...])``."""


def _share(text: str) -> float:
    letters = [c for c in text.lower() if c.isalpha()]
    return sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0


def vowel_share(prompts, completions, **columns) -> list[float]:
    """The share of vowels among a completion's letters (0 for one without letters)."""
    return [_share(c if isinstance(c, str) else c[-1]["content"]) for c in completions]


def mostly_vowels(prompts, completions, **columns) -> list[bool]:
    """Correct when at least ``columns["target"]`` of the letters are vowels (default 0.5)."""
    targets = columns.get("target") or [0.5] * len(completions)
    return [_share(c) >= (t if t is not None else 0.5) for c, t in zip(completions, targets)]
