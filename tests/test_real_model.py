"""The real default model (SmolLM2-135M-Instruct) end to end. Marked slow; the ``ci`` ones run in CI."""

from __future__ import annotations

import json

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.mark.ci
def test_two_es_iterations_on_the_default_model(tmp_path):
    from evolm import config
    from evolm.jobs import run_es
    from evolm.models import load

    cfg = config.from_dict(config.ESJob, {}, [
        f"run.out_dir='{tmp_path}'", "run.name='real'", "run.progress=false", "run.checkpoint_every=1",
        "es.iterations=2", "es.population=2", "es.prompts_per_iteration=2", "generation.max_new_tokens=12",
        "eval.count=2", "eval.n_samples=2", "eval.k=[1,2]"])
    model, tokenizer = load(cfg.model.spec, threads=1)
    base = {n: p.detach().clone() for n, p in model.named_parameters()}
    run = run_es(cfg, model=model, tokenizer=tokenizer, quiet=True)

    train = [r for r in run.metrics() if r.get("kind") == "train"]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["gen_tokens"] > 0 and r["seconds_generate"] > 0 for r in train)
    moved = [n for n, p in model.named_parameters() if not torch.equal(p, base[n])]
    applied = [r for r in train if r["update_status"] == "applied"]
    assert bool(moved) == bool(applied)  # weights move exactly when an update was applied
    before = json.loads((run.path / "eval_before.json").read_text())["summary"]
    assert {"greedy", "pass@1", "pass@2", "entropy"} <= set(before)
    # the final weights load back through the model loader and equal the trained model
    reloaded, _ = load(str(run.path), threads=1)
    for (n, p), (_, q) in zip(model.named_parameters(), reloaded.named_parameters()):
        assert torch.equal(p, q), n


@pytest.mark.ci
def test_demo_cli_runs_end_to_end_with_a_tiny_budget(tmp_path, capsys):
    from evolm.commands import main

    code = main(["demo", "--set", f"run.out_dir='{tmp_path}'", "--set", "es.iterations=1", "--set", "es.population=2",
                 "--set", "es.prompts_per_iteration=2", "--set", "eval.count=2", "--set", "eval.n_samples=2",
                 "--set", "eval.k=[1,2]", "--set", "run.progress=false"])
    out = capsys.readouterr().out
    assert code == 0
    assert "greedy accuracy" in out and "pass@2 (T=1)" in out and "run directory:" in out
    lines = out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("[evolm] run directory: "))
    assert first < next(i for i, line in enumerate(lines) if "held-out evaluation (before)" in line)
    meaning = lines[lines.index("What these numbers mean:"):]
    assert meaning[1].startswith("- held-out (the table): 2 test problems")
    assert meaning[2].startswith("- training reward: the population's mean reward on each update's own minibatch")
    assert "not a before/after comparison" in meaning[2] and "evolm eval --like" in meaning[3]
    assert lines.index("What these numbers mean:") > max(i for i, line in enumerate(lines) if line.startswith("greedy accuracy"))

    # a new user reproduces the run's held-out numbers exactly, on the real model and its real prompts
    run_dir = lines[first].split(": ", 1)[1]
    assert main(["eval", "--like", run_dir, "--no-progress"]) == 0
    assert "the same summary, exactly" in capsys.readouterr().out
    after = json.loads((tmp_path / run_dir / "eval_after.json").read_text())
    (like,) = [json.loads((d / "eval.json").read_text()) for d in (tmp_path / run_dir / "eval").iterdir()]
    assert like["tasks"][after["task"]]["summary"] == after["summary"]


def test_shared_prefix_cache_gives_the_plain_greedy_completions_on_the_default_model():
    """Real prompts with a shared prefix (the arithmetic task's chat-templated system message and demonstration;
    Qiu et al.'s Countdown context): greedy completions with the prefix cache equal plain left padding's, and
    the first-step logits differ only by the split prefill's rounding."""
    from test_backends import _plain_and_cached
    from test_countdown_data import QIU_CONTEXT

    from evolm.models import load
    from evolm.tasks import make_task

    model, tokenizer = load("smollm2-135m", threads=1)
    task = make_task("arithmetic", digits=2, operators="+")
    arithmetic = [task.render_prompt(ex, tokenizer) for ex in task.examples("train", 12, seed=0)]
    countdown = [QIU_CONTEXT.format(spaced=" ".join(map(str, nums)), target=t)
                 for nums, t in (([19, 36, 55], 72), ([3, 85, 47, 9], 41), ([8, 2, 61], 67), ([44, 19, 35], 98))]
    for prompts in (arithmetic, countdown):
        (logits_a, out_a), (logits_b, out_b), used = _plain_and_cached(model, tokenizer, prompts, batch_size=16, max_new_tokens=16)
        assert used and used[0] >= 16
        assert (logits_a - logits_b).abs().max() < 1e-3  # seen: 0 (arithmetic), 3.8e-5 (countdown) on logits up to ~40
        assert [[c.text for c in row] for row in out_a] == [[c.text for c in row] for row in out_b]
