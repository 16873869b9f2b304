"""HotpotQA (Yang et al. 2018): multi-hop questions over Wikipedia paragraphs, short-phrase answers.

No package ships HotpotQA, so the data come from the user: ``path=`` the official
``hotpot_dev_distractor_v1.json`` (a JSON list), or the same records as JSONL, CSV (``context`` as a
JSON cell) or parquet, e.g. the Hugging Face ``hotpotqa/hotpot_qa`` (``distractor``) files. Records
hold ``question``, ``answer`` and optionally ``context`` (official: ``[[title, [sentence, ...]], ...]``;
Hugging Face: ``{title: [...], sentences: [[...], ...]}``) and ``supporting_facts``.

Param ``context``: ``all`` (default; the distractor setting, every paragraph of the record in the
prompt), ``supporting`` (only the paragraphs named by the supporting facts) or ``none`` (closed book).

Extraction: the text after the last ``Answer:`` up to the end of its line, else the first non-empty
line. Correct means exact match after SQuAD normalisation (lower case, punctuation and the articles
a/an/the removed, whitespace collapsed); that normal form is also what maj@k votes on.
"""

from __future__ import annotations

import re
import string
from typing import Any

from evolm.errors import ConfigError
from evolm.rewards import Verdict
from evolm.tasks.base import register
from evolm.tasks.base import Example
from evolm.tasks.data import DatasetTask, maybe_json, row_id

DATA_HELP = ("task 'hotpotqa' needs a data file (none is bundled): download hotpot_dev_distractor_v1.json from "
             "https://hotpotqa.github.io (or the hotpotqa/hotpot_qa parquet files) and set task param path=FILE "
             "(JSON, JSONL, CSV or parquet)")
_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def extract_short_answer(completion: str) -> tuple[str | None, bool]:
    """``(answer, marked)``: the phrase after the last ``Answer:``, else the first non-empty line."""
    markers = list(_ANSWER.finditer(completion))
    if markers:
        line = completion[markers[-1].end():].strip().split("\n")[0].strip()
        return (line or None), True
    for line in completion.splitlines():
        if line.strip():
            return line.strip(), False
    return None, False


def _paragraphs(context: Any) -> list[tuple[str, list[str]]]:
    context = maybe_json(context)
    if not context:
        return []
    if isinstance(context, dict):
        return [(str(t), [str(s) for s in sents]) for t, sents in zip(context.get("title", []), context.get("sentences", []))]
    return [(str(item[0]), [str(s) for s in item[1]]) for item in context]


def _supporting_titles(facts: Any) -> set[str]:
    facts = maybe_json(facts)
    if not facts:
        return set()
    if isinstance(facts, dict):
        return {str(t) for t in facts.get("title", [])}
    return {str(f[0]) for f in facts}


@register
class HotpotQA(DatasetTask):
    name = "hotpotqa"
    splits = ("validation",)
    split_aliases = {"test": "validation"}
    hub = "hotpotqa/hotpot_qa"
    hub_config = "distractor"
    data_help = DATA_HELP
    instruction = 'Answer the question with a short phrase, as "Answer: <phrase>".'
    default_max_new_tokens = 32

    def configure_task(self, context: str = "all", **params: Any) -> None:
        if context not in ("all", "supporting", "none"):
            raise ConfigError(f"task 'hotpotqa' param context must be all, supporting or none (got '{context}')")
        self.context = context
        super().configure_task(**params)

    def _extra_param_names(self) -> str:
        return ", context"

    def parse_row(self, row: dict, index: int) -> Example:
        question = str(self._column(row, "question")).strip()
        answer = str(self._column(row, "answer")).strip()
        parts = []
        if self.context != "none":
            paragraphs = _paragraphs(row.get("context"))
            if self.context == "supporting":
                keep = _supporting_titles(row.get("supporting_facts"))
                paragraphs = [p for p in paragraphs if p[0] in keep]
            parts += [f"{title}: {' '.join(s.strip() for s in sents)}" for title, sents in paragraphs]
        parts.append(f"Question: {question}")
        meta = {k: row[k] for k in ("type", "level") if row.get(k) is not None}
        return Example(id=row_id(row, index), question="\n\n".join(parts), answer=answer, meta=meta)

    def extract_answer(self, completion: str) -> str | None:
        answer = extract_short_answer(completion)[0]
        return normalize_answer(answer) if answer is not None else None

    def check(self, completion: str, example: Example) -> Verdict:
        answer, marked = extract_short_answer(completion)
        norm = normalize_answer(answer) if answer is not None else None
        return Verdict(format_ok=marked, correct=bool(norm) and norm == normalize_answer(str(example.answer)), answer=norm)
