"""Countdown: combine the given numbers with + - * / and parentheses to hit a target, each number once.

The defaults (2 or 3 numbers from 1-10, target at most 50) and the prompt were chosen by probing the
real SmolLM2-135M-Instruct (float32, 1 CPU thread, 24 new tokens, test split, seed 0). The prompt is a
system message, one worked demonstration turn (a train problem) and the question, e.g.::

    system:    Combine the numbers with + - * / to reach the target. Use each number exactly once.
    user:      Numbers: 3, 3. Target: 6.
    assistant: <answer>3 + 3</answer>
    user:      Numbers: 5, 10. Target: 15.

Measured with it (final code, 64 test problems of seed 0, of which 33 use 2 numbers): greedy
accuracy 21.9%, 21.9% tagged, 4.7% tagged and correct. An earlier version of the sampler (which drew
fewer 2-number problems once their few test problems were used up) gave greedy 10.9% on 64 (23.4%
tagged; 10.2 new tokens on average) and, sampled at temperature 1 on 32 of them, pass@1 3.9% and
pass@8 15.6% (greedy 3.1% on those 32). The model often answers ``1 + 7 = 8`` without tags, which is
why an untagged first line is still checked (format term 0). Other wordings on 48 problems: "Make T
from a, b." 4.2%; a TinyZero-style question asking for ``<answer></answer>`` tags (129 prompt tokens)
8.3% correct, 69% tagged; a demonstration reply ``3 + 3 = 6`` instead of tags 12.5% correct, 0%
tagged. (Three to four numbers, zero-shot, were reported at about 0% before; not re-measured here.)

Gemma-3-270M (base model; the same prompt as plain text opened by its BOS token, 24 new tokens, 32
test problems): greedy 12.5% with one demonstration, 15.6% with three, every first line a tagged
equation (format 100%). It then writes the next problem (it never stops), and the checker reads the
*last* ``<answer>`` block: at 24 tokens the invented problem's block is not complete yet, so its own
answer is read; longer limits on a base model would score the invented problem's answer instead.

The default space is small: 2,590 problems (159 with 2 numbers), 494 of them test (about 30 with 2
numbers), so large test draws repeat problems (see ``procedural``). ``max_number=20, max_target=100``
gives 16,854 problems (3,392 test) at a difficulty not measured here.

Design decisions:

- Knobs: ``numbers`` (how many numbers per problem, an int or a list of ints drawn uniformly per
  problem, each in 2-6), ``max_number`` (numbers are drawn from 1..max_number), ``max_target``
  (targets lie in 1..max_target).
- Every problem is solvable by construction: the numbers are combined in a random order by a random
  binary expression in which every intermediate result is a positive integer (``-`` only when the
  left side is larger, ``/`` only when it divides exactly), and the result becomes the target when it
  is within 1..max_target; otherwise the draw is repeated. That solution is kept in ``meta``.
- A problem's split key is its sorted numbers and target, so a train problem never reappears in the
  test split with its numbers shuffled.
- The model's equation is never ``eval``-ed. It is at most ``MAX_EQUATION_CHARS`` characters long, may
  contain only digits, spaces, ``+ - * / ( )`` (``×``, ``÷`` are read as ``*``, ``/``), is parsed with
  ``ast.parse(mode="eval")`` and walked by ``evaluate_equation``, which accepts only binary
  ``+ - * /`` and integer literals (no unary minus or plus, no ``**`` or ``//``, no names, calls or
  attributes), checks that the literals are exactly the given multiset of numbers before any
  arithmetic, and computes with ``fractions.Fraction``. Division by zero makes the equation invalid.
  Non-integer intermediate results are allowed (``6 / (1 / 3)`` hits 18): the check is that the
  exact value of the equation equals the target.
- ``shots`` (default 1) worked demonstrations precede the question (see ``procedural``).
- Answer extraction: the content of the last ``<answer>...</answer>`` if there is one, otherwise the
  completion's first non-empty line (later lines are ignored). A trailing period is dropped, and a
  trailing ``= N`` is allowed (``<answer>1 + 7 = 8</answer>``): then N must equal the target too.
  Nothing else is searched for, so listing several attempts earns nothing beyond the first.
- ``format_ok`` (the 0.1 term of both reward conventions): the equation is inside ``<answer>`` tags
  and is well formed (parses under the rules above), whatever numbers it uses or value it has.
  A correct untagged first line is correct with ``format_ok`` False (qiu 1.0 instead of 1.1;
  tinyzero 1.0 either way).
"""

from __future__ import annotations

import ast
import random
import re
from collections import Counter
from fractions import Fraction

from evolm.errors import ConfigError
from evolm.rewards import Verdict
from evolm.tasks import register
from evolm.tasks.base import Example
from evolm.tasks.procedural import ProceduralTask, answer_text, int_knob, reject_unknown

MAX_EQUATION_CHARS = 200
"""Longer candidate equations are rejected unparsed (a cap on parser work and on the walk's depth)."""
_EQUATION_CHARS = re.compile(r"^[0-9 +\-*/()]+$")
_BINARY_OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
               ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


class InvalidEquation(ValueError):
    """The text is not a countdown equation over the given numbers."""


def normalise_equation(text: str) -> str:
    """The candidate equation with ``×``/``÷`` replaced by ``*``/``/`` and surrounding space stripped."""
    return text.replace("×", "*").replace("÷", "/").strip()


def parse_equation(text: str) -> ast.expr:
    """The syntax tree of a well-formed equation (only + - * /, parentheses and integer literals)."""
    text = normalise_equation(text)
    if not text or len(text) > MAX_EQUATION_CHARS or not _EQUATION_CHARS.match(text):
        raise InvalidEquation("not a short expression over digits, + - * / and parentheses")
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise InvalidEquation(f"does not parse: {e}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            if type(node.op) not in _BINARY_OPS:
                raise InvalidEquation(f"operator {type(node.op).__name__} is not allowed")
        elif isinstance(node, ast.Constant):
            if type(node.value) is not int:
                raise InvalidEquation(f"literal {node.value!r} is not an integer")
        elif not isinstance(node, ast.operator):
            raise InvalidEquation(f"{type(node).__name__} is not allowed")
    return tree


def evaluate_equation(text: str, numbers: list[int]) -> Fraction:
    """The exact value of ``text`` if it uses each of ``numbers`` exactly once; else ``InvalidEquation``."""
    tree = parse_equation(text)
    used = Counter(node.value for node in ast.walk(tree) if isinstance(node, ast.Constant))
    if used != Counter(numbers):
        raise InvalidEquation(f"uses {sorted(used.elements())}, not each of {sorted(numbers)} exactly once")

    def value(node: ast.expr) -> Fraction:
        if isinstance(node, ast.Constant):
            return Fraction(node.value)
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise InvalidEquation("division by zero")
        return _BINARY_OPS[type(node.op)](left, right)

    return value(tree)


@register
class Countdown(ProceduralTask):
    name = "countdown"
    instruction = "Combine the numbers with + - * / to reach the target. Use each number exactly once."
    question_template = "Numbers: {numbers}. Target: {target}."
    """How a problem is asked; ``{numbers}`` is e.g. ``3, 5, 7`` and ``{target}`` e.g. ``22``."""

    reply_template = "<answer>{solution}</answer>"
    """The demonstration's reply."""

    def configure(self, numbers: int | list[int] = (2, 3), max_number: int = 10, max_target: int = 50,
                  shots: int = 1, **unknown) -> None:
        reject_unknown(self.name, unknown, ["numbers", "max_number", "max_target", "shots"])
        self.shots = int_knob(self.name, "shots", shots, 0, 8)
        counts = [numbers] if isinstance(numbers, int) and not isinstance(numbers, bool) else numbers
        if not isinstance(counts, (list, tuple)) or not counts:
            raise ConfigError(f"task '{self.name}': numbers must be an integer or a list of integers in [2, 6] "
                              f"(got {numbers!r})")
        self.numbers = sorted({int_knob(self.name, "numbers", n, 2, 6) for n in counts})
        self.max_number = int_knob(self.name, "max_number", max_number, 1, 10_000)
        self.max_target = int_knob(self.name, "max_target", max_target, 1, 1_000_000)

    def knobs(self) -> dict:
        return {"numbers": self.numbers, "max_number": self.max_number, "max_target": self.max_target}

    def stratum(self, rng: random.Random) -> int:
        return rng.choice(self.numbers)

    def sample(self, rng: random.Random, stratum: int) -> tuple[str, Example]:
        count = stratum
        for _ in range(10_000):
            nums = [rng.randint(1, self.max_number) for _ in range(count)]
            found = _random_solution(nums, rng)
            if found and 1 <= found[0] <= self.max_target:
                target, solution = found
                break
        else:
            raise ConfigError(f"task '{self.name}': no solvable problem found with {self.knobs()}; "
                              "raise max_target or max_number")
        key = f"{','.join(map(str, sorted(nums)))}->{target}"
        question = self.question_template.format(numbers=", ".join(map(str, nums)), target=target)
        example = Example(id=f"{self.name}:{key}", question=question, answer=target,
                          meta={"numbers": nums, "solution": solution})
        return key, example

    def demonstration_answer(self, example: Example) -> str:
        return self.reply_template.format(solution=example.meta["solution"], target=example.answer)

    def extract_answer(self, completion: str) -> str | None:
        return answer_text(completion)[0]

    def check(self, completion: str, example: Example) -> Verdict:
        return check_equation(completion, example.meta["numbers"], example.answer)


_CLAIMED_RESULT = re.compile(r"^(.*?)=\s*(-?[0-9]+)$", re.DOTALL)


def check_equation(completion: str, numbers: list[int], target: int) -> Verdict:
    """Verdict for a countdown completion (see the module docstring for what is accepted)."""
    answer, tagged = answer_text(completion)
    if answer is None or len(answer) > MAX_EQUATION_CHARS + 16:
        return Verdict(format_ok=False, correct=False, answer=answer)
    equation, claimed = answer.rstrip(". "), None
    match = _CLAIMED_RESULT.match(equation)
    if match:
        equation, claimed = match.group(1), int(match.group(2))
    try:
        parse_equation(equation)
    except InvalidEquation:
        return Verdict(format_ok=False, correct=False, answer=answer)
    try:
        value = evaluate_equation(equation, numbers)
    except InvalidEquation:  # well formed, but wrong numbers or a division by zero
        return Verdict(format_ok=tagged, correct=False, answer=answer)
    correct = value == target and (claimed is None or claimed == target)
    return Verdict(format_ok=tagged, correct=correct, answer=answer)


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, None: 3}


def _random_solution(numbers: list[int], rng: random.Random) -> tuple[int, str] | None:
    """Combine ``numbers`` by a random expression with positive-integer intermediates: (value, text).

    Returns None when a drawn step would leave the positive integers (the caller draws again).
    Parentheses are written only where precedence needs them.
    """
    items = [(n, str(n), None) for n in numbers]  # (value, text, top-level operator)
    while len(items) > 1:
        i, j = rng.sample(range(len(items)), 2)
        (a, ta, opa), (b, tb, opb) = items[i], items[j]
        op = rng.choice("+-*/")
        if op == "-" and a <= b or op == "/" and a % b:
            return None
        value = {"+": a + b, "-": a - b, "*": a * b, "/": a // b}[op]
        if _PRECEDENCE[opa] < _PRECEDENCE[op]:
            ta = f"({ta})"
        if _PRECEDENCE[opb] < _PRECEDENCE[op] or _PRECEDENCE[opb] == _PRECEDENCE[op] and op in "-/":
            tb = f"({tb})"
        items = [item for k, item in enumerate(items) if k not in (i, j)] + [(value, f"{ta} {op} {tb}", op)]
    return items[0][0], items[0][1]
