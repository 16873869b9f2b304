"""Countdown rewards exactly as published reward code computes them: Qiu et al. 2025 and TinyZero.

evolm's own checkers (``evolm.tasks.countdown.check_equation`` with the ``format_answer`` and
``tiered`` conventions) are lenient on purpose, for small models. The functions here return, for the
same inputs, the same numbers as the reference code, so a run with ``task.reward = "qiu_exact"``,
``"qiu_hf_exact"`` or ``"tinyzero_exact"`` optimises and reports the references' rewards. They were written from reading
the references, not copied:

- Qiu et al. 2025, "Evolution Strategies at Scale: LLM Fine-Tuning Beyond Reinforcement Learning"
  (github.com/VsonicV/es-fine-tuning-paper, ``countdown/countdown_task.py``, ``reward_function``):
  ``0.1 * format + answer``. The format term is graded on ``"<think>" + response`` (the prompt ends
  with ``<think>``): 1.0 when the whole text matches ``^<think>.*?</think>\\n<answer>.*?</answer>$``
  (dot matches newline; ``$`` also matches before one final newline), else 0.1 if it contains a
  ``<think>...</think>`` block plus 0.5 if it contains an ``<answer>...</answer>`` block. The answer
  term is 1.0 when the *last* ``<answer>`` block's content (unstripped, may span lines) is non-empty,
  consists of ``[0-9+\\-*/() ]`` only (a final newline is tolerated by ``$``), its ``\\d+`` runs are
  exactly the given numbers (sorted-list equality), and Python's ``eval`` of it lies within 1e-5 of the
  target (``abs(float(value) - float(target)) < 1e-5``); any exception gives 0. Totals: 0, 0.01,
  0.05, 0.06, 0.1, and 1.05, 1.06, 1.1 when the answer is right (a right answer needs an answer
  block, so its format term is at least 0.5). The response is the generated text; when it contains
  ``"assistant:"`` only the text after the last occurrence, stripped, is scored (what Qiu et al.'s
  training and evaluation scripts do before calling ``reward_function``).
- Qiu et al.'s HF-generate scripts (``countdown/es_fine-tuning_countdown.py`` and ``countdown/eval_countdown.py``)
  call the same ``reward_function`` on a different text: ``model.generate`` returns prompt + completion and they
  decode all of it (``tokenizer.decode(outputs[i], skip_special_tokens=True)``), then apply the same
  ``"assistant:"`` split, which their ``countdown.json`` prompts never trigger. So the prompt's own
  ``<think> </think>`` and its example ``<answer> (1 + 2) / 3 </answer>`` are scored too: every row of
  ``countdown.json`` earns 0.1 x (0.1 + 0.5) = 0.06 before the model writes anything, a completion with an answer
  block and no think block 1.06 instead of 1.05, and an answer-less completion whose prompt holds the example is
  scored on the example (the right answer only for the numbers 1, 2, 3 and target 1; no row of countdown.json).
  ``qiu_hf_score`` is that: ``qiu_score`` of prompt + completion. Their vLLM scripts
  (``es_fine-tuning_countdown_accl.py``, ``eval_countdown_vllm.py``) score the completion only: ``qiu_score``.
- TinyZero (github.com/Jiayi-Pan/TinyZero, ``verl/utils/reward_score/countdown.py``,
  ``compute_score`` with ``format_score=0.1, score=1.0``), applied to prompt + response as TinyZero
  decodes them: split at the first ``"Assistant:"`` (else the first ``"<|im_start|>assistant"``; with
  neither the score is 0), keep the last line (text after the last ``\\n``), take the last
  ``<answer>(.*?)</answer>`` on it, stripped. No answer: 0. An answer whose ``\\d+`` runs are not
  exactly the numbers, that contains a character outside ``[\\d+\\-*/().\\s]``, that ``eval`` rejects,
  or whose value misses the target (``abs(value - target) < 1e-5`` fails): 0.1. Else 1.0.

Design decisions:

- Model text is never ``eval``-ed. ``python_arithmetic`` parses it with ``ast.parse`` (the parser
  ``eval`` itself uses, after stripping the leading spaces and tabs that ``eval`` strips, so it accepts
  and rejects exactly the same strings: ``03`` is a syntax error, ``00`` is 0, ``(3)(5)`` parses but
  fails when called) and walks the tree iteratively, applying Python's own operators to Python
  numbers. So values, types and errors are ``eval``'s: ``/`` is true division in floats, ``//`` and
  ``**`` are accepted because the references' character sets allow them, unary minus is accepted
  (``7 - -3*5`` is 22), ``3.`` and ``.5`` are floats in TinyZero's character set, a negative base to a
  fractional power is complex (Qiu: ``float()`` of it fails, 0; TinyZero: compared by ``abs``), and a
  division by zero or a float overflow is a failed evaluation.
- The one departure: an integer above 2^65,536 (only reachable with ``**``) is not computed, and the
  evaluation counts as failed. Python would compute it (``9**9**9`` takes minutes and gigabytes);
  the reference can only score such a value as right if a later operation cancels it exactly, which
  needs the same huge power twice. Calls, tuples and ``...`` make ``eval`` raise or return a non-number
  in both references, which scores the same as a failed evaluation; they are reported as such.
- Everything is a pure function of text, numbers and target, returning the reference's reward and
  its parts (``ReferenceScore``), so the task's ``Verdict`` (format, correctness, extracted answer)
  and the scalar reward come from one computation.
"""

from __future__ import annotations

import ast
import math
import operator
import re
import warnings
from dataclasses import dataclass
from typing import Any, Sequence

TOLERANCE = 1e-5
"""Both references accept a value within this absolute distance of the target."""
MAX_INT_BITS = 1 << 16
"""Integers larger than 2**MAX_INT_BITS are not computed (see the module docstring)."""

QIU_ANSWER_CHARS = re.compile(r"^[0-9+\-*/() ]+$")
QIU_ANSWER_BLOCKS = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
QIU_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.DOTALL)
QIU_FULL_LAYOUT = re.compile(r"^<think>.*?</think>\n<answer>.*?</answer>$", re.DOTALL)
QIU_RESPONSE_MARKER = "assistant:"
"""Qiu et al.'s scripts score only the text after the last occurrence of this (stripped) when present."""

TINYZERO_MARKERS = ("Assistant:", "<|im_start|>assistant")
"""TinyZero reads the answer after the first occurrence of the first of these found in prompt + response."""
TINYZERO_ANSWER = re.compile(r"<answer>(.*?)</answer>")
TINYZERO_ANSWER_CHARS = re.compile(r"^[\d+\-*/().\s]+$")
DIGIT_RUNS = re.compile(r"\d+")

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


class EvalFailure(ValueError):
    """``eval`` would raise (or return something that is not a number) for this text."""


def parse_like_eval(text: str) -> ast.expr:
    """The expression tree ``eval(text)`` would compile, or ``EvalFailure`` where ``eval`` raises a syntax error."""
    source = text.lstrip(" \t")  # eval strips leading spaces and tabs; ast.parse would call them an indent
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "'int' object is not callable" and similar SyntaxWarnings
            return ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise EvalFailure(f"does not parse: {type(e).__name__}") from None


def _apply(op: ast.AST, *args: Any) -> Any:
    if isinstance(op, ast.Pow):
        base, exponent = args
        if (type(base) is int and type(exponent) is int and exponent > 0 and abs(base) > 1
                and exponent * math.log2(abs(base)) > MAX_INT_BITS):
            raise EvalFailure(f"integer power above 2**{MAX_INT_BITS}")
    try:
        value = (_UNARY[type(op)](*args) if len(args) == 1 else _BINARY[type(op)](*args))
    except (ArithmeticError, TypeError, ValueError) as e:  # ZeroDivisionError, OverflowError, ...
        raise EvalFailure(f"{type(e).__name__}: {e}") from None
    if type(value) is int and value.bit_length() > MAX_INT_BITS:
        raise EvalFailure(f"integer above 2**{MAX_INT_BITS}")
    return value


def evaluate_tree(tree: ast.expr) -> int | float | complex:
    """The value ``eval`` gives the expression ``tree`` (numbers, unary and binary arithmetic only).

    Walked with an explicit stack, so a deeply nested tree cannot exhaust Python's recursion limit.
    """
    stack: list[tuple[ast.AST, bool]] = [(tree, False)]
    values: list[Any] = []
    while stack:
        node, operands_done = stack.pop()
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                raise EvalFailure(f"{node.value!r} is not a number")
            values.append(node.value)
        elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            if operands_done:
                values.append(_apply(node.op, values.pop()))
            else:
                stack += [(node, True), (node.operand, False)]
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            if operands_done:
                right = values.pop()
                values.append(_apply(node.op, values.pop(), right))
            else:
                stack += [(node, True), (node.right, False), (node.left, False)]
        else:
            raise EvalFailure(f"{type(node).__name__} is not arithmetic")
    return values[0]


def python_arithmetic(text: str) -> int | float | complex:
    """What ``eval(text, {"__builtins__": None}, {})`` returns for an arithmetic string; ``EvalFailure`` where it raises.

    Meant for strings that passed one of the references' character checks (digits, ``+ - * / ( )``,
    spaces, and for TinyZero ``.`` and whitespace); see the module docstring for the one departure.
    """
    return evaluate_tree(parse_like_eval(text))


def uses_exactly(text: str, numbers: Sequence[int]) -> bool:
    """Both references' number check: the ``\\d+`` runs of ``text``, as integers, sorted, equal the sorted numbers."""
    try:
        return sorted(int(n) for n in DIGIT_RUNS.findall(text)) == sorted(numbers)
    except ValueError:
        return False


@dataclass(frozen=True)
class ReferenceScore:
    """One completion scored by a reference: the total and its parts."""

    reward: float
    """The reference's total reward."""
    format_reward: float
    """The format part (Qiu: 0, 0.1, 0.5, 0.6 or 1.0 before the 0.1 weight; TinyZero: 0.1 when an answer was found, else 0)."""
    answer_reward: float
    """The answer part (1.0 when the answer is right, else 0)."""
    answer: str | None
    """The answer text the reference read (Qiu: the last block's raw content; TinyZero: stripped), None when none."""

    @property
    def correct(self) -> bool:
        return self.answer_reward == 1.0


# -- Qiu et al. 2025 ---------------------------------------------------------------------------------


def qiu_response(generated: str) -> str:
    """The text Qiu et al.'s scripts score: after the last ``"assistant:"`` (stripped) when there is one."""
    if QIU_RESPONSE_MARKER in generated:
        return generated.split(QIU_RESPONSE_MARKER)[-1].strip()
    return generated


def qiu_format_reward(response: str) -> float:
    """The graded format term, computed on ``"<think>" + response``: 1.0, or 0.1 x think block + 0.5 x answer block."""
    text = "<think>" + response
    if QIU_FULL_LAYOUT.match(text):
        return 1.0
    reward = 0.0
    if QIU_THINK_BLOCK.search(text):
        reward += 0.1
    if QIU_ANSWER_BLOCKS.search(text):
        reward += 0.5
    return reward


def qiu_answer(response: str, numbers: Sequence[int], target: int | float | str | None) -> tuple[float, str | None]:
    """The answer term (1.0 or 0.0) and the last ``<answer>`` block's raw content (None when there is none).

    ``target`` None (what their evaluation passes for a target text that is not all digits) gives 0.
    """
    blocks = QIU_ANSWER_BLOCKS.findall(response)
    if not blocks:
        return 0.0, None
    content = blocks[-1]
    if not content or not QIU_ANSWER_CHARS.match(content) or not uses_exactly(content, numbers):
        return 0.0, content
    try:
        value = python_arithmetic(content)
        hit = abs(float(value) - float(target)) < TOLERANCE
    except (EvalFailure, TypeError, ValueError, OverflowError):
        return 0.0, content
    return (1.0 if hit else 0.0), content


def qiu_score(generated: str, numbers: Sequence[int], target: int | float | str | None) -> ReferenceScore:
    """Qiu et al.'s countdown reward of one generated text: ``0.1 * format + answer``."""
    response = qiu_response(generated)
    format_reward = qiu_format_reward(response)
    answer_reward, answer = qiu_answer(response, numbers, target)
    return ReferenceScore(reward=format_reward * 0.1 + answer_reward, format_reward=format_reward,
                          answer_reward=answer_reward, answer=answer)


def qiu_hf_score(prompt: str, completion: str, numbers: Sequence[int],
                 target: int | float | str | None) -> ReferenceScore:
    """Qiu et al.'s countdown reward as their HF-generate scripts compute it: ``reward_function`` of the decoded
    prompt + completion (special tokens skipped), after the same ``"assistant:"`` split (module docstring)."""
    return qiu_score(prompt + completion, numbers, target)


# -- TinyZero ----------------------------------------------------------------------------------------


def tinyzero_answer(solution: str) -> str | None:
    """The equation TinyZero reads from prompt + response (None: no assistant marker or no answer on the last line)."""
    for marker in TINYZERO_MARKERS:
        if marker in solution:
            solution = solution.split(marker, 1)[1]
            break
    else:
        return None
    found = TINYZERO_ANSWER.findall(solution.split("\n")[-1])
    return found[-1].strip() if found else None


def tinyzero_score(solution: str, numbers: Sequence[int], target: int | float,
                   format_score: float = 0.1, score: float = 1.0) -> ReferenceScore:
    """TinyZero's ``compute_score`` of ``solution`` = prompt + response: 0, ``format_score`` or ``score``."""
    equation = tinyzero_answer(solution)
    if equation is None:
        return ReferenceScore(reward=0.0, format_reward=0.0, answer_reward=0.0, answer=None)
    wrong = ReferenceScore(reward=format_score, format_reward=format_score, answer_reward=0.0, answer=equation)
    if not uses_exactly(equation, numbers) or not TINYZERO_ANSWER_CHARS.match(equation):
        return wrong
    try:
        value = python_arithmetic(equation)
        hit = abs(value - target) < TOLERANCE
    except (EvalFailure, TypeError, ValueError, OverflowError):
        return wrong
    if not hit:
        return wrong
    return ReferenceScore(reward=score, format_reward=format_score, answer_reward=1.0, answer=equation)
