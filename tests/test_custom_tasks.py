"""A user's own task, data and reward functions: entry points, references, the dataset task, the contract
of a reward function, and every verb that reopens a run finding them again (docs/custom-tasks.md).

The plugin package is examples/plugin_package, installed here as a user would (pip, into a folder put on
the path), so its entry points are real installed metadata. Runs use a tiny random llama saved as a model
directory; its vowel-share reward moves within a few ES updates.
"""

from __future__ import annotations

import json
import tomllib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from evolm import config
from evolm.errors import ConfigError, UserError
from evolm.rewards import RewardError, RewardFunctions
from evolm.tasks import find_task, make_task

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "examples" / "plugin_package"


@pytest.fixture(scope="session")
def plugin_path(tmp_path_factory):
    """examples/plugin_package installed with pip into a folder that is put on sys.path (and PYTHONPATH for children)."""
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--target",
                    str(target), str(PLUGIN)], check=True, capture_output=True)
    sys.path.insert(0, str(target))
    yield target
    sys.path.remove(str(target))


def child_env(*paths) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(REPO / "src"), env.get("PYTHONPATH", "")])
    return env


def evolm_cli(args, env, check=True):
    out = subprocess.run([sys.executable, "-m", "evolm", *map(str, args)], capture_output=True, text=True, env=env,
                         timeout=900)
    if check and out.returncode != 0:
        raise AssertionError(f"evolm {' '.join(map(str, args))} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out


def write_module(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


REWARDS_PY = '''
def length(prompts, completions, **columns):
    return [float(len(c)) for c in completions]

def half(prompts, completions, **columns):
    return [None if i % 2 else 0.5 for i, _ in enumerate(completions)]

def seen(prompts, completions, **columns):
    global SEEN
    SEEN = {"prompts": prompts, "completions": completions, **columns}
    return [1.0] * len(completions)

def short(prompts, completions, **columns):
    return [0.0]

def text(prompts, completions, **columns):
    return ["high"] * len(completions)

def nan(prompts, completions, **columns):
    return [float("nan")] * len(completions)

def boom(prompts, completions, **columns):
    raise ValueError("no verifier here")

def exact(prompts, completions, answer, **columns):
    return [c.strip() == str(a) for c, a in zip(completions, answer)]

NOT_A_FUNCTION = 3
'''


@pytest.fixture
def rewards_py(tmp_path):
    return write_module(tmp_path / "my_rewards.py", REWARDS_PY)


# -- finding the user's code ----------------------------------------------------------------------------

def test_entry_points_module_paths_and_files_resolve(plugin_path, rewards_py):
    task = make_task("vowel_words", "vowel_share", correct="mostly_vowels")
    examples = task.examples("train", 2)
    assert task.score(examples, ["aei", "xyz"]) == [1.0, 0.0]
    assert [v.correct for v in task.judge(examples, ["aei", "xyz"])] == [True, False]
    record = task.plugins()
    assert record["task"]["distribution"] == "evolm-example-plugin" and record["task"]["version"] == "0.1.0"
    assert [r["ref"] for r in record["rewards"]] == ["vowel_share"] and record["correct"]["ref"] == "mostly_vowels"
    assert find_task("evolm_example_plugin.tasks:VowelWords").name == "vowel_words"
    by_file = make_task("arithmetic", [f"{rewards_py}:length"])
    assert by_file.score(by_file.examples("train", 1), ["abcd"]) == [4.0]
    assert by_file.plugins()["rewards"][0]["sha256"]


@pytest.mark.parametrize("ref, message", [
    ("nosuch.py:fn", "does not exist"),
    ("{rewards}:missing", "has no reward function 'missing' \\(it defines .*boom"),
    ("{rewards}:NOT_A_FUNCTION", "is a int, not a function"),
    ("no_such_module_xyz:fn", "module 'no_such_module_xyz' is not installed here"),
    ("{broken}:fn", "does not import: ZeroDivisionError"),
    ("binary", "task.reward must be one of .* or reward functions"),
])
def test_a_reward_that_cannot_be_found_is_one_line(ref, message, rewards_py, tmp_path):
    broken = write_module(tmp_path / "broken.py", "x = 1 / 0\n")
    ref = ref.format(rewards=rewards_py, broken=broken)
    with pytest.raises(UserError, match=message) as info:
        config.from_dict(config.ESJob, {}, [f"task.reward={json.dumps(ref)}"])
    assert "\n" not in str(info.value)


def test_a_misspelled_plugin_reward_names_the_installed_ones_and_the_closest(plugin_path):
    """issue 44.5: the error listed only evolm's conventions, not the installed entry points."""
    with pytest.raises(ConfigError, match=r"installed reward entry points: mostly_vowels, vowel_share.*"
                                          r"did you mean 'vowel_share'\?"):
        config.from_dict(config.ESJob, {}, ["task.reward='vowel_shar'"])


def test_unknown_task_names_the_three_ways():
    with pytest.raises(ConfigError, match="entry points of group evolm.tasks .* package.module:Class"):
        config.from_dict(config.ESJob, {}, ["task.name='nosuch'"])


# -- the reward function's contract ----------------------------------------------------------------------

def test_weights_and_none_follow_trl(rewards_py):
    rf = RewardFunctions([f"{rewards_py}:length", f"{rewards_py}:half"], weights=[2.0, 1.0])
    assert rf.rewards(["p"] * 3, ["ab", "abc", ""], {}) == [4.5, 6.0, 0.5]  # None: that function does not apply
    only_none = RewardFunctions([f"{rewards_py}:half"])
    assert only_none.rewards(["p"] * 2, ["a", "b"], {}) == [0.5, 0.0]  # no function scored it: 0 (TRL's nansum)


@pytest.mark.parametrize("name, message", [
    ("short", "returned 1 values for 2 completions"), ("text", "returned 'high' at position 0; return a number"),
    ("nan", "returned nan at position 0; rewards must be finite"), ("boom", "raised ValueError: no verifier here"),
])
def test_a_broken_reward_is_a_one_line_reward_error(name, message, rewards_py):
    rf = RewardFunctions([f"{rewards_py}:{name}"])
    with pytest.raises(RewardError, match=message):
        rf.rewards(["p", "q"], ["a", "b"], {})


def test_a_reward_gets_the_prompt_as_the_data_gives_it_like_trl(rewards_py, tmp_path, tokenizer):
    """issue 44.4: evolm passed the chat-rendered prompt where TRL passes the dataset's own prompt (text, or
    the list of messages of a conversational row)."""
    chat = [{"prompt": [{"role": "user", "content": f"Say {w}"}], "answer": w} for w in ("yes", "no", "maybe", "ok")]
    task = make_task("dataset", [f"{rewards_py}:seen"], path=str(_write(tmp_path, "jsonl", chat)), test_fraction=0.25,
                     system_prompt="Be brief.")
    ex = task.examples("train", 1)[0]
    task.score([ex], ["yes"], [task.render_prompt(ex, tokenizer)])
    seen = task.user_rewards.functions[0].__globals__["SEEN"]
    assert seen["prompts"] == [[{"role": "user", "content": ex.question}]]  # TRL's prompts: the row's messages
    text = [{"prompt": f"Say {w}", "answer": w} for w in ("yes", "no", "maybe", "ok")]
    task = make_task("dataset", [f"{rewards_py}:seen"], path=str(_write(tmp_path, "csv", text)), test_fraction=0.25)
    ex = task.examples("train", 1)[0]
    task.judge([ex], ["yes"], [task.render_prompt(ex, tokenizer)])
    task.score([ex], ["yes"], [task.render_prompt(ex, tokenizer)])
    assert task.user_rewards.functions[0].__globals__["SEEN"]["prompts"] == [ex.question]
    assert "<|im_start|>" not in ex.question


def test_a_partial_reward_is_recorded_with_its_arguments_and_rebuilt(tmp_path):
    """issue 44.4: functools.partial(fn, ...) was refused as 'a lambda or defined inside a function'."""
    import functools

    from evolm.plugins import REWARD_GROUP, provenance, reference_of, resolve

    path = write_module(tmp_path / "scaled.py", "def scaled(prompts, completions, scale=1.0, bonus=0, **columns):\n"
                                                "    return [scale * len(c) + bonus for c in completions]\n")
    from evolm.plugins import _import_file

    module = _import_file(path.resolve())
    part = functools.partial(module.scaled, scale=0.5, bonus=1)
    ref = reference_of(part, "reward function")
    assert ref == f"{path.resolve()}:scaled(scale=0.5, bonus=1)"
    again = resolve(ref, REWARD_GROUP)
    assert again(prompts=["p"], completions=["abcd"]) == [3.0]
    rf = RewardFunctions([ref])
    assert rf.rewards(["p"], ["ab"], {}) == [2.0]
    record = provenance(again, ref)
    assert record["ref"] == ref and record["module"].startswith("evolm_user_scaled") and len(record["sha256"]) == 64
    job = config.from_dict(config.ESJob, {}, [f"task.reward=[{json.dumps(ref)}]"])  # a config takes the same form
    assert job.task.reward == [ref]
    with pytest.raises(UserError, match=r"argument .* of partial .* is not a literal"):
        reference_of(functools.partial(module.scaled, scale=object()), "reward function")


def test_a_reward_needing_a_missing_column_lists_the_columns_present(tmp_path):
    """issue 44.5: docs/custom-tasks.md says so; it was a raw 'missing 1 required positional argument'."""
    path = write_module(tmp_path / "needs.py", "def by_level(prompts, completions, difficulty, **kw):\n"
                                               "    return [0.0] * len(completions)\n")
    rf = RewardFunctions([f"{path}:by_level"])
    with pytest.raises(RewardError, match=r"by_level' needs the column 'difficulty', which the data do not have "
                                          r"\(columns: answer, level\)"):
        rf.rewards(["p"], ["a"], {"answer": ["1"], "level": [2]})


def test_a_reward_requiring_an_argument_only_trl_passes_is_one_line(tmp_path):
    path = write_module(tmp_path / "trl_only.py", "def needs_ids(prompts, completions, completion_ids, **kw):\n"
                                                  "    return [0.0] * len(completions)\n"
                                                  "def defaulted(prompts, completions, completion_ids=None, trainer_state=None, **kw):\n"
                                                  "    return [1.0] * len(completions)\n")
    with pytest.raises(ConfigError, match=r"needs_ids' requires completion_ids, which TRL's GRPOTrainer passes and "
                                          r"evolm does not .*completion_ids=None"):
        RewardFunctions([f"{path}:needs_ids"])
    assert RewardFunctions([f"{path}:defaulted"]).rewards(["p"], ["a"], {}) == [1.0]


def test_a_builtin_task_hands_its_answer_and_fields_to_the_reward(rewards_py):
    task = make_task("countdown", [f"{rewards_py}:seen"])
    examples = task.examples("train", 2, seed=3)
    task.score(examples, ["x", "y"], ["P0", "P1"])  # P0, P1: what the model saw (rendered); not the reward's
    seen = task.user_rewards.functions[0].__globals__["SEEN"]
    assert seen["prompts"] == [ex.question for ex in examples] and seen["completions"] == ["x", "y"]  # raw, as TRL
    assert seen["answer"] == [ex.answer for ex in examples]
    assert set(examples[0].meta) <= set(seen)  # every field of the example travels by name
    # its own checker still judges correctness (pass@k) unless a correctness function is given
    assert [v.correct for v in task.judge(examples, ["x", "y"])] == [False, False]


def test_a_reward_that_raises_stops_before_the_run_directory_exists(rewards_py, tiny_dir, tmp_path, capsys):
    from evolm.commands import main

    code = main(["es", "--config", str(REPO / "configs" / "es-arithmetic.toml"), "--set", f"task.reward='{rewards_py}:boom'", "--set", f"run.out_dir='{tmp_path / 'runs'}'",
                 "--set", f"model.spec='{tiny_dir}'", "--set", "es.prompts_per_iteration=2", "--set", "probe.every=0"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "raised ValueError: no verifier here" in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


# -- the dataset task -------------------------------------------------------------------------------------

ROWS = [{"question": f"What is {i} + {i}?", "answer": str(2 * i), "level": i % 3} for i in range(20)]


def _write(tmp_path: Path, fmt: str, rows=ROWS) -> Path:
    import datasets

    ds = datasets.Dataset.from_list(rows)
    if fmt == "jsonl":
        path = tmp_path / "rows.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        path = tmp_path / "rows.csv"
        ds.to_csv(str(path))
    elif fmt == "parquet":
        path = tmp_path / "rows.parquet"
        ds.to_parquet(str(path))
    elif fmt == "disk":
        path = tmp_path / "saved"
        ds.save_to_disk(str(path))
    else:  # a DatasetDict folder
        path = tmp_path / "saved_dict"
        datasets.DatasetDict({"train": ds.select(range(15)), "test": ds.select(range(15, 20))}).save_to_disk(str(path))
    return path


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "disk", "dict"])
def test_dataset_task_reads_every_format_and_never_shares_a_row(fmt, tmp_path):
    path = _write(tmp_path, fmt)
    params = {"train": str(path), "test": str(path)} if fmt == "dict" else {"path": str(path), "test_fraction": 0.25}
    task = make_task("dataset", system_prompt="", **params, prompt="question")
    train, test = task.examples("train", None), task.examples("test", None)
    assert len(train) + len(test) == 20 and len(test) == 5
    assert not {e.question for e in train} & {e.question for e in test}
    assert str(test[0].answer) == str(int(test[0].question.split()[2]) * 2)
    assert "level" in test[0].meta  # the other columns travel to the reward
    assert task.check(f"<answer>{test[0].answer}</answer>", test[0]).correct


def test_dataset_task_prompts_from_messages_and_templates(tmp_path, tokenizer):
    chat = [{"prompt": [{"role": "user", "content": f"Say {w}"}], "answer": w} for w in ("yes", "no", "maybe", "ok")]
    task = make_task("dataset", path=str(_write(tmp_path, "jsonl", chat)), test_fraction=0.25, system_prompt="Be brief.")
    ex = task.examples("train", 1)[0]
    rendered = task.render_prompt(ex, tokenizer)
    assert "Be brief." in rendered and ex.question in rendered and "<|im_start|>assistant" in rendered
    templated = make_task("dataset", path=str(_write(tmp_path, "parquet")), template="Q: {question}\nA:", checker="number")
    assert templated.examples("test", 1)[0].question.startswith("Q: What is")


def test_dataset_task_bad_input_is_one_line(tmp_path):
    rows = _write(tmp_path, "jsonl")
    with pytest.raises(UserError, match=r"has no column 'prompt' .*its columns are answer, level, question"):
        make_task("dataset", path=str(rows)).examples("train", 1)
    overlap = tmp_path / "test.jsonl"
    overlap.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    with pytest.raises(UserError, match="3 of 3 test rows have a prompt that is also in train"):
        make_task("dataset", train=str(rows), test=str(overlap), prompt="question").examples("train", 1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\nnot json\n')
    with pytest.raises(UserError, match="cannot read .*bad.jsonl"):
        make_task("dataset", path=str(bad)).examples("train", 1)
    with pytest.raises(ConfigError, match="needs its rows"):
        make_task("dataset")


def test_a_malformed_jsonl_line_is_named_in_evolms_line_and_datasets_prints_nothing(tmp_path, capfd):
    """issue 44.5: the error had no line number, and datasets printed 'Generating train split' and its own
    error log before evolm's line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "b", "answer": "2"}\nnot json\n{"prompt": "c"}\n')
    capfd.readouterr()
    with pytest.raises(UserError, match=r"cannot read .*bad.jsonl: line 3 is not a JSON object \(Expecting value"):
        make_task("dataset", path=str(bad)).examples("train", 1)
    good = _write(tmp_path, "csv")
    make_task("dataset", path=str(good), prompt="question").examples("train", 1)
    out, err = capfd.readouterr()
    assert "Generating" not in err + out and "Failed to load" not in err + out, err


def test_dataset_task_with_a_reward_counts_the_threshold_as_correct(tmp_path, rewards_py):
    path = _write(tmp_path, "jsonl")
    task = make_task("dataset", [f"{rewards_py}:length"], path=str(path), prompt="question", correct_threshold=3)
    ex = task.examples("test", 2)
    assert [v.correct for v in task.judge(ex, ["ab", "abc"])] == [False, True]
    exact = make_task("dataset", [f"{rewards_py}:length"], correct=f"{rewards_py}:exact", path=str(path), prompt="question")
    assert [v.correct for v in exact.judge(ex, [str(ex[0].answer), "x"])] == [True, False]


# -- every verb, and Ray, on the plugin's task and reward -----------------------------------------------------

def _plugin_sets(tiny_dir, out: Path, name: str, *extra) -> list[str]:
    sets = [f"model.spec='{tiny_dir}'", f"run.out_dir='{out}'", f"run.name='{name}'", "run.progress=false",
            "task.name='vowel_words'", "task.params={}", "task.reward='vowel_share'", "task.correct='mostly_vowels'",
            "probe.every=0",
            "generation.max_new_tokens=6", "generation.temperature=1.0", "es.population=4", "es.prompts_per_iteration=4",
            "es.iterations=3", "es.sigma=0.02", "es.lr=0.01", "eval.count=4", "eval.n_samples=2", "eval.k=[1, 2]",
            "run.checkpoint_every=0", *extra]
    return [a for s in sets for a in ("--set", s)]


def _weights(directory: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(directory / "model.safetensors"))


@pytest.fixture(scope="module")
def plugin_run(plugin_path, tiny_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("plugin-runs")
    env = child_env(plugin_path)
    evolm_cli(["es", "--config", REPO / "configs" / "es-arithmetic.toml", *_plugin_sets(tiny_dir, out, "es")], env)
    return out / "es", env


@pytest.mark.ray
def test_every_verb_finds_the_plugins_task_and_reward(plugin_run, plugin_path, tiny_dir, tmp_path):
    run, env = plugin_run
    info = json.loads((run / "run.json").read_text())
    assert info["plugins"]["task"]["distribution"] == "evolm-example-plugin"
    seeds = [json.loads(line) for line in (run / "seed_log.jsonl").read_text().splitlines()]
    assert any(r.get("status") == "applied" for r in seeds)  # training changed the weights
    base = _weights(tiny_dir)
    final = _weights(run / "final")
    assert any(not torch.equal(final[k], base[k]) for k in base if k in final)

    # replay rebuilds it bit for bit; eval --like measures it exactly as the run did
    evolm_cli(["replay", run, "--step", 3, "--out", tmp_path / "replayed"], env)
    replayed = _weights(tmp_path / "replayed")
    assert all(torch.equal(replayed[k], final[k]) for k in final)
    evolm_cli(["eval", "--like", run, "--out", tmp_path / "like"], env)
    like = json.loads((tmp_path / "like" / "eval.json").read_text())
    after = json.loads((run / "eval_after.json").read_text())
    assert like["tasks"]["vowel_words"]["summary"] == after["summary"]
    evolm_cli(["analyze", "drift", "--trained", run, "--out", tmp_path / "drift"], env)
    assert any((tmp_path / "drift").iterdir())

    # K = 2 Ray actors import the plugin in their own processes and reach the same weights
    ray_out = tmp_path / "ray"
    evolm_cli(["es", "--config", REPO / "configs" / "es-arithmetic.toml",
               *_plugin_sets(tiny_dir, ray_out, "ray", "distributed.workers=2", "eval.before_after=false")], env)
    ray_final = _weights(ray_out / "ray" / "final")
    assert all(torch.equal(ray_final[k], final[k]) for k in final)

    # a process without the package says which one it needs, in one line
    out = evolm_cli(["replay", run, "--step", 1], child_env(), check=False)
    assert out.returncode == 2 and out.stderr.count("\n") == 1
    assert "evolm-example-plugin 0.1.0" in out.stderr and "pip install evolm-example-plugin==0.1.0" in out.stderr


def test_grpo_trains_on_the_plugins_task_and_trl_takes_the_same_function(plugin_path, tiny_dir, tmp_path, tokenizer):
    env = child_env(plugin_path)
    sets = [a for s in [f"model.spec='{tiny_dir}'", f"run.out_dir='{tmp_path}'", "run.name='grpo'", "run.progress=false",
                        "task.name='vowel_words'", "task.params={}", "probe.every=0", "task.reward='vowel_share'", "grpo.steps=2", "grpo.num_generations=4",
                        "grpo.prompts_per_step=2", "grpo.lr=1e-3", "generation.max_new_tokens=6",
                        "eval.before_after=false", "run.checkpoint_every=0"] for a in ("--set", s)]
    evolm_cli(["grpo", "--config", REPO / "configs" / "grpo-arithmetic.toml", *sets], env)
    base, final = _weights(tiny_dir), _weights(tmp_path / "grpo" / "final")
    assert any(not torch.equal(final[k], base[k]) for k in base if k in final)

    # the very function, handed unchanged to TRL's own GRPOTrainer on a standard (text) dataset
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer
    from transformers import AutoModelForCausalLM

    from evolm_example_plugin.rewards import vowel_share

    calls = []

    def spy(prompts, completions, **columns):
        calls.append((list(prompts), list(completions), sorted(columns)))
        return vowel_share(prompts=prompts, completions=completions, **columns)

    spy.__name__ = "vowel_share"
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), max_steps=1, per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=6, use_cpu=True, bf16=False, report_to=[], logging_steps=1, save_strategy="no")
    data = Dataset.from_list([{"prompt": f"Write a word #{i}.", "target": 0.5} for i in range(4)])
    trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_dir), reward_funcs=[spy], args=args,
                          train_dataset=data, processing_class=tokenizer)
    trainer.train()
    assert calls and all(isinstance(c, str) for c in calls[0][1]) and "target" in calls[0][2]


def test_a_hub_dataset_id_offline_is_one_line():
    with pytest.raises(UserError, match="not a local file or folder, and the Hugging Face hub is unreachable"):
        make_task("dataset", train="some-org/some-dataset").examples("train", 1)


def test_pipelines_and_sweeps_take_the_same_task_and_reward_fields(rewards_py):
    from evolm.pipeline import PipelineJob
    from evolm.sweep import parse_grid

    job = config.from_dict(PipelineJob, {}, [f"task.reward=['{rewards_py}:length', '{rewards_py}:half']",
                                             "task.reward_weights=[1.0, 0.5]"])
    assert job.task.reward_weights == [1.0, 0.5]
    grid = parse_grid([f"task.reward={rewards_py}:length,{rewards_py}:half"])
    assert len(grid["task.reward"]) == 2
    for value in grid["task.reward"]:  # each sweep point's config finds its reward function
        assert config.from_dict(config.ESJob, {}, [f"task.reward='{value}'"]).task.reward == value


def test_a_reward_that_raises_mid_run_skips_that_update_and_the_run_carries_on(tiny_dir, tmp_path):
    from evolm.jobs import run_es

    flaky = write_module(tmp_path / "flaky.py", '''
def reward(prompts, completions, **columns):
    if len(completions) > 2:  # the check before the run scores 2 rows; members score 4
        raise RuntimeError("verifier offline")
    return [0.0] * len(completions)
''')
    cfg = config.from_dict(config.ESJob, {}, [f"model.spec='{tiny_dir}'", f"run.out_dir='{tmp_path}'", "run.name='r'",
                                              "run.progress=false", f"task.reward='{flaky}:reward'", "es.iterations=2",
                                              "es.population=2", "es.prompts_per_iteration=4", "eval.before_after=false",
                                              "probe.every=0", "generation.max_new_tokens=4", "run.checkpoint_every=0"])
    run = run_es(cfg, quiet=True)
    records = run.train_records()
    assert [r["update_status"] for r in records] == ["skipped", "skipped"]
    assert all("verifier offline" in r["message"] for r in records)
    assert run.info()["status"] == "finished"


def test_a_reward_that_scores_no_completion_of_an_update_stops_the_run_in_one_line(tiny_dir, tmp_path):
    from evolm.jobs import run_es

    module = write_module(tmp_path / "nones.py", '''
def never(prompts, completions, **columns):
    return [None] * len(completions)  # "cannot score": every completion, every member

def some(prompts, completions, **columns):
    return [None if i % 2 else 0.5 for i, _ in enumerate(completions)]
''')

    def job(name, reward):
        return config.from_dict(config.ESJob, {}, [
            f"model.spec='{tiny_dir}'", f"run.out_dir='{tmp_path}'", f"run.name='{name}'", "run.progress=false",
            f"task.reward='{module}:{reward}'", "es.iterations=2", "es.population=2", "es.prompts_per_iteration=2",
            "eval.before_after=false", "probe.every=0", "generation.max_new_tokens=4", "run.checkpoint_every=0"])

    with pytest.raises(UserError) as e:
        run_es(job("never", "never"), quiet=True)
    message = str(e.value)
    assert "\n" not in message and f"{module}:never" in message and "update 1" in message
    assert "returned None for every completion" in message and "0.0" in message  # the fix: a number for a wrong answer
    from evolm.runs import RunDir

    info = RunDir.open(tmp_path / "never").info()
    assert info["status"] == "failed" and not RunDir.open(tmp_path / "never").train_records()

    run = run_es(job("some", "some"), quiet=True)  # None for some completions: "does not apply", the run goes on
    assert run.info()["status"] == "finished" and len(run.train_records()) == 2


def test_grpo_stops_too_when_no_completion_of_a_step_is_scored(tmp_path, tokenizer):
    from evolm.grpo import make_reward_fn

    module = write_module(tmp_path / "nones.py", '''
def never(prompts, completions, **columns):
    return [None] * len(completions)

def some(prompts, completions, **columns):
    return [None if i % 2 else 0.5 for i, _ in enumerate(completions)]
''')
    rows = [{"prompt": f"Say {w}", "answer": w} for w in ("yes", "no", "maybe", "ok")]
    data = str(_write(tmp_path, "jsonl", rows))
    ids = [tokenizer("yes", add_special_tokens=False)["input_ids"]] * 2
    some = make_task("dataset", [f"{module}:some"], path=data, test_fraction=0.25)
    fn = make_reward_fn(some, some.examples("train", 2), tokenizer)
    assert fn(["p", "p"], ["c", "c"], ids, [0, 1]) == [0.5, 0.0]
    never = make_task("dataset", [f"{module}:never"], path=data, test_fraction=0.25)
    fn = make_reward_fn(never, never.examples("train", 2), tokenizer)
    with pytest.raises(RewardError, match=r"returned None for every completion .* return 0\.0"):
        fn(["p", "p"], ["c", "c"], ids, [0, 1])


def test_eval_of_a_plugin_task_uses_the_tasks_own_completion_length(plugin_path, tiny_model, tokenizer, capsys):
    """issue 44.5: `evolm eval` on a plugin task generated up to 256 tokens (54 s for 2 problems on a one-word task):
    a task declares its own length (``Task.default_max_new_tokens``, as gsm8k does), and one that declares none
    is evaluated at 256 with a line saying so."""
    from conftest import make_vowel_task
    from evolm.evaluate import default_max_new_tokens, evaluate_model

    assert default_max_new_tokens(make_task("vowel_words")) == 16  # the example plugin's one word
    report = evaluate_model(tiny_model, [make_task("vowel_words")], tokenizer=tokenizer, n=1, ks=[1], limit=1,
                            greedy=False, use_cache=False, progress=False)
    assert report["tasks"]["vowel_words"]["sampling"]["max_new_tokens"] == 16
    assert "default_max_new_tokens" not in capsys.readouterr().err
    undeclared = make_vowel_task()
    assert default_max_new_tokens(undeclared) == 256
    evaluate_model(tiny_model, [undeclared], tokenizer=tokenizer, n=1, ks=[1], limit=1, max_new_tokens=2, greedy=False,
                   use_cache=False, progress=False)
    assert capsys.readouterr().err == ""  # --max-new-tokens given: nothing to say
    evaluate_model(tiny_model, [undeclared], tokenizer=tokenizer, n=1, ks=[1], limit=1, greedy=False, use_cache=False,
                   progress=False)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "task 'vowels' declares no default_max_new_tokens" in err and "256" in err


def test_relative_paths_in_a_config_file_are_found_beside_it(tmp_path, monkeypatch, capsys):
    """issue 44.5: a config's relative paths were read from the working directory, so a config beside its data and
    reward file worked only from its own folder. A relative path that exists beside the file is resolved there;
    one that does not (the shipped configs' repo-relative paths) stays relative to the working directory, as do
    --set values and run.out_dir."""
    from evolm.commands import main

    project = tmp_path / "project"
    project.mkdir()
    write_module(project / "my_rewards.py", REWARDS_PY)
    (project / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (project / "model").mkdir()
    (project / "job.toml").write_text(
        '[run]\nout_dir = "runs"\n[model]\nspec = "model"\n'
        '[task]\nname = "dataset"\nreward = ["my_rewards.py:length"]\nparams = { train = "rows.jsonl" }\n'
        '[eval]\ntask = "arithmetic"\n')
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["config", "es", "--resolve", str(project / "job.toml"), "--set", "task.params.test='held.jsonl'"]) == 0
    resolved = tomllib.loads(capsys.readouterr().out)
    assert resolved["model"]["spec"] == str(project / "model")
    assert resolved["task"]["reward"] == [f"{project / 'my_rewards.py'}:length"]
    assert resolved["task"]["params"] == {"train": str(project / "rows.jsonl"), "test": "held.jsonl"}  # --set: as given
    assert resolved["run"]["out_dir"] == "runs"  # outputs go where the command runs
