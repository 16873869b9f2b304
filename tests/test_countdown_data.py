"""Countdown on data files: Qiu et al.'s countdown.json and TinyZero's JSONL/parquet layouts (small
synthetic files in those formats), the split rule, verbatim prompts, one-line errors for bad files,
and ``evolm eval`` / ``evolm es`` end to end on such a file with the reference reward."""

from __future__ import annotations

import json

import pytest

from evolm.errors import UserError
from evolm.tasks import make_task
from evolm.tasks.countdown_data import QIU_TEST_ROWS, QIU_TRAIN_ROWS, read_rows

QIU_CONTEXT = ("You are a helpful assistant. You first think about the reasoning process in your mind and then provide the "
               "user with the answer.Using the numbers [{spaced}], create an equation that equals {target}. You can use basic "
               "arithmetic operations (+, -, *, /) and each number can only be used once. Show your work in <think> </think> "
               "tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.Let me "
               "solve this step by step.\n<think>")
TINYZERO_PREFIX = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n Using the numbers {numbers}, "
                   "create an equation that equals {target}.<|im_end|>\n<|im_start|>assistant\nLet me solve this step by "
                   "step.\n<think>")


def qiu_rows(count: int) -> list[dict]:
    rows = []
    for i in range(count):
        numbers = [10 + i % 80, 3 + i % 7, 2 + i % 5]
        target = numbers[0] + numbers[1] - numbers[2]
        rows.append({"id": i, "context": QIU_CONTEXT.format(spaced=" ".join(map(str, numbers)), target=target),
                     "numbers": numbers, "target": str(target), "solution": f"(({numbers[0]} + {numbers[1]}) - {numbers[2]})"})
    return rows


def write_json(path, data):
    path.write_text(json.dumps(data))
    return str(path)


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


# -- Qiu et al.'s countdown.json ---------------------------------------------------------------------------

def test_qiu_file_is_split_as_the_paper_did(tmp_path):
    path = write_json(tmp_path / "countdown.json", qiu_rows(2200))
    task = make_task("countdown", reward="qiu_exact", path=path)
    train, test = task.examples("train", None), task.examples("test", None)
    assert (QIU_TRAIN_ROWS, QIU_TEST_ROWS) == (200, 2000)
    assert [e.id for e in train] == [f"countdown/{i}" for i in range(200)]            # data[:200]
    assert [e.id for e in test] == [f"countdown/{i}" for i in range(200, 2200)]       # data[-2000:]
    first = train[0]
    assert first.answer == 11 and first.meta["numbers"] == [10, 3, 2] and first.meta["solution"] == "((10 + 3) - 2)"
    assert task.params == {"path": path}


def test_qiu_context_is_the_prompt_verbatim(tmp_path, tokenizer):
    path = write_json(tmp_path / "countdown.json", qiu_rows(20))
    task = make_task("countdown", reward="qiu_exact", path=path, train_rows=5, test_rows=10)
    example = task.examples("test", None)[0]
    context = qiu_rows(20)[10]["context"]
    assert task.render_prompt(example, tokenizer) == context        # no chat template, no system message, no shots
    assert task.render_prompt(example) == context
    assert task.verbatim_prompt(example) == context
    # the token ids the model sees are those of the reference's tokenizer(context) call
    ids = tokenizer(task.render_prompt(example, tokenizer), add_special_tokens=False)["input_ids"]
    assert ids == tokenizer(context)["input_ids"]
    assert task.reward("I add.</think>\n<answer>(10 + 3) - 2 + 0</answer>", task.examples("train", None)[0]) == \
        pytest.approx(0.1)                                           # 0 is not one of the numbers
    assert task.reward("I add.</think>\n<answer>(20 + 6) - 2</answer>", example) == pytest.approx(1.1)


def test_a_tokenizer_that_adds_a_bos_gets_it_written_into_the_verbatim_prompt(tmp_path, tokenizer):
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    backend = tokenizer.backend_tokenizer.__class__.from_str(tokenizer.backend_tokenizer.to_str())
    bos = tokenizer.bos_token
    backend.post_processor = TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, tokenizer.bos_token_id)])
    with_bos = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=bos, eos_token=tokenizer.eos_token)
    path = write_json(tmp_path / "countdown.json", qiu_rows(4))
    task = make_task("countdown", path=path, train_rows=2, test_rows=2)
    example = task.examples("test", None)[0]
    context = example.meta["prompt"]
    assert with_bos(context)["input_ids"][0] == tokenizer.bos_token_id          # this tokenizer adds one
    rendered = task.render_prompt(example, with_bos)
    assert rendered == bos + context
    assert with_bos(rendered, add_special_tokens=False)["input_ids"] == with_bos(context)["input_ids"]


def test_file_examples_are_seeded_subsets_in_file_order(tmp_path):
    path = write_json(tmp_path / "countdown.json", qiu_rows(60))
    task = make_task("countdown", path=path, train_rows=20, test_rows=40)
    small, large = task.examples("test", 10, seed=3), task.examples("test", 20, seed=3)
    assert len(small) == 10 and set(e.id for e in small) <= set(e.id for e in large)
    assert [e.id for e in small] == sorted((e.id for e in small), key=lambda i: int(i.split("/")[1]))
    assert small == make_task("countdown", path=path, train_rows=20, test_rows=40).examples("test", 10, seed=3)
    assert task.examples("test", 10, seed=4) != small
    assert len(task.examples("train", 500)) == 20


# -- TinyZero layouts --------------------------------------------------------------------------------------

def test_tinyzero_source_rows_use_evolm_template(tmp_path, tokenizer):
    rows = [{"target": 24, "nums": [4, 6, 8, 2]}, {"target": 7, "nums": [1, 2, 4]}]
    test = write_jsonl(tmp_path / "test.jsonl", rows)
    train = write_parquet(tmp_path / "train.parquet", rows * 3)
    task = make_task("countdown", reward="tinyzero_exact", path=test, train_path=train)
    assert len(task.examples("train", None)) == 6 and len(task.examples("test", None)) == 2
    example = task.examples("test", None)[0]
    assert example.question == "Numbers: 4, 6, 8, 2. Target: 24." and example.meta.get("prompt") is None
    assert task.render_prompt(example, tokenizer).startswith("<|im_start|>system\nCombine the numbers")  # evolm's prompt
    assert task.reward("x\n<answer>4 * 6 * (8 / 8)</answer>", example) == 0.1           # 8 used twice, 2 unused
    assert task.reward("x\n<answer>(6 - 2) * 4 + 8</answer>\n", example) == 0.0          # the last line is empty
    assert task.reward("x\n<answer>(6 - 2) * 4 + 8</answer>", example) == 1.0      # 16 + 8 = 24, each number once


def test_verl_processed_parquet_uses_the_prompt_content_verbatim(tmp_path, tokenizer):
    rows = [{"data_source": "countdown", "prompt": [{"role": "user", "content": TINYZERO_PREFIX.format(numbers=[3, 5, 7], target=22)}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": {"target": 22, "numbers": [3, 5, 7]}},
             "extra_info": {"split": "test", "index": 7}}]
    path = write_parquet(tmp_path / "test.parquet", rows)
    task = make_task("countdown", reward="tinyzero_exact", path=path, train_path=path)
    example = task.examples("test", None)[0]
    assert example.id == "countdown/7" and example.answer == 22 and example.meta["numbers"] == [3, 5, 7]
    prompt = rows[0]["prompt"][0]["content"]
    assert task.render_prompt(example, tokenizer) == prompt                    # no second chat template
    assert tokenizer(task.render_prompt(example, tokenizer), add_special_tokens=False)["input_ids"] == \
        tokenizer(prompt, add_special_tokens=False)["input_ids"]               # what TinyZero's dataset feeds
    assert task.reward("I try 3*5.</think> <answer>3*5+7</answer>", example) == 1.0
    assert task.reward("I try 3*5.</think>\n<answer>3*5+7</answer>\n", example) == 0.0   # last line is empty


def test_several_messages_are_rendered_with_the_chat_template(tmp_path, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Make 22 from 3 5 7."}]
    path = write_jsonl(tmp_path / "d.jsonl", [{"prompt": messages, "numbers": [3, 5, 7], "target": 22}] * 2)
    task = make_task("countdown", path=path, train_rows=1, test_rows=1)
    example = task.examples("test", None)[0]
    assert task.render_prompt(example, tokenizer) == tokenizer.apply_chat_template(messages, tokenize=False,
                                                                                   add_generation_prompt=True)
    assert task.verbatim_prompt(example) is None and task.messages(example) == messages


def test_tinyzero_exact_refuses_prompts_without_an_assistant_marker(tmp_path):
    path = write_json(tmp_path / "countdown.json", qiu_rows(20))
    task = make_task("countdown", reward="tinyzero_exact", path=path, train_rows=5, test_rows=10)
    with pytest.raises(UserError, match="would score every completion 0") as info:
        task.examples("test", None)
    assert "\n" not in str(info.value) and "qiu_exact" in str(info.value)


# -- bad files ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content,message", [
    ([], "holds no rows"),
    ([1, 2], "row 0 is int, not a record"),
    ([{"numbers": [1, 2]}], "row 0 has no target"),
    ([{"target": 3}], "row 0 has no numbers (or nums)"),
    ([{"context": "x", "solution": "1"}], "has no numbers (or nums) and target"),
    ([{"numbers": "1 2", "target": 3}], "numbers must be a non-empty list"),
    ([{"numbers": [], "target": 3}], "numbers must be a non-empty list"),
    ([{"numbers": [1, -2], "target": 3}], "non-negative integers"),
    ([{"numbers": [1, 2.5], "target": 3}], "non-negative integers"),
    ([{"numbers": [1, True], "target": 3}], "non-negative integers"),
    ([{"numbers": [1, 2], "target": "three"}], "target must be a number"),
    ([{"numbers": [1, 2], "target": "nan"}], "target must be a number"),
    ([{"numbers": [1, 2], "target": [3]}], "target must be a number"),
    ([{"numbers": [1, 2], "target": True}], "target must be a number"),
    ([{"numbers": [1, 2], "target": 3, "context": ""}], "context must be non-empty text"),
    ([{"numbers": [1, 2], "target": 3, "context": 7}], "context must be non-empty text"),
    ([{"numbers": [1, 2], "target": 3, "prompt": []}], "prompt must be text or a non-empty list"),
    ([{"numbers": [1, 2], "target": 3, "prompt": [{"role": "user"}]}], "prompt must be text or a non-empty list"),
    ([{"numbers": [1, 2], "target": 3, "prompt": 5}], "prompt must be text or a list"),
    ([{"numbers": [1, 2], "target": 3}, {"nums": [1], "target": None}], "row 1 has no target"),
])
def test_bad_files_are_one_line_errors(tmp_path, content, message):
    path = write_json(tmp_path / f"bad{abs(hash(message)) % 10**8}.json", content)
    with pytest.raises(UserError) as info:
        make_task("countdown", path=path).examples("test", None)
    assert message in str(info.value) and "\n" not in str(info.value) and path in str(info.value)


def test_missing_file_unreadable_file_and_overlapping_split(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        make_task("countdown", path=str(tmp_path / "nope.json")).examples("test", 5)
    (tmp_path / "broken.json").write_text("[{")
    with pytest.raises(UserError, match="cannot read"):
        make_task("countdown", path=str(tmp_path / "broken.json")).examples("test", 5)
    path = write_json(tmp_path / "small.json", qiu_rows(300))
    with pytest.raises(UserError, match="has 300 rows: the train split .first 200. and the test split .last 2000. would overlap"):
        make_task("countdown", path=path).examples("train", None)
    assert len(make_task("countdown", path=path, test_rows=100).examples("test", None)) == 100


def test_digit_strings_are_integers_and_duplicate_ids_fall_back_to_positions(tmp_path):
    path = write_jsonl(tmp_path / "d.jsonl", [{"id": "a", "numbers": ["3", "5"], "target": "8"},
                                              {"id": "a", "numbers": [1, 2], "target": 3.0}])
    rows = read_rows(path)
    assert [(r.id, r.numbers, r.target) for r in rows] == [("0", (3, 5), 8), ("1", (1, 2), 3)]


def test_non_digit_targets_are_unanswerable_under_qiu_exact_as_in_their_evaluation(tmp_path):
    # countdown.json has 58 such test rows, e.g. target "27.4" for [98, 47, 47, 52] and negative integers
    rows = [{"id": 0, "context": QIU_CONTEXT.format(spaced="98 47 47 52", target="27.4"), "numbers": [98, 47, 47, 52],
             "target": "27.4", "solution": "((98 / (47 - 52)) + 47)"},
            {"id": 1, "context": QIU_CONTEXT.format(spaced="3 5 7", target="-9"), "numbers": [3, 5, 7], "target": "-9",
             "solution": "3 - 5 - 7"},
            {"id": 2, "context": QIU_CONTEXT.format(spaced="3 5 7", target="22"), "numbers": [3, 5, 7], "target": "22",
             "solution": "3 * 5 + 7"}]
    path = write_json(tmp_path / "countdown.json", rows)
    exact, lenient = (make_task("countdown", reward=r, path=path, train_rows=1, test_rows=2) for r in ("qiu_exact", "tiered"))
    decimal, negative, whole = exact.examples("train", None) + exact.examples("test", None)
    assert (decimal.answer, negative.answer, whole.answer) == (27.4, -9, 22)
    answer = "x</think>\n<answer>{}</answer>"
    assert exact.reward(answer.format("98 / (47 - 52) + 47"), decimal) == pytest.approx(0.1)     # no target: answer 0
    assert exact.reward(answer.format("3 - 5 - 7"), negative) == pytest.approx(0.1)
    assert exact.reward(answer.format("3 * 5 + 7"), whole) == pytest.approx(1.1)
    assert lenient.reward("<answer>98 / (47 - 52) + 47</answer>", decimal) == 1.0                # the value is right
    assert lenient.reward("<answer>3 - 5 - 7</answer>", negative) == 1.0
    assert lenient.reward("<answer>98 / (47 - 47) + 52</answer>", decimal) == 0.1     # formatted, not right


# -- votes -------------------------------------------------------------------------------------------------

def test_equation_votes_ignore_spelling_but_not_the_equation():
    from evolm.tasks.canonical import canonical_equation

    same = ["3+5*7", "3 + 5 * 7", "(3)+(5*7)", "5*7+3", "7 * 5 + 3", "+3 + 5 * 7", " 3 +5*7 "]
    assert len({canonical_equation(e) for e in same}) == 1
    assert canonical_equation("3+5*7") == "3 + 5 * 7"
    assert canonical_equation("(3+5)*7") == "(3 + 5) * 7" != canonical_equation("3+5*7")
    assert canonical_equation("7 - (5 - 3)") == canonical_equation("7 - 5 + 3") == canonical_equation("3 + 7 - 5")
    assert canonical_equation("6 / (1 / 3)") == canonical_equation("6 * 3 / 1") == "3 * 6 / 1"
    assert canonical_equation("7 - -3*5") == canonical_equation("7 + 3*5")
    assert canonical_equation("3 * (5 + 7)") != canonical_equation("3 * 5 + 3 * 7")   # no distributivity
    assert canonical_equation("2**3") == "2 ** 3" and canonical_equation("(1+1)**3") == "(1 + 1) ** 3"
    assert canonical_equation("three  times\nfive") == "three times five"          # not arithmetic: text key
    assert canonical_equation(None) is None


def test_countdown_votes_follow_the_convention(tmp_path):
    lenient, exact = make_task("countdown"), make_task("countdown", reward="qiu_exact")
    assert lenient.canonical_answer("3 × 5 + 7 = 22.") == lenient.canonical_answer("7+3*5") == "3 * 5 + 7"
    assert exact.canonical_answer("3*5+7 = 22") != exact.canonical_answer("7+3*5")   # judged differently, vote apart
    assert exact.canonical_answer(" 7+3*5\n") == "3 * 5 + 7"


def test_numeric_and_program_votes():
    from evolm.tasks.canonical import canonical_number, canonical_program

    assert canonical_number("132") == canonical_number("132.0") == canonical_number("1,32") == "132"
    assert canonical_number("-0.50") == "-0.5" and canonical_number("1/3") == "1/3" and canonical_number("abc ") == "abc"
    assert make_task("arithmetic").canonical_answer("81.0") == "81"
    assert canonical_program("def f(x):\n    return (x+1)  # add\n") == canonical_program("def f(x): return x + 1")


def test_eval_json_keeps_raw_answers_and_votes_on_canonical_ones(tmp_path):
    from evolm.backends.base import Completion, Generator, SamplingParams
    from evolm.evaluate import evaluate_task

    class Replies(Generator):
        batch_size = 8

        def generate(self, prompts, params):
            texts = ["<answer>3+5*7</answer>", "<answer>3 + 5 * 7</answer>", "<answer>(3+5)*7</answer>",
                     "<answer>5*7+3</answer>"]
            return [[Completion(text=t, num_tokens=5, entropy=0.5, finished=True) for t in texts] for _ in prompts]

    path = write_jsonl(tmp_path / "d.jsonl", [{"numbers": [3, 5, 7], "target": 38}] * 2)
    task = make_task("countdown", path=path, train_rows=1, test_rows=1)
    result = evaluate_task(Replies(), task, None, task.examples("test", None), SamplingParams(n=4, temperature=1.0),
                           ks=[1, 3], progress=False)
    problem = result.to_dict()["problems"][0]
    assert problem["answers"] == ["3+5*7", "3 + 5 * 7", "(3+5)*7", "5*7+3"]               # raw, as before
    assert problem["votes"] == ["3 + 5 * 7", "3 + 5 * 7", "(3 + 5) * 7", "3 + 5 * 7"]
    assert problem["correct"] == [True, True, False, True]
    assert result.summary["distinct_correct"] == 1          # raw strings would count 3
    assert result.summary["maj@3"] == 1.0                   # raw strings split the vote into ties: 0.75
    assert result.to_dict()["reward"] == "format_answer" and result.to_dict()["params"] == {"path": path, "train_rows": 1,
                                                                                            "test_rows": 1}


# -- GRPO prompts and held-out tasks -------------------------------------------------------------------------

def test_grpo_feeds_verbatim_prompts_as_text(tmp_path, tokenizer):
    from evolm.grpo import training_rows

    path = write_json(tmp_path / "countdown.json", qiu_rows(4))
    task = make_task("countdown", reward="qiu_exact", path=path, train_rows=2, test_rows=2)
    rows = training_rows(task, task.examples("train", None), tokenizer)
    assert rows["prompt"] == [r["context"] for r in qiu_rows(2)]
    procedural = make_task("countdown")
    assert isinstance(training_rows(procedural, procedural.examples("train", 2), tokenizer)["prompt"][0], list)


def test_heldout_tasks_keep_their_own_checker_under_a_countdown_reference_reward():
    from evolm.tasks import heldout_reward

    assert heldout_reward("countdown", "qiu_exact") == "qiu_exact"
    assert heldout_reward("arithmetic", "qiu_exact") == "format_answer"
    assert heldout_reward("arithmetic", "tiered") == "tiered"


def test_config_refuses_a_reference_reward_for_other_tasks():
    from evolm import config
    from evolm.config import ESJob
    from evolm.errors import ConfigError

    with pytest.raises(ConfigError, match="task.reward = 'qiu_exact' .* exists only for countdown, not 'arithmetic'"):
        config.load(ESJob, overrides=["task.reward=qiu_exact"])
    with pytest.raises(ConfigError, match="task.reward must be one of"):
        config.load(ESJob, overrides=["task.reward=exact"])
    assert config.load(ESJob, overrides=["task.name=countdown", "task.reward=tinyzero_exact"]).task.reward == "tinyzero_exact"


# -- the command line on a tiny model ------------------------------------------------------------------------

@pytest.fixture
def tiny_dir(tiny_model, tokenizer, tmp_path):
    tiny_model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_evolm_eval_and_es_run_on_the_papers_file_layout(tiny_dir, tmp_path, monkeypatch, capsys):
    from evolm.commands import main

    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("EVOLM_FUSED", "0")
    path = write_json(tmp_path / "countdown.json", qiu_rows(30))
    assert main(["eval", "--model", str(tiny_dir), "--tasks", "countdown", "--task-param", f"countdown.path={path}",
                 "--task-param", "countdown.train_rows=10", "--task-param", "countdown.test_rows=20",
                 "--task-param", "countdown.reward=qiu_exact", "--n", "2", "--k", "1,2", "--limit", "3",
                 "--max-new-tokens", "4", "--no-progress", "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())["tasks"]["countdown"]
    assert report["reward"] == "qiu_exact" and report["params"]["path"] == path
    assert [p["id"] for p in report["problems"]] and all(p["id"].startswith("countdown/") for p in report["problems"])

    config = tmp_path / "es.toml"
    config.write_text(f'''
[run]
name = "cd"
out_dir = "{tmp_path / 'runs'}"
progress = false
checkpoint_every = 0
[model]
spec = "{tiny_dir}"
[task]
name = "countdown"
reward = "qiu_exact"
params = {{ path = "{path}", train_rows = 10, test_rows = 20 }}
[generation]
max_new_tokens = 4
[es]
iterations = 2
population = 2
prompts_per_iteration = 10
[eval]
count = 3
n_samples = 2
k = [1, 2]
[probe]
every = 0
''')
    assert main(["es", "--config", str(config)]) == 0
    run = tmp_path / "runs" / "cd"
    assert 'reward = "qiu_exact"' in (run / "config.toml").read_text()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if r.get("kind") == "train"]
    assert len(train) == 2 and all(0.0 <= r["reward_mean"] <= 1.1 for r in train)
    after = json.loads((run / "eval_after.json").read_text())
    assert after["task"] == "countdown" and after["reward"] == "qiu_exact" and after["summary"]["problems"] == 3


def test_grpo_trains_on_the_papers_file_layout_with_the_reference_reward(tmp_path, tokenizer):
    from conftest import make_tiny_model

    from evolm import config
    from evolm.grpo import GRPOJob
    from evolm.jobs import run_grpo

    path = write_json(tmp_path / "countdown.json", qiu_rows(12))
    cfg = config.from_dict(GRPOJob, {
        "run": {"out_dir": str(tmp_path), "name": "g", "checkpoint_every": 0, "progress": False},
        "task": {"name": "countdown", "reward": "qiu_exact", "params": {"path": path, "train_rows": 4, "test_rows": 8}},
        "grpo": {"steps": 1, "num_generations": 2, "prompts_per_step": 2, "max_completion_length": 4, "lr": 1e-3},
        "probe": {"every": 0}, "eval": {"before_after": False}})
    run = run_grpo(cfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer)
    train = [r for r in run.metrics() if r.get("kind") == "train"]
    assert run.info()["status"] == "finished" and len(train) == 1
    assert 0.0 <= train[0]["reward_mean"] <= 1.1


@pytest.mark.slow
def test_real_model_answers_verbatim_qiu_prompts_scored_by_qiu_exact(tmp_path):
    import hashlib

    from evolm.evaluate import evaluate_model

    path = write_json(tmp_path / "countdown.json", qiu_rows(6))
    task = make_task("countdown", reward="qiu_exact", path=path, train_rows=2, test_rows=4)
    report = evaluate_model("smollm2-135m", [task], n=2, ks=[1, 2], max_new_tokens=24, cache_dir=tmp_path / "cache",
                            progress=False)
    result = report["tasks"]["countdown"]
    assert result["reward"] == "qiu_exact" and result["summary"]["problems"] == 4
    cached = [json.loads(line) for f in (tmp_path / "cache").rglob("n2-*.jsonl") for line in f.read_text().splitlines()]
    contexts = {hashlib.sha256(r["context"].encode()).hexdigest()[:16] for r in qiu_rows(6)[2:]}
    assert {c["prompt"] for c in cached} == contexts          # the model was fed each row's context verbatim
    assert all(comp["num_tokens"] > 0 for c in cached for comp in c["completions"])
