"""The generated tasks: seeded examples, disjoint splits, difficulty knobs, prompts, and knob errors."""

from __future__ import annotations

import ast

import pytest

from evolm.errors import ConfigError
from evolm.tasks import TASKS, make_task
from evolm.tasks.arithmetic import evaluate
from evolm.tasks.countdown import evaluate_equation
from evolm.tasks.procedural import TEST_FRACTION, split_of


def test_both_tasks_are_registered():
    assert {"arithmetic", "countdown"} <= set(TASKS)


# -- determinism and splits -------------------------------------------------------------------------

@pytest.mark.parametrize("name,params", [("arithmetic", {}), ("countdown", {})])
def test_examples_are_deterministic_in_split_count_seed(name, params):
    task = make_task(name, **params)
    first = task.examples("train", 50, seed=7)
    assert first == make_task(name, **params).examples("train", 50, seed=7)
    assert [e.meta for e in first] == [e.meta for e in task.examples("train", 50, seed=7)]
    assert task.examples("train", 20, seed=7) == first[:20]              # a prefix of a longer draw
    assert task.examples("train", 50, seed=8) != first
    assert task.examples("test", 50, seed=7) != first
    assert len({e.id for e in first}) == 50                               # distinct within a call
    assert len(task.examples("test", None)) == 500


@pytest.mark.parametrize("name,params", [("arithmetic", {}), ("arithmetic", {"digits": 1}),
                                         ("countdown", {}), ("countdown", {"numbers": 2, "max_number": 6})])
def test_train_and_test_never_share_a_problem(name, params):
    task = make_task(name, **params)
    small = params.get("digits") == 1 or params.get("max_number") == 6
    test_count = 15 if small else 300
    test = {e.id for seed in range(3) for e in task.examples("test", test_count, seed=seed)}
    train = {e.id for seed in range(3) for e in task.examples("train", 60 if small else 300, seed=seed)}
    assert test and train and not test & train
    assert all(split_of(name, i.split(":", 1)[1]) == "test" for i in test)


def test_countdown_split_key_ignores_number_order():
    task = make_task("countdown")
    for e in task.examples("test", 100):
        numbers = e.meta["numbers"]
        assert e.id == f"countdown:{','.join(map(str, sorted(numbers)))}->{e.answer}"


def test_split_hash_gives_the_configured_test_share():
    keys = [f"{a}+{b}" for a in range(10, 100) for b in range(10, 100)]
    share = sum(split_of("arithmetic", k) == "test" for k in keys) / len(keys)
    assert abs(share - TEST_FRACTION) < 0.02


def test_small_spaces_repeat_problems_only_when_fresh_ones_run_out():
    task = make_task("arithmetic", digits=1)  # 100 problems, about 20 of them test
    all_test = {f"{a}+{b}" for a in range(10) for b in range(10) if split_of("arithmetic", f"{a}+{b}") == "test"}
    drawn = [e.id.split(":", 1)[1] for e in task.examples("test", 60)]
    assert len(drawn) == 60 and set(drawn) == all_test        # every test problem is drawn
    assert len(set(drawn[:len(all_test)])) >= len(all_test) - 2  # (nearly) all before any repeat
    few = [e.id for e in task.examples("train", 30)]
    assert len(set(few)) == 30


def test_countdown_number_mix_holds_at_every_count():
    task = make_task("countdown", numbers=[2, 3])  # only ~30 distinct 2-number test problems
    for count in (40, 400):
        sizes = [len(e.meta["numbers"]) for e in task.examples("test", count, seed=1)]
        assert 0.35 < sizes.count(2) / count < 0.65


def test_bad_split_and_count():
    task = make_task("arithmetic")
    with pytest.raises(ConfigError, match="split must be one of train, test"):
        task.examples("validation", 3)
    with pytest.raises(ConfigError, match="count"):
        task.examples("train", -1)


# -- difficulty knobs ------------------------------------------------------------------------------

@pytest.mark.parametrize("digits,operators,terms", [(1, "+", 2), (2, "+", 2), (3, "+-", 3), (2, "*", 2), (1, "+-*", 5)])
def test_arithmetic_knobs_are_respected(digits, operators, terms):
    task = make_task("arithmetic", digits=digits, operators=operators, terms=terms)
    examples = task.examples("train", 60, seed=1)
    lo = 0 if digits == 1 else 10 ** (digits - 1)
    seen_ops = set()
    for e in examples:
        operands, ops = e.meta["operands"], e.meta["operators"]
        assert len(operands) == terms and len(ops) == terms - 1
        assert all(lo <= x < 10 ** digits for x in operands)
        seen_ops |= set(ops)
        expression = e.meta["expression"]
        assert e.question == f"What is {expression}?"
        # the gold answer agrees with Python's own reading of our (trusted, generated) expression
        assert e.answer == evaluate(operands, ops) == eval(compile(ast.parse(expression, mode="eval"), "", "eval"))
    assert seen_ops == set(operators)


def test_arithmetic_evaluate_precedence():
    assert evaluate([2, 3, 4], ["+", "*"]) == 14
    assert evaluate([2, 3, 4, 5], ["*", "-", "*"]) == -14
    assert evaluate([9, 3, 4], ["-", "-"]) == 2


@pytest.mark.parametrize("numbers,max_number,max_target",
                         [(2, 10, 50), ([2, 3], 10, 50), (4, 20, 100), ([3, 5], 9, 30)])
def test_countdown_knobs_are_respected_and_problems_solvable(numbers, max_number, max_target):
    task = make_task("countdown", numbers=numbers, max_number=max_number, max_target=max_target)
    allowed = {numbers} if isinstance(numbers, int) else set(numbers)
    examples = task.examples("train", 80, seed=2)
    assert {len(e.meta["numbers"]) for e in examples} == allowed
    for e in examples:
        assert all(1 <= n <= max_number for n in e.meta["numbers"])
        assert 1 <= e.answer <= max_target and isinstance(e.answer, int)
        assert evaluate_equation(e.meta["solution"], e.meta["numbers"]) == e.answer
        assert e.question == f"Numbers: {', '.join(map(str, e.meta['numbers']))}. Target: {e.answer}."


# -- prompts ---------------------------------------------------------------------------------------

def test_prompt_through_chat_template(tokenizer):
    task = make_task("arithmetic")
    example = task.examples("test", 1)[0]
    prompt = task.render_prompt(example, tokenizer)
    (demo_question, demo_reply), = task.demonstrations()
    assert prompt.startswith("<|im_start|>system\nYou are a calculator.<|im_end|>\n")
    assert f"<|im_start|>user\n{demo_question}<|im_end|>\n<|im_start|>assistant\n{demo_reply}<|im_end|>" in prompt
    assert prompt.endswith(f"<|im_start|>user\n{example.question}<|im_end|>\n<|im_start|>assistant\n")
    assert "Hugging Face" not in prompt  # the template's default system prompt is replaced
    assert len(tokenizer(prompt)["input_ids"]) < 80


def test_prompt_plain_text_without_tokenizer():
    task = make_task("countdown")
    example = task.examples("test", 1)[0]
    (demo_question, demo_reply), = task.demonstrations()
    assert task.render_prompt(example) == (f"{task.instruction}\n\n{demo_question}\n{demo_reply}\n\n"
                                           f"{example.question}\n")
    assert demo_reply.startswith("<answer>") and demo_reply.endswith("</answer>")


def test_prompt_knobs_system_prompt_and_shots(tokenizer):
    task = make_task("arithmetic", system_prompt="Be brief.", shots=0)
    example = task.examples("test", 1)[0]
    assert task.demonstrations() == []
    assert task.render_prompt(example) == f"Be brief.\n\n{example.question}\n"
    assert "Be brief." in task.render_prompt(example, tokenizer)
    assert make_task("arithmetic", system_prompt="", shots=0).render_prompt(example) == f"{example.question}\n"
    assert len(make_task("countdown", shots=3).demonstrations()) == 3


def test_demonstrations_follow_knobs_and_are_train_problems():
    task = make_task("arithmetic", digits=3, operators="*", terms=3, shots=2)
    demos = task.demonstrations()
    assert len(demos) == 2 and demos == task.demonstrations()
    for question, reply in demos:
        expression = question.removeprefix("What is ").removesuffix("?")
        assert expression.count("*") == 2 and reply.startswith(f"{expression} = ")
        assert split_of("arithmetic", expression.replace(" ", "")) == "train"


# -- params and errors -----------------------------------------------------------------------------

def test_make_task_with_params():
    task = make_task("arithmetic", reward="tiered", digits=3)
    assert (task.reward_name, task.digits, task.operators, task.terms) == ("tiered", 3, "+", 2)
    countdown = make_task("countdown", numbers=[2, 4], max_number=12, max_target=99)
    assert countdown.knobs() == {"numbers": [2, 4], "max_number": 12, "max_target": 99}


@pytest.mark.parametrize("name,params,message", [
    ("arithmetic", {"digit": 2}, "no param 'digit'"),
    ("countdown", {"nums": 3}, "no param 'nums'"),
    ("arithmetic", {"digits": 0}, "digits must be an integer in"),
    ("arithmetic", {"digits": "2"}, "digits must be an integer in"),
    ("arithmetic", {"digits": True}, "digits must be an integer in"),
    ("arithmetic", {"terms": 1}, "terms must be an integer in"),
    ("arithmetic", {"operators": "+/"}, "operators must be"),
    ("arithmetic", {"operators": ""}, "operators must be"),
    ("arithmetic", {"shots": -1}, "shots must be"),
    ("countdown", {"numbers": 1}, "numbers must be an integer in"),
    ("countdown", {"numbers": [2, 9]}, "numbers must be an integer in"),
    ("countdown", {"numbers": []}, "numbers must be an integer or a list"),
    ("countdown", {"numbers": "3"}, "numbers must be an integer or a list"),
    ("countdown", {"max_number": 0}, "max_number must be"),
    ("countdown", {"max_target": 2.5}, "max_target must be"),
    ("arithmetic", {"reward": "binary"}, "task.reward must be one of"),
    ("arithmetic", {"reward": "qiu_exact"}, "exists only for countdown, not 'arithmetic'"),
    ("gsm8k", {"reward": "tinyzero_exact"}, "exists only for countdown, not 'gsm8k'"),
    ("countdown", {"train_path": "x.json"}, "train_path needs path"),
    ("countdown", {"train_rows": 10}, "train_rows and test_rows need path"),
    ("countdown", {"path": "x.json", "test_rows": 0}, "test_rows must be a positive integer"),
    ("countdown", {"path": 3}, "path must be a file path"),
])
def test_bad_params_are_one_line_config_errors(name, params, message):
    with pytest.raises(ConfigError, match=message) as info:
        make_task(name, **params)
    assert "\n" not in str(info.value)


def test_empty_split_is_a_config_error():
    task = make_task("countdown", numbers=2, max_number=1, max_target=1)  # one problem: 1, 1 -> 1
    home = split_of("countdown", "1,1->1")
    other = "train" if home == "test" else "test"
    assert [e.id for e in task.examples(home, 3)] == ["countdown:1,1->1"] * 3
    with pytest.raises(ConfigError, match=f"no {other} problems found"):
        task.examples(other, 1)
