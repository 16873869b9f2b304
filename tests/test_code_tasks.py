"""MBPP and HumanEval adapters: extraction, program assembly and checking in the sandbox.

The hand-written fixture problems below follow each dataset's record format; they are not benchmark
items. The real data is used only to count, sample and run the canonical solutions.
"""

from __future__ import annotations

import pytest

from evolm.errors import ConfigError
from evolm.tasks import TASKS, make_task
from evolm.tasks.humaneval import extract_humaneval_code, humaneval_example
from evolm.tasks.mbpp import extract_code, mbpp_example

MBPP_DOC = {
    "task_id": 9001,
    "text": "Write a function to return the sum of the squares of a list of integers.",
    "code": "def sum_squares(xs):\r\n    return sum(x * x for x in xs)",
    "test_list": ["assert sum_squares([1, 2, 3]) == 14", "assert sum_squares([]) == 0",
                  "assert sum_squares([-4]) == 16"],
    "test_setup_code": "",
    "challenge_test_list": [],
}
MBPP_SETUP_DOC = {
    "task_id": 9002,
    "text": "Write a function to find the distance of a point from the origin.",
    "code": "import math\ndef origin_distance(p):\n    return math.hypot(*p)",
    "test_list": ["assert origin_distance(POINT) == 5.0", "assert origin_distance((0, 0)) == 0.0"],
    "test_setup_code": "POINT = (3, 4)",
    "challenge_test_list": ["assert origin_distance((5, 12)) == 13.0"],
}
HUMANEVAL_ROW = {
    "task_id": "Fixture/0",
    "prompt": ('from typing import List\n\n\ndef running_max(xs: List[int]) -> List[int]:\n'
               '    """Return the running maximum of xs.\n    >>> running_max([1, 3, 2])\n    [1, 3, 3]\n    """\n'),
    "entry_point": "running_max",
    "canonical_solution": ("    out, best = [], None\n    for x in xs:\n        best = x if best is None else max(best, x)\n"
                           "        out.append(best)\n    return out\n"),
    "test": ("\n\nMETADATA = {}\n\n\ndef check(candidate):\n    assert candidate([]) == []\n"
             "    assert candidate([1, 3, 2]) == [1, 3, 3]\n    assert candidate([5, 4]) == [5, 5]\n"),
}
HUMANEVAL_HELPER_ROW = {
    "task_id": "Fixture/1",
    "prompt": ('def double(x: int) -> int:\n    return 2 * x\n\n\n'
               'def quadruple(x: int) -> int:\n    """Four times x, using double.\n    >>> quadruple(2)\n    8\n    """\n'),
    "entry_point": "quadruple",
    "canonical_solution": "    return double(double(x))\n",
    "test": "def check(candidate):\n    assert candidate(3) == 12\n    assert candidate(0) == 0\n",
}


@pytest.fixture(scope="module")
def mbpp():
    return make_task("mbpp")


@pytest.fixture(scope="module")
def humaneval():
    return make_task("humaneval")


# -- extraction ------------------------------------------------------------------------------------


def test_extract_code_rules():
    two_blocks = "Here:\n```python\nprint('usage')\n```\nand\n```python\ndef f():\n    return 1\n```\n"
    assert extract_code(two_blocks) == "def f():\n    return 1\n"  # the first block that defines a function
    assert extract_code("```\nx = 1\n```") == "x = 1\n"
    assert extract_code("```bash\nls\n```\n```py\ndef g(): pass\n```") == "def g(): pass\n"
    assert extract_code("```python\ndef f():\n    return 2\n") == "def f():\n    return 2\n"  # unclosed fence
    prose = "Sure! Here it is.\ndef f(x):\n    return x + 1\nThis adds one to x."
    assert extract_code(prose) == "def f(x):\n    return x + 1\n"
    assert extract_code("I cannot help with that.") is None


def test_extract_humaneval_code_rules():
    body = "    return sorted(xs)\n\n\ndef helper():\n    return 1\n\nif __name__ == '__main__':\n    main()\n"
    assert extract_humaneval_code(body) == "    return sorted(xs)\n\n\ndef helper():\n    return 1\n"
    assert extract_humaneval_code("```python\ndef f(x):\n    return x\n```") == "def f(x):\n    return x\n"
    assert extract_humaneval_code("   \n") is None
    assert extract_humaneval_code("No code today.") is None


# -- MBPP ------------------------------------------------------------------------------------------


def test_mbpp_example_format():
    ex = mbpp_example(MBPP_SETUP_DOC)
    assert ex.id == "mbpp/9002"
    assert "distance of a point" in ex.question and "assert origin_distance(POINT) == 5.0" in ex.question
    assert "((0, 0))" not in ex.question  # only the first test is shown
    assert ex.answer.startswith("POINT = (3, 4)\n")
    assert ex.meta["challenge_tests"] == ["assert origin_distance((5, 12)) == 13.0"]


def test_mbpp_check(mbpp):
    ex = mbpp_example(MBPP_DOC)
    good = "Here you go:\n```python\ndef sum_squares(xs):\n    return sum(x * x for x in xs)\n```"
    verdict = mbpp.check(good, ex)
    assert verdict.format_ok and verdict.correct and verdict.answer.startswith("def sum_squares")
    wrong = "```python\ndef sum_squares(xs):\n    return sum(xs)\n```"
    assert mbpp.check(wrong, ex).format_ok and not mbpp.check(wrong, ex).correct
    broken = "```python\ndef sum_squares(xs)\n    return 0\n```"
    assert not mbpp.check(broken, ex).correct
    assert mbpp.check("The answer is 14.", ex).format_ok is False
    unfenced = "def sum_squares(xs):\n    total = 0\n    for x in xs:\n        total += x * x\n    return total\nDone."
    assert mbpp.check(unfenced, ex).correct
    assert mbpp.reward(good, ex) == pytest.approx(1.1) and mbpp.reward(wrong, ex) == pytest.approx(0.1)
    setup_ex = mbpp_example(MBPP_SETUP_DOC)
    assert mbpp.check(f"```python\n{MBPP_SETUP_DOC['code']}\n```", setup_ex).correct


def test_code_task_limits_apply():
    quick = make_task("mbpp", timeout_s=1)
    ex = mbpp_example(MBPP_DOC)
    hang = "```python\ndef sum_squares(xs):\n    while True:\n        pass\n```"
    result = quick.run(hang, ex)
    assert result.status == "timeout" and not quick.check(hang, ex).correct
    hog = "```python\ndef sum_squares(xs):\n    return len(bytearray(2 ** 31))\n```"
    assert make_task("mbpp", memory_mb=128).run(hog, ex).status == "resource-limit"
    assert quick.run("no code", ex) is None


def test_check_many_matches_check(mbpp):
    ex = mbpp_example(MBPP_DOC)
    completions = ["```python\ndef sum_squares(xs):\n    return sum(x * x for x in xs)\n```", "no code",
                   "```python\ndef sum_squares(xs):\n    return 0\n```"]
    verdicts = mbpp.check_many([(c, ex) for c in completions], max_workers=2)
    assert [(v.format_ok, v.correct) for v in verdicts] == [(True, True), (False, False), (True, False)]
    assert verdicts == [mbpp.check(c, ex) for c in completions]


# -- HumanEval -------------------------------------------------------------------------------------


def test_humaneval_completion_forms(humaneval):
    ex = humaneval_example(HUMANEVAL_ROW)
    assert ex.answer.rstrip().endswith("check(running_max)")
    body = HUMANEVAL_ROW["canonical_solution"]
    full = ("```python\nfrom typing import List\n\ndef running_max(xs: List[int]) -> List[int]:\n"
            "    result = []\n    for x in xs:\n        result.append(max(result[-1], x) if result else x)\n"
            "    return result\n```")
    unfenced_full = "def running_max(xs):\n    import itertools\n    return list(itertools.accumulate(xs, max))\n"
    for completion in (body, full, unfenced_full, body + "\n\nprint(running_max([1]))\n"):
        verdict = humaneval.check(completion, ex)
        assert verdict.format_ok and verdict.correct, completion
    assert not humaneval.check("    return xs\n", ex).correct
    assert not humaneval.check("    return [\n", ex).correct
    assert humaneval.check("", ex).format_ok is False


def test_humaneval_keeps_prompt_helpers(humaneval):
    ex = humaneval_example(HUMANEVAL_HELPER_ROW)
    assert humaneval.check(HUMANEVAL_HELPER_ROW["canonical_solution"], ex).correct
    assert humaneval.check("```python\ndef quadruple(x):\n    return double(double(x))\n```", ex).correct
    assert humaneval.check("```python\nreturn double(x) * 2\n```", ex).correct  # bare body in a fence


def test_humaneval_render_prompt(humaneval, tokenizer):
    ex = humaneval_example(HUMANEVAL_ROW)
    assert humaneval.render_prompt(ex) == HUMANEVAL_ROW["prompt"]  # base models continue the body
    chat = humaneval.render_prompt(ex, tokenizer)
    assert "```python\nfrom typing import List" in chat and humaneval.instruction in chat


# -- data and registry -----------------------------------------------------------------------------


def test_registry_and_params():
    assert TASKS["mbpp"].name == "mbpp" and TASKS["humaneval"].name == "humaneval"
    task = make_task("humaneval", timeout_s=2.5, memory_mb=256)
    assert (task.timeout_s, task.memory_mb) == (2.5, 256)
    with pytest.raises(ConfigError):
        make_task("mbpp", timeout_s=0)
    with pytest.raises(ConfigError):
        make_task("mbpp", no_such_param=1)


def test_real_data_sizes_and_sampling(mbpp, humaneval):
    everything = mbpp.examples()
    assert len(everything) == 500 and len({e.id for e in everything}) == 500
    assert all(len(e.meta["tests"]) >= 3 for e in everything)
    assert len(humaneval.examples("test")) == 164
    sample = mbpp.examples("test", count=7, seed=3)
    assert [e.id for e in sample] == [e.id for e in mbpp.examples("test", count=7, seed=3)]
    assert [e.id for e in sample] != [e.id for e in mbpp.examples("test", count=7, seed=4)]
    assert len(humaneval.examples(count=1000)) == 164
    with pytest.raises(ConfigError):
        mbpp.examples("train", count=3)


def test_canonical_solutions_pass_on_a_sample(mbpp, humaneval):
    """End to end through the sandbox: reference solutions of real problems pass their tests."""
    patient = make_task("mbpp", timeout_s=30)  # a few MBPP references are slow (quadratic loops)
    mbpp_items = patient.examples(count=12, seed=0)
    mbpp_verdicts = patient.check_many([(f"```python\n{e.meta['reference']}\n```", e) for e in mbpp_items])
    assert all(v.correct for v in mbpp_verdicts), [e.id for e, v in zip(mbpp_items, mbpp_verdicts) if not v.correct]
    he_items = humaneval.examples(count=12, seed=0)
    he_verdicts = humaneval.check_many([(e.meta["reference"], e) for e in he_items])
    assert all(v.correct for v in he_verdicts), [e.id for e, v in zip(he_items, he_verdicts) if not v.correct]


@pytest.mark.slow
def test_all_canonical_solutions_pass():
    """The full sanity check (664 programs, ~1 min on 2 cores): 664/664 with a generous timeout."""
    mbpp = make_task("mbpp", timeout_s=60)
    items = mbpp.examples()
    verdicts = mbpp.check_many([(f"```python\n{e.meta['reference']}\n```", e) for e in items])
    assert [e.id for e, v in zip(items, verdicts) if not v.correct] == []
    humaneval = make_task("humaneval", timeout_s=60)
    items = humaneval.examples()
    verdicts = humaneval.check_many([(e.meta["reference"], e) for e in items])
    assert [e.id for e, v in zip(items, verdicts) if not v.correct] == []
