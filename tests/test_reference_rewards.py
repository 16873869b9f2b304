"""The reference-exact countdown rewards (qiu_exact, tinyzero_exact) against the published rules.

Two kinds of check:

- a table of hand-written responses with the totals the published rules give them, worked out by
  hand from Qiu et al.'s ``countdown/countdown_task.py`` and TinyZero's
  ``verl/utils/reward_score/countdown.py`` (the rules are restated in ``evolm.reference_rewards``);
- a differential check on generated strings against an oracle written here from the same rules,
  which, unlike evolm, calls Python's ``eval`` (on strings this test generates over the references'
  character sets, never on model text).
"""

from __future__ import annotations

import random
import re
import warnings

import pytest

from evolm.reference_rewards import (MAX_INT_BITS, python_arithmetic, EvalFailure, qiu_score, tinyzero_answer,
                                     tinyzero_score)
from evolm.tasks import make_task
from evolm.tasks.base import Example

N, T = [3, 5, 7], 22   # 3 * 5 + 7 = 22
CHATML = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Using the numbers [3, 5, 7], "
          "create an equation that equals 22.<|im_end|>\n<|im_start|>assistant\nLet me solve this step by step.\n<think>")
BASE = ("A conversation between User and Assistant.\nUser: Using the numbers [3, 5, 7], create an equation that equals 22."
        "\nAssistant: Let me solve this step by step.\n<think>")
OK = "I multiply first.</think>\n"   # closes the prompt's <think> and starts the answer line: the full layout


# -- Qiu et al.: 0.1 x format(<think> + response) + answer ----------------------------------------------

QIU_CASES = [
    # (response, numbers, target, total)                                  what the case covers
    (OK + "<answer>3 * 5 + 7</answer>", N, T, 1.1),                       # full layout, right answer
    (OK + "<answer>3 * 5 + 7</answer>\n", N, T, 1.1),                     # $ matches before one final newline
    (OK + "<answer>3 * 5 + 7</answer>\n\n", N, T, 1.06),                  # ... not before two: think 0.1 + answer 0.5
    ("x</think><answer>3*5+7</answer>", N, T, 1.06),                      # no newline between the blocks
    ("<answer>3*5+7</answer>", N, T, 1.05),                               # no </think>: answer block only
    (OK + "<answer>3*5+7</answer> Done.", N, T, 1.06),                    # text after the answer
    ("a\nb\nc</think>\n<answer>3*5+7</answer>", N, T, 1.1),               # multi-line reasoning
    ("<think>x</think>\n<answer>3*5+7</answer>", N, T, 1.1),              # the model repeats <think>
    ("<answer>3*5+7</answer></think>", N, T, 1.06),                       # blocks in the wrong order
    ("3 * 5 + 7 = 22", N, T, 0.0),                                        # untagged correct line: nothing
    ("x</think>\n3 * 5 + 7", N, T, 0.01),                                 # think block only
    (OK + "<answer>3+5+7</answer> <answer>3*5+7</answer>", N, T, 1.1),    # the last answer wins ...
    (OK + "<answer>3*5+7</answer><answer>3+5+7</answer>", N, T, 0.1),     # ... also when it is wrong
    (OK + "<answer>3*5+7+3-3</answer>", N, T, 0.1),                       # a number reused
    (OK + "<answer>3*5</answer>", N, T, 0.1),                             # a number unused
    (OK + "<answer>3*5+8</answer>", N, T, 0.1),                           # a number not given
    (OK + "<answer>three times five plus seven</answer>", N, T, 0.1),     # letters
    (OK + "<answer></answer>", N, T, 0.1),                                # empty tags: layout yes, answer no
    (OK + "<answer>7 - -3*5</answer>", N, T, 1.1),                        # unary minus, as eval reads it
    (OK + "<answer>-3*-5+7</answer>", N, T, 1.1),
    (OK + "<answer>6 / (1 / 3)</answer>", [1, 3, 6], 18, 1.1),            # fractions: float within 1e-5
    (OK + "<answer>7 / (5 - 3)</answer>", N, T, 0.1),                     # 3.5, not the target
    (OK + "<answer>999999 / 999998</answer>", [999998, 999999], 1, 1.1),  # 1.000001 is within 1e-5 of 1
    (OK + "<answer>3*5+7 = 22</answer>", N, T, 0.1),                      # '=' is not allowed
    (OK + "<ANSWER>3*5+7</ANSWER>", N, T, 0.01),                          # tags are case-sensitive
    (OK + "<answer>3 × 5 + 7</answer>", N, T, 0.1),                       # × is not allowed
    (OK + "<answer>6 ÷ (1 ÷ 3)</answer>", [1, 3, 6], 18, 0.1),            # ÷ is not allowed
    (OK + "<answer>3*5+7.</answer>", N, T, 0.1),                          # a period is not allowed
    (OK + "<answer>  3 * 5 + 7  </answer>", N, T, 1.1),                   # spaces around: eval strips the leading ones
    (OK + "<answer>\n3*5+7\n</answer>", N, T, 0.1),                       # a leading newline fails the character check
    (OK + "<answer>3*5+7\n</answer>", N, T, 1.1),                         # a final newline passes it ($)
    (OK + "<answer>3*5\t+7</answer>", N, T, 0.1),                         # a tab fails it
    (OK + "<answer>03*5+7</answer>", N, T, 0.1),                          # 03 is a syntax error for eval
    (OK + "<answer>2**3</answer>", [2, 3], 8, 1.1),                       # ** passes the character check
    (OK + "<answer>7//2</answer>", [2, 7], 3, 1.1),                       # so does //
    (OK + "<answer>7/(5-5)</answer>", [5, 5, 7], 1, 0.1),                 # division by zero
    (OK + "<answer>(3)(5)+7</answer>", N, T, 0.1),                        # a call: eval raises
    (OK + "<answer>1.5*2</answer>", [1, 2, 5], 3, 0.1),                   # '.' is not allowed
    (OK + "<answer>٣*5+7</answer>", N, T, 0.1),                           # non-ASCII digits are not allowed
    ("noise assistant: " + OK + "<answer>3*5+7</answer>", N, T, 1.1),     # scored after the last 'assistant:'
    (OK + "<answer>3*5+7</answer> assistant: nothing", N, T, 0.0),
]


@pytest.mark.parametrize("response,numbers,target,total", QIU_CASES)
def test_qiu_exact_table(response, numbers, target, total):
    score = qiu_score(response, numbers, target)
    assert score.reward == pytest.approx(total, abs=1e-12)
    example = Example("t", "", target, {"numbers": numbers})
    task = make_task("countdown", reward="qiu_exact")
    assert task.reward(response, example) == score.reward
    verdict = task.check(response, example)
    assert verdict.correct == (total >= 1.0) and verdict.format_ok == (score.format_reward == 1.0)


def test_qiu_target_may_be_the_file_string():
    assert qiu_score(OK + "<answer>3*5+7</answer>", N, "22").reward == pytest.approx(1.1)


def test_qiu_totals_are_bit_identical_to_the_reference_arithmetic():
    # the reference adds 0.1 and 0.5 and multiplies by 0.1: 0.6 * 0.1 is 0.06000000000000001 in floats
    assert qiu_score("x</think><answer>1</answer>", [2], 2).reward == (0.0 + 0.1 + 0.5) * 0.1


# -- TinyZero: 0 / 0.1 / 1.0 on prompt + response --------------------------------------------------------

TINYZERO_CASES = [
    # (prompt, response, numbers, target, total)
    (CHATML, "x</think>\n<answer>3*5+7</answer>", N, T, 1.0),
    (BASE, "x</think>\n<answer>3*5+7</answer>", N, T, 1.0),               # base template: 'Assistant:'
    (CHATML, "x</think> <answer>3*5+7</answer>", N, T, 1.0),              # one line with the prompt's <think>
    (CHATML, "x</think>\n<answer>3*5+7</answer>\n", N, T, 0.0),           # only the last line is read: empty
    (CHATML, "<answer>3*5+7</answer>\nDone.", N, T, 0.0),
    (CHATML, "<answer>3+5+7</answer> <answer>3*5+7</answer>", N, T, 1.0),  # the last answer wins
    (CHATML, "<answer>3*5+7</answer> <answer>3+5+7</answer>", N, T, 0.1),
    (CHATML, "<answer>3*5+7+3-3</answer>", N, T, 0.1),                    # reused number
    (CHATML, "<answer>3*5</answer>", N, T, 0.1),                          # unused number
    (CHATML, "<answer>three</answer>", N, T, 0.1),                        # letters
    (CHATML, "<answer></answer>", N, T, 0.1),                             # empty tags still earn the format score
    (CHATML, "<answer>7 - -3*5</answer>", N, T, 1.0),                     # unary minus
    (CHATML, "<answer>6 / (1 / 3)</answer>", [1, 3, 6], 18, 1.0),         # fractions
    (CHATML, "<answer>999999 / 999998</answer>", [999998, 999999], 1, 1.0),  # within 1e-5 of the target
    (CHATML, "<answer>99999 / 99998</answer>", [99998, 99999], 1, 0.1),   # 1.00001: not within 1e-5
    (CHATML, "3*5+7", N, T, 0.0),                                         # untagged
    (CHATML, "<answer>3*5+7 = 22</answer>", N, T, 0.1),                   # 22 counts as a number used
    (CHATML, "<answer>3*5+7=</answer>", N, T, 0.1),                       # '=' fails the character check
    (CHATML, "<ANSWER>3*5+7</ANSWER>", N, T, 0.0),                        # case-sensitive tags
    (CHATML, "<answer>3 × 5 + 7</answer>", N, T, 0.1),                    # × fails the character check
    (CHATML, "<answer>3*5+7.</answer>", N, T, 1.0),                       # '7.' is the float 7.0
    (CHATML, "<answer>  3 * 5 + 7  </answer>", N, T, 1.0),                # stripped
    (CHATML, "<answer>3*5\t+7</answer>", N, T, 1.0),                      # a tab is whitespace
    (CHATML, "<answer>1.5 * 2</answer>", [1, 2, 5], 3, 1.0),              # decimals use digits 1 and 5
    (CHATML, "<answer>2**3</answer>", [2, 3], 8, 1.0),
    (CHATML, "<answer>03*5+7</answer>", N, T, 0.1),                       # syntax error in eval
    (CHATML, "<answer>7/(5-5)</answer>", [5, 5, 7], 1, 0.1),              # division by zero
    (CHATML, "<answer>(3)(5)+7</answer>", N, T, 0.1),                     # a call
    (CHATML, "<answer>٣*5+7</answer>", N, T, 0.1),                        # \d matches ٣, eval does not
    ("Numbers 3 5 7, target 22.\n", "<answer>3*5+7</answer>", N, T, 0.0),  # no assistant marker anywhere
    ("Numbers 3 5 7, target 22.\n", "Assistant: <answer>3*5+7</answer>", N, T, 1.0),  # a marker in the response
]


@pytest.mark.parametrize("prompt,response,numbers,target,total", TINYZERO_CASES)
def test_tinyzero_exact_table(prompt, response, numbers, target, total):
    assert tinyzero_score(prompt + response, numbers, target).reward == total


def test_tinyzero_exact_task_reads_a_file_prompt_or_assumes_a_chatml_prompt():
    task = make_task("countdown", reward="tinyzero_exact")
    with_prompt = Example("t", BASE, T, {"numbers": N, "prompt": BASE})
    rendered = Example("t", "Numbers: 3, 5, 7. Target: 22.", T, {"numbers": N})
    for prompt, response, numbers, target, total in [c for c in TINYZERO_CASES if c[0] in (CHATML, BASE)]:
        assert task.reward(response, Example("t", "", target, {"numbers": numbers})) == total
    assert task.reward("<answer>3*5+7</answer>", with_prompt) == 1.0
    assert task.reward("x\n<answer>3*5+7</answer>", rendered) == 1.0
    assert task.reward("<answer>3*5+7</answer>\n", rendered) == 0.0
    assert task.check("<answer>3 * 5+7 </answer>", rendered).answer == "3 * 5+7"
    assert task.extract_answer("junk\n<answer> 3*5+7 </answer>") == "3*5+7"


def test_huge_powers_are_not_computed_and_score_as_the_reference_would():
    # Python would compute 99**99**99 for ages; the reference then scores the (wrong) value 0.1 / 0
    assert tinyzero_score(CHATML + "<answer>99**99**99</answer>", [99, 99, 99], 1).reward == 0.1
    assert qiu_score(OK + "<answer>99**99**99</answer>", [99, 99, 99], 1).reward == pytest.approx(0.1)
    with pytest.raises(EvalFailure, match="power"):
        python_arithmetic("9**9**9")
    assert python_arithmetic("2**100") == 2 ** 100 and python_arithmetic("(-8)**0.5") == (-8) ** 0.5
    assert MAX_INT_BITS == 65536


# -- the differential check: generated strings against an oracle that uses eval ---------------------------

def _oracle_eval(text: str):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return eval(text, {"__builtins__": None}, {})  # noqa: S307  (test-generated strings only)
    except Exception:  # noqa: BLE001
        raise ValueError from None


def _oracle_qiu(response: str, numbers, target) -> float:
    if "assistant:" in response:
        response = response.split("assistant:")[-1].strip()
    text = "<think>" + response
    if re.match(r"^<think>.*?</think>\n<answer>.*?</answer>$", text, re.DOTALL):
        fmt = 1.0
    else:
        fmt = 0.0
        if re.search(r"<think>.*?</think>", text, re.DOTALL):
            fmt += 0.1
        if re.search(r"<answer>.*?</answer>", text, re.DOTALL):
            fmt += 0.5
    answer = 0.0
    blocks = re.findall(r"<answer>(.*?)</answer>", response, re.DOTALL)
    if blocks and blocks[-1] and re.match(r"^[0-9+\-*/() ]+$", blocks[-1]) \
            and sorted(int(n) for n in re.findall(r"\d+", blocks[-1])) == sorted(numbers):
        try:
            answer = 1.0 if abs(float(_oracle_eval(blocks[-1])) - float(target)) < 1e-5 else 0.0
        except (ValueError, TypeError, OverflowError):
            answer = 0.0
    return fmt * 0.1 + answer


def _oracle_tinyzero(solution: str, numbers, target) -> float:
    if "Assistant:" in solution:
        solution = solution.split("Assistant:", 1)[1]
    elif "<|im_start|>assistant" in solution:
        solution = solution.split("<|im_start|>assistant", 1)[1]
    else:
        return 0.0
    found = re.findall(r"<answer>(.*?)</answer>", solution.split("\n")[-1])
    if not found:
        return 0.0
    equation = found[-1].strip()
    if sorted(int(n) for n in re.findall(r"\d+", equation)) != sorted(numbers):
        return 0.1
    if not re.match(r"^[\d+\-*/().\s]+$", equation):
        return 0.1
    try:
        return 1.0 if abs(_oracle_eval(equation) - target) < 1e-5 else 0.1
    except (ValueError, TypeError, OverflowError):
        return 0.1


PROBLEMS = [([3, 5, 7], 22), ([1, 3, 6], 18), ([2, 3], 8), ([2, 7], 3), ([5, 5, 7], 1), ([1, 2, 5], 3),
            ([4, 6, 8, 2], 24), ([10, 1, 1], 12)]


def _expression(rng: random.Random, numbers: list[int]) -> str:
    """A random arithmetic string over ``numbers``: often valid, sometimes off by one character."""
    items = [str(n) for n in rng.sample(numbers, len(numbers))]
    powers = 0
    while len(items) > 1:
        i = rng.randrange(len(items) - 1)
        op = rng.choice(["+", "-", "*", "/", "+", "-", "*", "/", "//", "**"])
        if op == "**":
            if powers:
                op = "*"
            powers += 1
        joined = f"{items[i]}{rng.choice(['', ' '])}{op}{rng.choice(['', ' ', ' -', '-', '+'])}{items[i + 1]}"
        items[i:i + 2] = [f"({joined})" if rng.random() < 0.4 else joined]
    text = items[0]
    for _ in range(rng.choice([0, 0, 0, 1])):  # a corruption the character checks or eval may trip on
        at = rng.randrange(len(text) + 1)
        text = text[:at] + rng.choice([".", "\t", "\n", "0", "x", "=", " ", "(", ")", "3", "-", "٣"]) + text[at:]
    return rng.choice(["", " ", "  "]) + text + rng.choice(["", " ", "\n", ".", " = 22"])


def _response(rng: random.Random, numbers: list[int]) -> str:
    parts = []
    for _ in range(rng.randint(1, 4)):
        parts.append(rng.choice([
            "<answer>" + _expression(rng, numbers) + "</answer>", "<answer>" + _expression(rng, numbers) + "</answer>",
            "</think>\n", "</think>", "\n", " ", "reasoning", "<think>", "assistant:", "Assistant:", "<answer>", "</answer>",
            _expression(rng, numbers), "<ANSWER>1</ANSWER>", "<answer></answer>"]))
    return "".join(parts)


def test_qiu_exact_matches_an_eval_oracle_on_generated_responses():
    rng = random.Random(11)
    for _ in range(4000):
        numbers, target = rng.choice(PROBLEMS)
        response = _response(rng, numbers)
        assert qiu_score(response, numbers, target).reward == _oracle_qiu(response, numbers, target), response


def test_tinyzero_exact_matches_an_eval_oracle_on_generated_responses():
    rng = random.Random(12)
    for _ in range(4000):
        numbers, target = rng.choice(PROBLEMS)
        prompt = rng.choice([CHATML, BASE, "plain prompt\n", ""])
        solution = prompt + _response(rng, numbers)
        assert tinyzero_score(solution, numbers, target).reward == _oracle_tinyzero(solution, numbers, target), solution


def test_the_generated_strings_reach_every_outcome():
    rng = random.Random(11)
    seen = set()
    for _ in range(4000):
        numbers, target = rng.choice(PROBLEMS)
        seen.add(round(qiu_score(_response(rng, numbers), numbers, target).reward, 6))
    assert {0.0, 0.01, 0.05, 0.06, 0.1, 1.05, 1.06, 1.1} <= seen


def test_python_arithmetic_equals_eval_on_generated_expressions():
    rng = random.Random(13)
    for _ in range(3000):
        numbers, _target = rng.choice(PROBLEMS)
        text = _expression(rng, numbers)
        try:
            expected = ("ok", _oracle_eval(text))
        except ValueError:
            expected = ("fails", None)
        try:
            got = ("ok", python_arithmetic(text))
        except EvalFailure:
            got = ("fails", None)
        if expected[0] == "ok" and not isinstance(expected[1], (int, float, complex)):
            expected = ("fails", None)  # a tuple or Ellipsis: both references score it as a failure
        assert got[0] == expected[0], text
        if got[0] == "ok":
            assert got[1] == expected[1] or got[1] != got[1] and expected[1] != expected[1], text
            assert type(got[1]) is type(expected[1]), text


def test_tinyzero_answer_needs_a_marker_and_reads_the_last_line():
    assert tinyzero_answer("<answer>1</answer>") is None
    assert tinyzero_answer("Assistant: <answer>1</answer> <answer> 2 </answer>") == "2"
    assert tinyzero_answer("<|im_start|>assistant\n<answer>1</answer>\nmore") is None


@pytest.mark.parametrize("completion,totals", [
    ("I multiply.</think>\n<answer>3*5+7</answer>", (1.1, 1.0, 1.1, 1.0)),
    ("I multiply.</think>\n<answer>3*5+7</answer>\n", (1.1, 1.0, 1.1, 0.0)),
    ("<answer>3*5+7</answer>", (1.1, 1.0, 1.05, 1.0)),
    ("3*5+7", (1.0, 1.0, 0.0, 0.0)),
    ("x</think>\n<answer>7 - -3*5</answer>", (0.0, 0.0, 1.1, 1.0)),
    ("x</think>\n<answer>3*5+7 = 22</answer>", (1.1, 1.0, 0.1, 0.1)),
    ("x</think>\n<answer>3*5+7.</answer>", (1.1, 1.0, 0.1, 1.0)),
])
def test_the_side_by_side_table_of_docs_rewards_md(completion, totals):
    example = Example("t", "Numbers: 3, 5, 7. Target: 22.", T, {"numbers": N})
    got = tuple(make_task("countdown", reward=r).reward(completion, example)
                for r in ("format_answer", "tiered", "qiu_exact", "tinyzero_exact"))
    assert got == pytest.approx(totals)


# -- Qiu et al.'s HF-generate scripts: the same reward on prompt + completion (qiu_hf_exact) -----------------------

QIU_PROMPT = ("You are a helpful assistant. You first think about the reasoning process in your mind and then provide the "
              "user with the answer.Using the numbers [{spaced}], create an equation that equals {target}. You can use "
              "basic arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in <think> "
              "</think> tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 "
              "</answer>.Let me solve this step by step.\n<think>")
"""A countdown.json context (row 0's wording), as their HF scripts tokenize, generate after and decode back."""


def _hf_total(response: str, numbers, target, total: float) -> float:
    """What the HF scripts give a response qiu_exact scores ``total``, worked out from the rules: the prompt's
    ``<think> </think>`` and its example answer block make the format term at least 0.1 + 0.5 unless the full
    layout holds (the same in both), and the answer term is the response's (the example never fits these
    problems); a response holding ``assistant:`` is cut there, prompt and all, so it scores as under qiu_exact."""
    if "assistant:" in response:
        return total
    fmt = qiu_score(response, numbers, target).format_reward
    answer = 1.0 if total >= 1.0 else 0.0
    return total if fmt == 1.0 else answer + (0.0 + 0.1 + 0.5) * 0.1


@pytest.mark.parametrize("response,numbers,target,total", QIU_CASES)
def test_qiu_hf_exact_scores_prompt_and_completion_on_the_same_responses(response, numbers, target, total):
    from evolm.reference_rewards import qiu_hf_score

    prompt = QIU_PROMPT.format(spaced=" ".join(map(str, numbers)), target=target)
    score = qiu_hf_score(prompt, response, numbers, target)
    assert score.reward == pytest.approx(_hf_total(response, numbers, target, total), abs=1e-12)
    assert score.reward == pytest.approx(_oracle_qiu(prompt + response, numbers, target), abs=1e-12)
    assert score.answer_reward == qiu_score(response, numbers, target).answer_reward  # the answer term is the response's
    task = make_task("countdown", reward="qiu_hf_exact")
    example = Example("t", prompt, target, {"numbers": numbers, "prompt": prompt})
    assert task.reward(response, example) == score.reward
    verdict = task.check(response, example)
    assert verdict.correct == (total >= 1.0) and verdict.format_ok == (score.format_reward == 1.0)


def test_qiu_hf_exact_gives_every_countdown_json_prompt_format_credit():
    """The prompt alone (an empty completion) earns 0.1 x (0.1 + 0.5) under their HF scripts, 0 under qiu_exact;
    on evolm's own rendered prompt the demonstration's answer block counts the same way."""
    from evolm.reference_rewards import qiu_hf_score

    prompt = QIU_PROMPT.format(spaced="44 19 35", target=98)
    empty = qiu_hf_score(prompt, "", [44, 19, 35], 98)
    assert (empty.reward, empty.format_reward, empty.answer_reward) == ((0.1 + 0.5) * 0.1, 0.6, 0.0)
    assert empty.answer == " (1 + 2) / 3 " and qiu_score("", [44, 19, 35], 98).reward == 0.0
    assert qiu_hf_score(QIU_PROMPT.format(spaced="1 2 3", target=1), "", [1, 2, 3], 1).reward == pytest.approx(1.06)
    task = make_task("countdown", reward="qiu_hf_exact")
    (rendered,) = task.examples("test", 1)
    assert "<answer>" in task.hf_prompt_text(rendered) and task.reward("", rendered) == pytest.approx(0.05)
    assert make_task("countdown", reward="qiu_exact").reward("", rendered) == 0.0
