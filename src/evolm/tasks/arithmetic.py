"""Arithmetic: integer expressions such as ``What is 47 + 85?`` with an integer answer.

The default prompt was chosen by probing the real SmolLM2-135M-Instruct (float32, 1 CPU thread, 24
new tokens, test split, seed 0). It is a system message, one worked demonstration turn (a train
problem drawn with the task's knobs) and the question, e.g.::

    system:    You are a calculator.
    user:      What is 19 + 82?
    assistant: 19 + 82 = 101
    user:      What is 40 + 41?

With it the model answers ``A + B = C`` at once and stops (12.5 new tokens on average): greedy
accuracy 20.3% on 64 two-digit additions (format 100%); sampled at temperature 1 on 32 of them,
pass@1 7.8% and pass@8 31.2% (greedy 15.6% on those 32). Without the demonstration (``shots=0``) it
explains instead of answering and mostly runs past 24 tokens: 0-6% greedy over 48 problems for six
wordings ("What is A + B?" with the chat template's own system prompt 6.2%, the same with
"Answer with the number only." 0%, "A + B =" with "You are a calculator. Reply with the result only."
6.2%, "Compute A + B." 2.1%).

Gemma-3-270M (a base model: the same prompt as plain text, opened by its BOS token; 16 new tokens,
greedy, test split, seed 0) answers ``A + B = C`` on its first line and then writes the next
question (it never stops; only the first line is read). 1-digit addition: greedy 62.5% with one
demonstration (32 draws of the 23 test problems), 59.4% with three. 2-digit addition stays near the
floor for every prompt tried on 32 problems: one demonstration 6.2% (most answers repeat the
demonstration's sum), three or five 0%, a bare list of three or five ``A + B = C`` lines ending in
``A + B =`` 6.2% / 9.4%, zero-shot 0%. Without the BOS token the one-shot prompt scored 0% on 2-digit
addition. So the Gemma configs train on 1-digit addition (``configs/*-gemma.toml``).

Design decisions:

- Knobs: ``digits`` (every operand has exactly this many digits; 1 means 0-9), ``operators`` (the
  allowed operators, a string over ``+-*``, each drawn uniformly per position) and ``terms`` (number of
  operands). ``*`` binds tighter than ``+`` and ``-``, as in Python; results may be negative when
  ``-`` is allowed.
- A problem is its expression text (``"47+85"``). Which split it belongs to (see ``procedural``) is set by
  ``split_version``: 1 (the default, what every committed run used) hashes the expression text, so
  ``47+85`` and ``85+47`` are two problems that may fall in different splits (a held-out problem's
  commutative twin may be a training problem); 2 hashes the canonical form (``canonical_key``: operands of
  ``+`` and ``*`` in order), so ``a+b`` and ``b+a`` are one problem, in one split, drawn at most once per
  call while fresh problems remain. The default stays 1 because a run directory's config records only the
  knobs it set: a new default would give every earlier run other held-out and training problems on resume,
  replay or ``evolm eval --like``. Use ``split_version = 2`` for new experiments. Measured on the study's
  committed runs (``experiments/study/twins.py``, docs/REPRODUCTION.md): 2-26 of 64 held-out 2-digit sums
  had their twin among the problems a run trained on, and 17-18 of 23 one-digit sums (Gemma).
- The gold answer is computed from the operands directly, never by ``eval``.
- ``shots`` (default 1) worked demonstrations precede the question (see ``procedural``).
- Answer extraction: the text inside the last ``<answer>...</answer>`` if there is one, otherwise the
  completion's first non-empty line (later lines are ignored, so rambling that happens to mention the
  right number earns nothing). That text must state a *single* final answer in one of three forms,
  each optionally ending with one period:

  - a lone number: ``81``;
  - an arithmetic expression, one ``=`` and one number: ``40 + 41 = 81`` (the expression holds only
    digits, spaces, ``+ - * / × ÷ x``, parentheses, ``.`` and ``,``; it is not evaluated: only the
    number after ``=`` is the answer);
  - ``The answer is 81`` / ``Answer: 81`` (case-insensitive, optional "final").

  Anything else has no answer (None): no format credit, not correct. So a list of candidates
  (``79 80 81``), a hedged result (``40 + 41 = 80, 81``, ``40 + 41 = 80 = 81``), prose around a number
  (``132 is wrong, it is 131``, ``47 + 85 = 132. This is``) earn nothing. (An earlier version read the
  last number of the line and gave 1.1 to the first two.) Numbers may carry a minus sign, thousands
  commas (dropped: ``1,234``) and decimals; the answer is compared by exact value (``132.0`` = 132).
- ``format_ok`` (the 0.1 term of the lenient conventions): a single final answer was found.
- Votes (maj@k, distinct-correct) use the answer's exact value (``evolm.tasks.canonical``).
"""

from __future__ import annotations

import random
import re

from evolm.errors import ConfigError
from evolm.rewards import Verdict
from evolm.tasks.base import register
from evolm.tasks.base import Example, same_number
from evolm.tasks.canonical import canonical_number
from evolm.tasks.procedural import ProceduralTask, answer_text, int_knob, reject_unknown

OPERATORS = "+-*"


def canonical_key(key: str) -> str:
    """The canonical form of an expression key (``"85+47"`` -> ``"47+85"``): the expression as a sum of signed
    products, each product's factors in numeric order, the added products in order, then the subtracted ones.
    Two keys with the same form are one problem up to commutativity (``a+b`` and ``b+a``, ``a*b+c`` and
    ``c+b*a``); ``split_version = 2`` assigns splits by it."""
    tokens = re.findall(r"[0-9]+|[-+*]", key)
    terms: list[tuple[int, list[int]]] = []
    sign, factors = 1, [int(tokens[0])]
    for op, x in zip(tokens[1::2], tokens[2::2]):
        if op == "*":
            factors.append(int(x))
        else:
            terms.append((sign, factors))
            sign, factors = (1 if op == "+" else -1), [int(x)]
    terms.append((sign, factors))
    products = {s: sorted(tuple(sorted(f)) for sg, f in terms if sg == s) for s in (1, -1)}
    text = lambda f: "*".join(map(str, f))  # noqa: E731
    return "+".join(text(f) for f in products[1]) + "".join(f"-{text(f)}" for f in products[-1])


def evaluate(operands: list[int], operators: list[str]) -> int:
    """The value of ``operands[0] op0 operands[1] op1 ...`` with ``*`` before ``+``/``-``."""
    total, sign, product = 0, 1, operands[0]
    for op, x in zip(operators, operands[1:]):
        if op == "*":
            product *= x
        else:
            total += sign * product
            sign, product = (1 if op == "+" else -1), x
    return total + sign * product


@register
class Arithmetic(ProceduralTask):
    name = "arithmetic"
    instruction = "You are a calculator."
    question_template = "What is {expression}?"
    """How a problem is asked; ``{expression}`` is e.g. ``47 + 85``."""

    reply_template = "{expression} = {answer}"
    """The demonstration's reply."""

    def configure(self, digits: int = 2, operators: str = "+", terms: int = 2, shots: int = 1, split_version: int = 1,
                  **unknown) -> None:
        reject_unknown(self.name, unknown, ["digits", "operators", "terms", "shots", "split_version"])
        self.shots = int_knob(self.name, "shots", shots, 0, 8)
        self.split_version = int_knob(self.name, "split_version", split_version, 1, 2)
        self.digits = int_knob(self.name, "digits", digits, 1, 9)
        self.terms = int_knob(self.name, "terms", terms, 2, 8)
        if not isinstance(operators, str) or not operators or set(operators) - set(OPERATORS):
            raise ConfigError(f"task '{self.name}': operators must be a non-empty string over '{OPERATORS}' "
                              f"(got {operators!r})")
        self.operators = "".join(sorted(set(operators), key=OPERATORS.index))

    def knobs(self) -> dict:
        knobs = {"digits": self.digits, "operators": self.operators, "terms": self.terms}
        return knobs | ({"split_version": self.split_version} if self.split_version != 1 else {})

    def sample(self, rng: random.Random, stratum=None) -> tuple[str, Example]:
        lo = 0 if self.digits == 1 else 10 ** (self.digits - 1)
        operands = [rng.randint(lo, 10 ** self.digits - 1) for _ in range(self.terms)]
        ops = [rng.choice(self.operators) for _ in range(self.terms - 1)]
        key = str(operands[0]) + "".join(f"{op}{x}" for op, x in zip(ops, operands[1:]))
        shown = str(operands[0]) + "".join(f" {op} {x}" for op, x in zip(ops, operands[1:]))
        example = Example(id=f"{self.name}:{key}", question=self.question_template.format(expression=shown),
                          answer=evaluate(operands, ops),
                          meta={"operands": operands, "operators": ops, "expression": shown})
        return (canonical_key(key) if self.split_version == 2 else key), example

    def demonstration_answer(self, example: Example) -> str:
        return self.reply_template.format(expression=example.meta["expression"], answer=example.answer)

    def extract_answer(self, completion: str) -> str | None:
        return final_answer(answer_text(completion)[0])

    def check(self, completion: str, example: Example) -> Verdict:
        answer = self.extract_answer(completion)
        return Verdict(format_ok=answer is not None, correct=same_number(answer, example.answer), answer=answer)

    def canonical_answer(self, answer: str | None) -> str | None:
        return canonical_number(answer)


_NUMBER = r"-?[0-9][0-9,]*(?:\.[0-9]+)?"
_SINGLE_ANSWER = (
    re.compile(rf"^(?P<n>{_NUMBER})\.?$"),
    re.compile(rf"^[0-9\s+\-*/×÷x().,]*[0-9][0-9\s+\-*/×÷x().,]*=\s*(?P<n>{_NUMBER})\.?$"),
    re.compile(rf"^(?:the\s+)?(?:final\s+)?answer(?:\s+is\s*:?|\s*:)\s*(?P<n>{_NUMBER})\.?$", re.IGNORECASE),
)
"""The forms of a single final answer (see the module docstring); ``n`` is the answer."""


def final_answer(text: str | None) -> str | None:
    """The single final number stated by ``text`` (commas dropped), or None when it states none or several."""
    if text is None:
        return None
    text = text.strip()
    for form in _SINGLE_ANSWER:
        match = form.match(text)
        if match:
            return match.group("n").replace(",", "")
    return None
