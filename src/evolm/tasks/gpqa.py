"""GPQA (Rein et al. 2023): graduate-level, "Google-proof" four-way science questions.

GPQA is gated and its authors ask that it never be redistributed or shown in plain text online, so
evolm ships none of it and never prints its items: results name problems by their record ids only.
Point evolm at your own copy with ``path=`` (the official ``gpqa_diamond.csv`` / ``gpqa_main.csv`` /
``gpqa_extended.csv``, or the same columns as JSONL or parquet, e.g. the Hugging Face
``Idavidrein/gpqa`` files). Columns: ``Question``, ``Correct Answer``, ``Incorrect Answer 1..3``,
optionally ``Record ID``.

The four answers are shuffled per question with a generator seeded from (``shuffle_seed``, record
id), so the gold letter is spread over A-D and identical for every run with the same seed.
"""

from __future__ import annotations

import hashlib
import random
from typing import Any

from evolm.tasks.base import register
from evolm.tasks.data import row_id
from evolm.tasks.multiple_choice import MultipleChoiceTask

DATA_HELP = ("task 'gpqa' needs your own copy of the gated GPQA data (never bundled): request access at "
             "https://huggingface.co/datasets/Idavidrein/gpqa or get the zip from https://github.com/idavidrein/gpqa, "
             "then set task param path=/path/to/gpqa_diamond.csv (CSV, JSONL or parquet)")


@register
class GPQA(MultipleChoiceTask):
    name = "gpqa"
    splits = ("test",)
    hub = "Idavidrein/gpqa"
    hub_config = "gpqa_diamond"
    data_help = DATA_HELP

    def configure_task(self, shuffle_seed: int = 0, **params: Any) -> None:
        self.shuffle_seed = int(shuffle_seed)
        super().configure_task(**params)

    def _extra_param_names(self) -> str:
        return super()._extra_param_names() + ", shuffle_seed"

    def rows(self, split: str) -> list[dict]:
        if self.dataset:
            self.dataset_split = self.dataset_split or "train"  # the hub release has one split, named train
        return super().rows(split)

    def parse_choices(self, row: dict, index: int) -> tuple[str, str, list[str], int]:
        ident = row_id(row, index, ("Record ID", "id", "_id"))
        question = str(self._column(row, "Question", "question")).strip()
        right = str(self._column(row, "Correct Answer", "correct_answer")).strip()
        wrong = [str(self._column(row, f"Incorrect Answer {i}", f"incorrect_answer_{i}")).strip() for i in (1, 2, 3)]
        key = hashlib.sha256(f"{self.shuffle_seed}:{ident}".encode()).digest()
        order = list(range(4))
        random.Random(int.from_bytes(key[:8], "big")).shuffle(order)
        answers = [right] + wrong
        return ident, question, [answers[i] for i in order], order.index(0)
