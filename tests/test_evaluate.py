"""evaluate_task and the ``evolm eval`` verb: scoring, the generation cache (hits, resume, torn lines),
output files, and the command line on a tiny model saved to disk."""

from __future__ import annotations

import hashlib
import json
import random

import pytest
import torch

from evolm import metrics
from evolm.backends.base import Completion, Generator, SamplingParams
from evolm.evaluate import GenerationCache, evaluate_model, evaluate_task, summarize
from evolm.rewards import Verdict
from evolm.tasks.base import Example, Task
from test_eval_tasks import MC_DOCS, write_olmo_requests


class LetterTask(Task):
    """Toy task: the gold answer is a letter; a completion answers with its first character."""

    name = "letters"

    def examples(self, split, count, seed=0):
        rng = random.Random(seed)
        return [Example(id=f"p{i}", question=f"Problem {i}: say a letter.", answer=rng.choice("abc")) for i in range(count or 6)]

    def extract_answer(self, completion):
        return completion[:1] or None

    def check(self, completion, example):
        answer = self.extract_answer(completion)
        return Verdict(format_ok=answer is not None, correct=answer == example.answer, answer=answer)


class FakeGenerator(Generator):
    """Deterministic in (prompt, seed, sample index); counts the prompts it was asked for; can fail on cue."""

    def __init__(self, batch_size=4, fail_after_calls=None):
        self.batch_size = batch_size
        self.calls = 0
        self.prompts = 0
        self.fail_after_calls = fail_after_calls

    def generate(self, prompts, params):
        if self.fail_after_calls is not None and self.calls >= self.fail_after_calls:
            raise KeyboardInterrupt("killed")
        self.calls += 1
        self.prompts += len(prompts)
        out = []
        for p in prompts:
            comps = []
            for j in range(params.n):
                h = hashlib.sha256(f"{p}|{params.seed if not params.greedy else 0}|{j}".encode()).digest()
                text = "abcd"[h[0] % 4] + " is my answer"
                comps.append(Completion(text=text, num_tokens=1 + h[1] % 5, entropy=h[2] / 100, finished=h[3] % 2 == 0))
            out.append(comps)
        return out


def run(gen, cache=None, count=6, n=4, greedy=False, seed=0):
    task = LetterTask()
    return evaluate_task(gen, task, None, task.examples("test", count), SamplingParams(n=n, temperature=1.0, seed=seed),
                         ks=[1, 2, 4], cache=cache, progress=False, greedy=greedy)


def test_evaluate_task_scores_and_summarises():
    gen = FakeGenerator(batch_size=8)
    result = run(gen, greedy=True)
    assert len(result.problems) == 6 and all(p.n == 4 for p in result.problems)
    assert gen.calls == 3 + 1  # 8 // 4 = 2 prompts per call, then one greedy batch
    s = result.summary
    ns, cs = [p.n for p in result.problems], [p.c for p in result.problems]
    assert s["pass@1"] == pytest.approx(metrics.pass_at_k(ns, cs, 1)) == pytest.approx(s["mean_correct"])
    assert s["pass@4"] == pytest.approx(sum(c > 0 for c in cs) / 6) == pytest.approx(s["solved"])
    assert s["maj@2"] == pytest.approx(metrics.maj_at_k([p.answers for p in result.problems], [p.correct for p in result.problems], 2))
    ent = [e for p in result.problems for e in p.entropy]
    tok = [t for p in result.problems for t in p.num_tokens]
    assert s["entropy"] == pytest.approx(sum(e * t for e, t in zip(ent, tok)) / sum(tok))
    assert "greedy" in s and all(p.greedy_correct is not None for p in result.problems)
    assert s["greedy_correct"] == sum(p.greedy_correct for p in result.problems) == round(s["greedy"] * 6)
    assert s["format_rate"] == 1.0
    json.dumps(result.to_dict())


def test_k_above_n_is_refused():
    from evolm.errors import UserError

    task = LetterTask()
    with pytest.raises(UserError, match="n = 4"):
        evaluate_task(FakeGenerator(), task, None, task.examples("test", 2), SamplingParams(n=4, temperature=1.0), ks=[1, 8],
                      progress=False)


def test_cache_hit_on_rerun(tmp_path):
    cache = GenerationCache(tmp_path, "fp0")
    first = run(FakeGenerator(), cache=cache, greedy=True)
    gen = FakeGenerator()
    again = run(gen, cache=GenerationCache(tmp_path, "fp0"), greedy=True)
    assert gen.calls == 0 and again.generated == 0 and first.generated == 6 * 4 + 6
    assert [p.to_dict() for p in again.problems] == [p.to_dict() for p in first.problems]
    # another model fingerprint, seed or n is another cache entry
    for kwargs, fp in (({}, "fp1"), ({"seed": 1}, "fp0"), ({"n": 2}, "fp0")):
        gen = FakeGenerator()
        other = GenerationCache(tmp_path, fp)
        task = LetterTask()
        evaluate_task(gen, task, None, task.examples("test", 6), SamplingParams(n=kwargs.get("n", 4), temperature=1.0,
                      seed=kwargs.get("seed", 0)), ks=[1], cache=other, progress=False)
        assert gen.prompts == 6


def test_resume_after_a_kill_regenerates_only_the_rest(tmp_path):
    reference = run(FakeGenerator(batch_size=4), count=8)  # 1 prompt per call at n=4
    cache = GenerationCache(tmp_path, "fp")
    with pytest.raises(KeyboardInterrupt):
        run(FakeGenerator(batch_size=4, fail_after_calls=3), cache=cache, count=8)
    table = next((tmp_path / "fp" / "letters").glob("*.jsonl"))
    assert len(table.read_text().splitlines()) == 3  # each finished batch was written at once
    with open(table, "a") as f:
        f.write('{"id": "p3", "prompt": "tor')  # a torn line, as left by a kill mid-write
    gen = FakeGenerator(batch_size=4)
    resumed = run(gen, cache=GenerationCache(tmp_path, "fp"), count=8)
    assert gen.prompts == 5 and resumed.generated == 5 * 4
    assert [p.to_dict() for p in resumed.problems] == [p.to_dict() for p in reference.problems]
    assert len(GenerationCache(tmp_path, "fp").table("letters", SamplingParams(n=4, temperature=1.0))) == 8


def test_summary_handles_problems_without_answers():
    task = LetterTask()
    ex = task.examples("test", 1)[0]

    class Silent(FakeGenerator):
        def generate(self, prompts, params):
            return [[Completion(text="", num_tokens=3, entropy=0.5, finished=False) for _ in range(params.n)] for _ in prompts]

    r = evaluate_task(Silent(), task, None, [ex], SamplingParams(n=2, temperature=1.0), ks=[1, 2], progress=False)
    assert r.summary["pass@2"] == 0 and r.summary["maj@2"] == 0 and r.summary["format_rate"] == 0
    assert r.summary["truncated"] == 1.0 and r.summary["distinct_correct"] == 0
    assert summarize([], [1]) == {"problems": 0}


# -- the real HF backend on the tiny model ------------------------------------------------------------


def test_generation_entropy_matches_a_second_forward_pass(tiny_model, tokenizer):
    """The entropy recorded during sampling equals the one recomputed from the logits afterwards."""
    from evolm.backends.hf import HFGenerator

    captured = {}
    original = tiny_model.generate

    def spy(*args, **kwargs):
        captured["out"] = original(*args, **kwargs)
        captured["prompt_len"] = kwargs["input_ids"].shape[1]
        return captured["out"]

    tiny_model.generate = spy
    gen = HFGenerator(tiny_model, tokenizer, batch_size=4)
    temperature = 0.7
    comps = gen.generate(["Count: one, two,"], SamplingParams(n=3, temperature=temperature, max_new_tokens=6, seed=5,
                                                              return_entropy=True))[0]
    out, start = captured["out"], captured["prompt_len"]
    with torch.no_grad():
        logits = tiny_model(out).logits.float()
    for row, comp in enumerate(comps):
        logp = torch.log_softmax(logits[row, start - 1:start - 1 + comp.num_tokens] / temperature, dim=-1)
        expected = float((-(logp.exp() * logp).sum(-1)).mean())
        assert comp.entropy == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_evaluate_model_writes_outputs(tiny_model, tokenizer, tmp_path):
    fixture = write_olmo_requests(tmp_path / "data" / "requests.jsonl.gz", MC_DOCS)
    report = evaluate_model(tiny_model, ["csqa"], tokenizer=tokenizer, n=4, ks=[1, 2, 4], max_new_tokens=6, limit=3,
                            task_params={"csqa": {"path": str(fixture)}}, out_dir=tmp_path / "out",
                            cache_dir=tmp_path / "cache", batch_size=8, progress=False)
    out = tmp_path / "out"
    saved = json.loads((out / "eval.json").read_text())
    assert saved["tasks"]["csqa"]["summary"] == pytest.approx(report["tasks"]["csqa"]["summary"], nan_ok=True)
    problems = saved["tasks"]["csqa"]["problems"]
    assert [p["id"] for p in problems] == ["q-kettle", "q-umbrella", "q-night"]
    assert all(p["n"] == 4 and len(p["answers"]) == 4 and 0 <= p["c"] <= 4 for p in problems)
    assert "question" not in json.dumps(saved)  # problem texts are never written
    assert saved["tasks"]["csqa"]["summary"]["chance_pass@4"] == pytest.approx(1 - 0.8 ** 4)  # five choices
    assert "| csqa | 3 | 4 |" in (out / "eval.md").read_text()
    assert (out / "passk.png").read_bytes()[:4] == b"\x89PNG"
    # same model, same settings: everything comes from the cache, identical numbers
    again = evaluate_model(tiny_model, ["csqa"], tokenizer=tokenizer, n=4, ks=[1, 2, 4], max_new_tokens=6, limit=3,
                           task_params={"csqa": {"path": str(fixture)}}, cache_dir=tmp_path / "cache", batch_size=8,
                           progress=False)
    assert again["tasks"]["csqa"]["generated"] == 0
    assert again["tasks"]["csqa"]["problems"] == report["tasks"]["csqa"]["problems"]


# -- the command line -----------------------------------------------------------------------------------


@pytest.fixture
def saved_tiny(tiny_model, tokenizer, tmp_path):
    run_dir = tmp_path / "run"
    tiny_model.save_pretrained(run_dir / "final")
    tokenizer.save_pretrained(run_dir / "final")
    return run_dir


def test_cli_eval_on_a_run_directory(saved_tiny, tmp_path, capsys, monkeypatch):
    from evolm.commands import main

    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    fixture = write_olmo_requests(tmp_path / "data" / "requests.jsonl.gz", MC_DOCS)
    argv = ["eval", "--model", str(saved_tiny), "--tasks", "csqa", "--task-param", f"csqa.path={fixture}", "--n", "4",
            "--k", "1,4", "--limit", "2", "--max-new-tokens", "5", "--no-progress"]
    assert main(argv) == 0
    (out,) = (saved_tiny / "eval").iterdir()  # a run directory's default output place: a new directory per call
    assert out.name.endswith("-csqa")
    report = json.loads((out / "eval.json").read_text())
    assert report["tasks"]["csqa"]["generated"] == 2 * 4 + 2
    assert set(report["tasks"]["csqa"]["summary"]) >= {"pass@1", "pass@4", "maj@4", "greedy", "entropy", "distinct_correct"}
    assert "pass@4" in capsys.readouterr().out
    assert main(argv + ["--out", str(tmp_path / "second")]) == 0
    assert json.loads((tmp_path / "second" / "eval.json").read_text())["tasks"]["csqa"]["generated"] == 0


def test_cli_eval_user_errors_are_one_line(saved_tiny, tmp_path, capsys, monkeypatch):
    from evolm.commands import main

    monkeypatch.setenv("EVOLM_CACHE", str(tmp_path / "cache"))
    base = ["eval", "--model", str(saved_tiny), "--no-progress", "--out", str(tmp_path / "o")]
    for extra, message in ((["--tasks", "gpqa"], "gpqa"), (["--tasks", "csqa", "--n", "4", "--k", "1,8"], "k values [8]"),
                           (["--tasks", "nosuchtask"], "unknown task"), (["--tasks", "csqa", "--task-param", "csqa"], "TASK.KEY=VALUE")):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("evolm: error:") and message in err and "\n" not in err


def test_eval_help_is_fast_to_build():
    from evolm.commands import build_parser

    text = build_parser().format_help()
    assert "eval" in text


@pytest.mark.slow
def test_real_model_states_letters_on_arc_easy(tmp_path):
    """SmolLM2-135M-Instruct follows the multiple-choice answer format (it need not be right)."""
    from evolm import models
    from evolm.backends.hf import HFGenerator
    from evolm.tasks import make_task

    model, tokenizer = models.load(models.DEFAULT_MODEL, threads=1)
    task = make_task("arc_easy")
    result = evaluate_task(HFGenerator(model, tokenizer, batch_size=16), task, tokenizer, task.examples("test", 6, seed=0),
                           SamplingParams(n=2, temperature=0.7, max_new_tokens=16), ks=[1, 2], progress=False, greedy=True)
    assert result.summary["format_rate"] >= 0.5
    assert all(a is None or a in "ABCDE" for p in result.problems for a in p.answers)
