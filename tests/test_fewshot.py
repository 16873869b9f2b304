"""Few-shot prompts for base models: demonstrations on dataset tasks, BOS on plain-text prompts."""

from __future__ import annotations

import pytest

from evolm.errors import ConfigError
from evolm.tasks import make_task
from evolm.tasks.base import bos_text


class _BosTokenizer:
    """The two things ``bos_text`` asks of a tokenizer, as a Gemma-style one answers them (adds BOS, no chat template)."""

    bos_token, bos_token_id, chat_template = "<bos>", 2, None

    def __call__(self, text):
        return {"input_ids": [2] + [100 + ord(c) for c in text]}


def test_bos_text_only_for_tokenizers_that_start_plain_text_with_it(tokenizer):
    assert bos_text(_BosTokenizer()) == "<bos>"
    assert bos_text(tokenizer) == "" and bos_text(None) == ""  # SmolLM2 adds none
    for name in ("arithmetic", "csqa", "gsm8k"):
        task = make_task(name)
        example = task.examples("test", 1)[0]
        assert task.render_prompt(example, _BosTokenizer()).startswith("<bos>")
        assert not task.render_prompt(example).startswith("<bos>")


def test_chat_models_get_no_demonstrations_by_default(tokenizer):
    for name in ("csqa", "arc_easy", "sst2", "gsm8k"):
        example = make_task(name).examples("test", 1)[0]
        assert make_task(name).render_prompt(example, tokenizer) == make_task(name, shots=0).render_prompt(example, tokenizer)
    task = make_task("csqa", shots=2)
    prompt = task.render_prompt(task.examples("test", 1)[0], tokenizer)
    assert prompt.count("<|im_start|>assistant\nAnswer: ") == 2  # demonstrations as chat turns


@pytest.mark.parametrize("name, shots", [("csqa", 3), ("arc_easy", 3), ("sst2", 2), ("gsm8k", 3)])
def test_plain_text_prompts_show_demonstrations_by_default(name, shots):
    task = make_task(name)
    example = task.examples("test", 1)[0]
    prompt = task.render_prompt(example)
    demos = task.demonstrations(shots)
    assert len(demos) == shots and prompt.endswith(f"\n\n{example.question}\n")
    assert prompt.startswith(f"{task.instruction}\n\n") and all(f"{q}\n{r}\n\n" in prompt for q, r in demos)
    assert make_task(name, shots=0).render_prompt(example) == f"{task.instruction}\n\n{example.question}\n"
    assert make_task(name, shots=1).render_prompt(example).count("\n\n") < prompt.count("\n\n")


def test_train_split_demonstrations_are_train_problems_with_distinct_letters():
    task = make_task("csqa")
    demos = task.demonstration_examples(5)
    assert sorted(e.answer for e in demos) == list("ABCDE")
    held_out = {e.question for e in task.all_examples("validation")}
    assert not any(e.question in held_out for e in demos)
    assert task.demonstration_examples(5) == make_task("csqa").demonstration_examples(5)  # fixed draw


def test_replies_are_what_the_checker_reads_first():
    csqa = make_task("csqa")
    example = csqa.examples("test", 1)[0]
    wrong = next(letter for letter in "ABCDE" if letter != example.answer)
    # a base model answers, then invents the next question and answers that too
    completion = f"Answer: {example.answer}\n\nWhat is next?\n\nA. x\nB. y\n\nAnswer: {wrong}"
    assert csqa.check(completion, example).correct and csqa.check(completion, example).format_ok
    gsm = make_task("gsm8k")
    demo = gsm.demonstration_examples(1)[0]
    assert gsm.demonstration_reply(demo).endswith("#### 18") and demo.answer == "18"
    assert gsm.check("9 + 9 = 18\n#### 18\n\nNext problem...\n#### 7\nThe answer is 7.", demo).correct


@pytest.mark.parametrize("params, message", [
    ({"shots": -1}, "shots must be an integer"),
    ({"shots": 9}, "shots must be an integer"),
    ({"shots": True}, "shots must be an integer"),
    ({"shots": "3"}, "shots must be an integer"),
])
def test_bad_shots_are_config_errors(params, message):
    with pytest.raises(ConfigError, match=message):
        make_task("csqa", **params)


def test_a_task_without_demonstrations_refuses_shots_and_defaults_to_none():
    with pytest.raises(ConfigError, match="gpqa' has no demonstrations"):
        make_task("gpqa", shots=2)
    assert make_task("gpqa").shots_for(None) == 0
    with pytest.raises(ConfigError, match=r"params are|takes path.*shots"):
        make_task("csqa", shot=2)


def test_grpo_rows_leave_the_bos_to_trl():
    """TRL tokenizes plain-text prompts with special tokens: the rendered BOS must not be doubled."""
    from evolm.grpo import training_rows

    task = make_task("arithmetic", digits=1)
    examples = task.examples("train", 2)
    rows = training_rows(task, examples, _BosTokenizer())
    assert rows["prompt"] == [task.render_prompt(e, _BosTokenizer())[len("<bos>"):] for e in examples]
    assert rows["prompt"] == [task.render_prompt(e) for e in examples]


def test_chat_messages_carry_the_demonstrations_when_shots_is_set():
    task = make_task("sst2", shots=2)
    msgs = task.messages(task.examples("test", 1)[0])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert [m["content"] for m in msgs if m["role"] == "assistant"] == ["Answer: A", "Answer: B"]
    assert [m["role"] for m in make_task("sst2").messages(task.examples("test", 1)[0])] == ["system", "user"]
