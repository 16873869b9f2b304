"""Answer checking and lenient rewards of the generated tasks: pure functions on hand-written completions.

The reference-exact conventions (qiu_exact, tinyzero_exact) are tested in test_reference_rewards.py."""

from __future__ import annotations

from fractions import Fraction

import pytest

from evolm.rewards import REWARDS, Verdict, format_answer_reward, tiered_reward
from evolm.tasks import make_task
from evolm.tasks.base import Example
from evolm.tasks.countdown import MAX_EQUATION_CHARS, InvalidEquation, check_equation, evaluate_equation

NUMBERS, TARGET = [3, 5, 7], 22  # 3 * 5 + 7


def countdown_example(numbers=NUMBERS, target=TARGET) -> Example:
    return Example(id="t", question="", answer=target, meta={"numbers": list(numbers), "solution": ""})


def arithmetic_example(expression="47 + 85", answer=132) -> Example:
    return Example(id="t", question=f"What is {expression}?", answer=answer, meta={"expression": expression})


# -- the reward conventions -------------------------------------------------------------------------

@pytest.mark.parametrize("format_ok,correct,additive,tiered", [
    (True, True, 1.1, 1.0), (False, True, 1.0, 1.0), (True, False, 0.1, 0.1), (False, False, 0.0, 0.0)])
def test_reward_conventions(format_ok, correct, additive, tiered):
    verdict = Verdict(format_ok=format_ok, correct=correct)
    assert format_answer_reward(verdict) == pytest.approx(additive)
    assert tiered_reward(verdict) == pytest.approx(tiered)
    assert set(REWARDS) == {"format_answer", "tiered"}


@pytest.mark.parametrize("task_name,completion,example,additive,tiered", [
    ("countdown", "<answer>3 * 5 + 7</answer>", countdown_example(), 1.1, 1.0),
    ("countdown", "3 * 5 + 7", countdown_example(), 1.0, 1.0),
    ("countdown", "<answer>3 + 5 + 7</answer>", countdown_example(), 0.1, 0.1),
    ("countdown", "no idea", countdown_example(), 0.0, 0.0),
    ("arithmetic", "47 + 85 = 132", arithmetic_example(), 1.1, 1.0),
    ("arithmetic", "47 + 85 = 131", arithmetic_example(), 0.1, 0.1),
    ("arithmetic", "To add 47 and 85, we", arithmetic_example(), 0.0, 0.0),
])
def test_task_reward_under_both_lenient_conventions(task_name, completion, example, additive, tiered):
    assert make_task(task_name, reward="format_answer").reward(completion, example) == pytest.approx(additive)
    assert make_task(task_name, reward="tiered").reward(completion, example) == pytest.approx(tiered)


@pytest.mark.parametrize("old,new", [("qiu", "format_answer"), ("tinyzero", "tiered")])
def test_old_convention_names_load_as_the_lenient_ones_with_a_note(old, new, capsys):
    from evolm import rewards

    rewards._NOTED.discard(old)
    task = make_task("countdown", reward=old)
    assert task.reward_name == new                       # never the exact one
    note = capsys.readouterr().err.strip()
    assert note.count("\n") == 0 and note.startswith("evolm: note:") and f"'{old}'" in note and f"'{new}'" in note
    make_task("arithmetic", reward=old)                  # noted once per process
    assert capsys.readouterr().err == ""
    assert task.reward("3 * 5 + 7", countdown_example()) == make_task("countdown", reward=new).reward(
        "3 * 5 + 7", countdown_example())


def test_old_config_and_run_directory_load_with_renamed_conventions(tmp_path):
    from evolm import config
    from evolm.config import ESJob

    (tmp_path / "config.toml").write_text('[task]\nname = "countdown"\nreward = "qiu"\n')
    cfg = config.load(ESJob, tmp_path / "config.toml")
    assert cfg.task.reward == "format_answer"
    assert 'reward = "format_answer"' in config.to_toml(cfg)   # the resolved config says what it means
    assert config.load(ESJob, overrides=["task.reward=tinyzero"]).task.reward == "tiered"


def test_reward_is_pure():
    task, example = make_task("countdown"), countdown_example()
    rewards = [task.reward("<answer>(7 - 5) * 3</answer>", example) for _ in range(3)]
    assert rewards == [0.1, 0.1, 0.1] and example.meta["numbers"] == NUMBERS


# -- countdown: the equation evaluator --------------------------------------------------------------

@pytest.mark.parametrize("equation,value", [
    ("3 * 5 + 7", 22), ("(3 + 5) * 7", 56), ("7 - 5 - 3", -1), ("7 / (5 - 3)", Fraction(7, 2)),
    ("((3)) * 5 + 7", 22), ("3 × 5 + 7", 22), ("15 ÷ 5 + 7 - 3", None)])
def test_evaluate_equation_exact(equation, value):
    if value is None:  # 15 is not one of the numbers
        with pytest.raises(InvalidEquation):
            evaluate_equation(equation, NUMBERS)
    else:
        assert evaluate_equation(equation, NUMBERS) == value


def test_non_integer_intermediate_results_are_allowed():
    # 6 / (1 / 3) = 18 exactly although 1 / 3 is not an integer; floats would give 18.000000000000004
    assert evaluate_equation("6 / (1 / 3)", [1, 3, 6]) == 18
    assert check_equation("<answer>6 / (1 / 3)</answer>", [1, 3, 6], 18) == Verdict(True, True, "6 / (1 / 3)")
    assert evaluate_equation("(1 / 3 + 1 / 6) * 4", [1, 3, 1, 6, 4]) == 2


@pytest.mark.parametrize("equation,why", [
    ("3 * 5 + 7 + 3", "uses"),          # a number used twice
    ("3 * 5", "uses"),                  # a number left unused
    ("3 * 5 + 8", "uses"),              # a number that was not given
    ("3 * (5 - 5) + 7", "uses"),
    ("7 / (5 - 5) + 3", "uses"),        # also reuses 5; the next case divides by zero with valid numbers
    ("2 ** 3", "operator"), ("7 // 3 + 5", "operator"), ("7 % 3 + 5", "not a short"),
    ("-3 + 5 * 7", "not allowed"), ("+3 + 5 * 7", "not allowed"),
    ("(3 * 5 + 7", "does not parse"), ("3 * 5) + 7", "does not parse"), ("3 5 7", "does not parse"),
    ("abs(3) * 5 + 7", "not a short"), ("x * 5 + 7", "not a short"), ("(3).real * 5 + 7", "not a short"),
    ("__import__('os')", "not a short"), ("3.0 * 5 + 7", "not a short"), ("0x3 * 5 + 7", "not a short"),
    ("3_0 * 5 + 7", "not a short"), ("03 * 5 + 7", "does not parse"), ("", "not a short"),
    ("()", "Tuple is not allowed"), ("3 * 5 + 7 == 22", "not a short"),
    ("3 * 5 + 7; 1", "not a short"), ("3 * 5 + 7\n+ 0", "not a short"),
])
def test_evaluate_equation_rejects(equation, why):
    with pytest.raises(InvalidEquation, match=why):
        evaluate_equation(equation, NUMBERS)


def test_division_by_zero_is_invalid_not_an_exception():
    with pytest.raises(InvalidEquation, match="division by zero"):
        evaluate_equation("7 / (5 - 5)", [7, 5, 5])
    assert check_equation("<answer>7 / (5 - 5)</answer>", [7, 5, 5], 1) == Verdict(True, False, "7 / (5 - 5)")


def test_huge_and_deep_expressions_are_rejected_cheaply():
    long = " + ".join(["1"] * 5000)
    with pytest.raises(InvalidEquation, match="not a short"):
        evaluate_equation(long, [1] * 5000)
    deep = "(" * 150 + "3" + ")" * 150
    with pytest.raises(InvalidEquation, match="not a short"):
        evaluate_equation(deep, [3])
    nested = "(" * 95 + "3" + ")" * 95 + " * 5 + 7"  # within the cap: parsed and evaluated
    assert len(nested) <= MAX_EQUATION_CHARS and evaluate_equation(nested, NUMBERS) == 22
    assert check_equation(f"<answer>{long}</answer>", [1] * 5000, 5000).correct is False
    assert check_equation("9" * 10_000, NUMBERS, TARGET) == Verdict(False, False, "9" * 10_000)


# -- countdown: extraction, format and correctness ---------------------------------------------------

@pytest.mark.parametrize("completion,format_ok,correct", [
    ("<answer>3 * 5 + 7</answer>", True, True),
    ("<answer> 7 + 5 * 3 </answer>", True, True),
    ("Sure. <answer>3 * 5 + 7</answer> Done.", True, True),
    ("<answer>3 + 5 + 7</answer> then <answer>3 * 5 + 7</answer>", True, True),   # the last block counts
    ("<answer>3 * 5 + 7</answer> then <answer>3 + 5 + 7</answer>", True, False),
    ("<ANSWER>3 * 5 + 7</ANSWER>", True, True),
    ("<answer>3 * 5 + 7 = 22</answer>", True, True),      # a claimed result equal to the target
    ("<answer>3 * 5 + 7 = 21</answer>", True, False),     # a claimed result that is not the target
    ("<answer>3 * 5 + 7.</answer>", True, True),
    ("<answer>22 = 3 * 5 + 7</answer>", False, False),    # only a trailing '= N' is read
    ("<answer>3 * 5 = 15 + 7</answer>", False, False),
    ("<answer>3 * 5 + 8</answer>", True, False),          # well formed, wrong numbers
    ("<answer>3 * 5 + 7 + 3</answer>", True, False),      # reused number
    ("<answer>3 * 5</answer>", True, False),              # unused number
    ("<answer>3 + 5 * 7</answer>", True, False),          # wrong target
    ("<answer>22</answer>", True, False),
    ("<answer>three times five plus seven</answer>", False, False),
    ("<answer></answer>", False, False),
    ("3 * 5 + 7 = 22", False, True),                      # untagged first line: correct, no format credit
    ("\n\n  3 * 5 + 7.\nmore text", False, True),
    ("3 + 5 + 7 = 15\n3 * 5 + 7", False, False),          # only the first line is read
    ("I think 3 * 5 + 7 works", False, False),
    ("<answer>3 * 5 + 7", False, False),                  # unclosed tag: the first line is not an equation
    ("", False, False),
])
def test_countdown_check(completion, format_ok, correct):
    verdict = make_task("countdown").check(completion, countdown_example())
    assert (verdict.format_ok, verdict.correct) == (format_ok, correct)


def test_countdown_extract_answer():
    task = make_task("countdown")
    assert task.extract_answer("x <answer> 1 + 2 </answer>") == "1 + 2"
    assert task.extract_answer("\n 1 + 2 = 3 \nmore") == "1 + 2 = 3"
    assert task.extract_answer("  \n ") is None


def test_generated_solutions_score_full_reward():
    task = make_task("countdown", numbers=[2, 3, 4], max_number=20, max_target=200)
    for example in task.examples("train", 200, seed=3):
        assert task.reward(f"<answer>{example.meta['solution']}</answer>", example) == pytest.approx(1.1)
        assert evaluate_equation(example.meta["solution"], example.meta["numbers"]) == example.answer


# -- arithmetic: extraction, format and correctness --------------------------------------------------

@pytest.mark.parametrize("completion,answer,format_ok,correct", [
    # the legitimate single final answers
    ("47 + 85 = 132", "132", True, True),
    ("47+85=132", "132", True, True),
    ("132", "132", True, True),
    ("132.", "132", True, True),
    ("The answer is 132.", "132", True, True),
    ("Answer: 132", "132", True, True),
    ("\n47 + 85 = 132\nThis is a classic example", "132", True, True),
    ("<answer>132</answer>", "132", True, True),
    ("<answer>47 + 85 = 132</answer>", "132", True, True),
    ("Let me think <answer>1,32</answer>", "132", True, True),
    ("47 + 85 = 132.0", "132.0", True, True),
    ("47 × 85 = 132", "132", True, True),               # the expression is not evaluated: only the result counts
    ("47 + 85 = 131", "131", True, False),
    ("47 + 85 = 132.5", "132.5", True, False),
    # no single final answer: nothing
    ("To add 47 and 85, we first", None, False, False),
    ("47 + 85 = 132. This is", None, False, False),      # prose after the answer
    ("To add 47 and 85:\n47 + 85 = 132", None, False, False),  # only the first line is read
    ("132 is wrong, it is 131", None, False, False),
    ("", None, False, False),
    # the known hacks: several candidates
    ("130 131 132", None, False, False),
    ("47 + 85 = 131, 132", None, False, False),
    ("47 + 85 = 131 = 132", None, False, False),
    ("47 + 85 = 131 132", None, False, False),
    ("<answer>131 132</answer>", None, False, False),
    ("<answer>131\n132</answer>", None, False, False),
    ("The answer is 131 or 132.", None, False, False),
    ("x = 132", None, False, False),
])
def test_arithmetic_check(completion, answer, format_ok, correct):
    task = make_task("arithmetic")
    verdict = task.check(completion, arithmetic_example())
    assert verdict == Verdict(format_ok=format_ok, correct=correct, answer=answer)
    assert task.extract_answer(completion) == answer


def test_arithmetic_negative_answers():
    task = make_task("arithmetic", operators="-")
    example = arithmetic_example("12 - 47", -35)
    assert task.check("12 - 47 = -35", example) == Verdict(True, True, "-35")
    assert task.check("12 - 47 = 35", example).correct is False


@pytest.mark.parametrize("completion", ["79 80 81", "40 + 41 = 80, 81", "40 + 41 = 80 = 81", "<answer>79 80 81</answer>"])
def test_arithmetic_hacks_earn_nothing(completion):
    example = arithmetic_example("40 + 41", 81)
    for reward in ("format_answer", "tiered"):
        assert make_task("arithmetic", reward=reward).reward(completion, example) == 0.0


@pytest.mark.parametrize("completion", ["40 + 41 = 81", "81", "<answer>81</answer>", "The answer is 81."])
def test_arithmetic_legitimate_forms_earn_full_reward(completion):
    example = arithmetic_example("40 + 41", 81)
    assert make_task("arithmetic").reward(completion, example) == pytest.approx(1.1)
