"""``evolm eval --like RUN_DIR`` reproduces a run's held-out evaluation bit for bit, evaluations never
overwrite each other, and analyses re-evaluate on the run's held-out problems by default.

The run is made the way a user makes one: ``evolm es --config FILE`` on a model directory (a tiny
random llama saved with the real tokenizer), on the registered arithmetic task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import make_tiny_model
from evolm import config
from evolm.commands import main
from evolm.runs import RunDir


@pytest.fixture
def es_run(tmp_path, tokenizer) -> tuple[Path, Path]:
    """(run directory, base model directory) of a finished 2-update ES run with before/after evaluation."""
    base = tmp_path / "base"
    make_tiny_model(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    cfg = config.ESJob()
    cfg.run.out_dir, cfg.run.name, cfg.run.progress, cfg.run.checkpoint_every, cfg.run.seed = str(tmp_path), "es", False, 0, 3
    cfg.model.spec = str(base)
    cfg.task.name, cfg.task.params = "arithmetic", {"digits": 1}
    cfg.generation.max_new_tokens, cfg.generation.batch_size = 6, 4  # 2 problems x 2 samples per generator call
    cfg.es.population, cfg.es.prompts_per_iteration, cfg.es.iterations, cfg.es.sigma, cfg.es.lr = 4, 2, 2, 0.05, 0.05
    cfg.eval.count, cfg.eval.n_samples, cfg.eval.k, cfg.eval.temperature = 5, 2, [1, 2], 1.3
    path = tmp_path / "es.toml"
    path.write_text(config.to_toml(cfg))
    assert main(["es", "--config", str(path)]) == 0
    return tmp_path / "es", base


def _only_task(out: Path) -> dict:
    (result,) = json.loads((out / "eval.json").read_text())["tasks"].values()
    return result


def _new_eval_dirs(run: Path, before: set) -> list[Path]:
    return sorted(p for p in (run / "eval").iterdir() if p not in before)


def test_eval_like_reproduces_the_runs_after_and_before_evaluations_exactly(es_run, capsys):
    run, base = es_run
    after = json.loads((run / "eval_after.json").read_text())
    before = json.loads((run / "eval_before.json").read_text())
    capsys.readouterr()
    assert main(["eval", "--like", str(run), "--no-progress"]) == 0
    assert "the same summary, exactly" in capsys.readouterr().out
    (out,) = _new_eval_dirs(run, set())
    result = _only_task(out)
    assert result["summary"] == after["summary"]  # every float, bit for bit
    assert result["problems"] == after["problems"]  # the same problems, answers, entropies, lengths
    assert result["sampling"] == after["sampling"] and result["task"] == "arithmetic"
    settings = json.loads((out / "eval.json").read_text())["settings"]
    assert settings["like"] == str(run) and settings["n"] == 2 and settings["limit"] == 5

    # the base model, measured like the run: eval_before.json again, in a new directory
    assert main(["eval", "--like", str(run), "--model", str(base), "--no-progress"]) == 0
    (out2,) = _new_eval_dirs(run, {out})
    assert out2.name.endswith("-like-base")
    assert _only_task(out2)["summary"] == before["summary"]
    assert json.loads((out / "eval.json").read_text())["tasks"]["arithmetic"]["summary"] == after["summary"], \
        "the first evaluation is still there"


def test_eval_like_refuses_options_it_takes_from_the_run_and_outputs_never_overwrite(es_run, capsys, tmp_path):
    run, _ = es_run
    assert main(["eval", "--like", str(run), "--n", "4", "--seed", "1", "--temperature", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("evolm: error: --like takes") and "drop --temperature, --seed" in err and err.count("\n") == 1
    assert main(["eval", "--like", str(run), "--n", "2", "--k", "1,4"]) == 2  # k beyond the samples per problem
    err = capsys.readouterr().err
    assert "--k 4 is outside 1..2" in err and "raise --n" in err and err.count("\n") == 1
    out = tmp_path / "mine"
    assert main(["eval", "--like", str(run), "--out", str(out), "--no-progress"]) == 0
    first = (out / "eval.json").read_text()
    assert main(["eval", "--like", str(run), "--out", str(out), "--no-progress"]) == 2
    assert "already holds an evaluation" in capsys.readouterr().err
    assert (out / "eval.json").read_text() == first
    assert main(["eval", "--like", str(tmp_path / "nowhere")]) == 2


def test_eval_like_with_more_samples_keeps_the_runs_problems_and_reaches_a_larger_k(es_run, capsys):
    run, _ = es_run
    after = json.loads((run / "eval_after.json").read_text())
    assert main(["eval", "--like", str(run), "--n", "4", "--k", "1,2,4", "--no-progress"]) == 0
    assert "the same summary" not in capsys.readouterr().out  # no claim to reproduce the run's evaluation
    (out,) = _new_eval_dirs(run, set())
    result = _only_task(out)
    assert [p["id"] for p in result["problems"]] == [p["id"] for p in after["problems"]], "the run's problems"
    assert [p["n"] for p in result["problems"]] == [4] * 5 and "pass@4" in result["summary"]
    assert [p["greedy_correct"] for p in result["problems"]] == [p["greedy_correct"] for p in after["problems"]], \
        "the same greedy pass (temperature 0 does not depend on n)"
    settings = json.loads((out / "eval.json").read_text())["settings"]
    assert settings["n"] == 4 and settings["ks"] == [1, 2, 4]
    # --n alone keeps the run's k values that fit
    assert main(["eval", "--like", str(run), "--n", "1", "--no-progress"]) == 0
    (out2,) = _new_eval_dirs(run, {out})
    assert json.loads((out2 / "eval.json").read_text())["settings"]["ks"] == [1]


def test_plain_evals_of_a_run_go_to_new_directories_and_the_report_reads_them_all(es_run, tmp_path):
    run, _ = es_run
    common = ["--n", "2", "--k", "1,2", "--limit", "2", "--max-new-tokens", "4", "--no-progress", "--no-cache"]
    assert main(["eval", "--model", str(run), "--tasks", "arithmetic", *common]) == 0
    assert main(["eval", "--model", str(run), "--tasks", "countdown", *common]) == 0
    dirs = sorted((run / "eval").iterdir())
    assert len(dirs) == 2 and {_only_task(d)["task"] for d in dirs} == {"arithmetic", "countdown"}, \
        "evaluating countdown after arithmetic keeps the arithmetic results"
    from evolm.report.read import Reader, gather

    src = gather([str(run)], {}, Reader())
    assert sorted(t for _, _, r in src.evals for t in r["tasks"]) == ["arithmetic", "countdown"]


def test_analysis_re_evaluates_on_the_runs_held_out_problems_by_default(es_run, tmp_path):
    run, base = es_run
    out = tmp_path / "sparsity"
    scale = ["--tau-scale", "0.01"]  # the tiny run's updates may all be skipped (no fitness signal): no seed-log scale
    assert main(["analyze", "sparsity", "--trained", str(run), "--multipliers", "1", *scale, "--out", str(out)]) == 0
    setup = json.loads((out / "sparsity.json").read_text())["evaluation"]
    after = json.loads((run / "eval_after.json").read_text())
    assert setup["problems_from"].startswith("the run's held-out evaluation")
    assert setup["task"] == after["task"] and setup["num_examples"] == 5 and setup["max_new_tokens"] == 6
    assert setup["problem_ids"] == [p["id"] for p in after["problems"]]
    # an explicit --seed or --limit chooses other problems, as before
    assert main(["analyze", "sparsity", "--trained", str(run), "--multipliers", "1", *scale, "--seed", "0", "--limit", "3",
                 "--out", str(tmp_path / "s2")]) == 0
    setup2 = json.loads((tmp_path / "s2" / "sparsity.json").read_text())["evaluation"]
    assert setup2["num_examples"] == 3 and "problems_from" not in setup2
    assert RunDir.open(run).state() == "finished"


def test_eval_like_reproduces_a_grpo_runs_after_evaluation(tmp_path, tokenizer, capsys):
    pytest.importorskip("trl")
    import test_grpo  # registers the toy_letter task

    from evolm.jobs import run_grpo

    base = tmp_path / "base"
    make_tiny_model(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    cfg = test_grpo.tiny_cfg(tmp_path, probe_every=0)
    cfg.model.spec, cfg.run.checkpoint_every = str(base), 0
    cfg.eval.before_after, cfg.eval.count, cfg.eval.n_samples, cfg.eval.k, cfg.eval.max_new_tokens = True, 3, 2, [1, 2], 6
    run = run_grpo(cfg, quiet=True)
    capsys.readouterr()
    assert main(["eval", "--like", str(run.path), "--no-progress"]) == 0
    assert "the same summary, exactly" in capsys.readouterr().out
    (out,) = (run.path / "eval").iterdir()
    assert _only_task(out)["summary"] == run.evaluation("after")["summary"]


def test_the_like_table_names_the_runs_seed_and_its_derivation():
    """issue 44.5: eval --like printed 'seed 0' while sampling with seeds derived from the run's run.seed."""
    from evolm.evaluate import markdown_table

    summary = {"problems": 2, "n": 1, "greedy": 0.5, "pass@1": 0.5, "entropy": 0.1, "distinct_correct": 0.5,
               "format_rate": 1.0, "mean_tokens": 3.0, "truncated": 0.0}
    report = {"model": {"spec": "runs/a", "fingerprint": "f"}, "tasks": {"arithmetic": {"summary": summary}},
              "settings": {"like": "runs/a", "n": 1, "ks": [1], "temperature": 1.0, "top_p": 1.0, "split": "test",
                           "seed": 7, "greedy": True,
                           "seed_derivation": "the run's held-out evaluation: problems seed31(run.seed, 'heldout', task), "
                                              "sampling seed31(run.seed, 'heldout-sampling')"}}
    head = markdown_table(report).split("\n\n")[1]
    assert "run.seed 7 of runs/a (problems seed31(run.seed, 'heldout', task), sampling seed31(run.seed, " \
           "'heldout-sampling'))" in head
    assert "seed 7;" not in head
