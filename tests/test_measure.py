"""ES population measurements on a tiny random llama: Lemma-2 diversity and the update-estimate spread.

The vowel toy task (conftest) counts a completion correct when at least half its letters are vowels,
which a random model never reaches; "vowels-third" lowers the bar to a third so members and the
centre have success probabilities strictly between 0 and 1.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import make_tiny_model, make_vowel_task
from evolm import config
from evolm.analysis.diversity import diversity_report, null_js_divergence, verifier_js_divergence
from evolm.analysis.update_variance import update_spread
from evolm.backends.hf import HFGenerator
from evolm.es.engine import build_paramset
from evolm.es.measure import coordinate_subset, population_correctness, subset_update, update_samples
from evolm.tasks import TASKS

for _task in (make_vowel_task(), make_vowel_task(1 / 3)):
    TASKS.setdefault(_task.name, type(_task))
LowVowels = TASKS["vowels-third"]


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture
def setup(tokenizer):
    model = make_tiny_model(tokenizer)
    cfg = config.from_dict(config.ESJob, {"task": {"name": "vowels"}, "es": {"noise_table_size": 1 << 22}})
    return model, build_paramset(model, cfg), HFGenerator(model, tokenizer, 32)


def test_identical_members_give_zero_jsd_and_weights_stay_bit_exact(setup, tokenizer):
    model, params, gen = setup
    task = LowVowels()
    examples = task.examples("test", 5)
    before = _snapshot(model)
    # sigma = 0: every member is the centre; with one shared sampling seed their samples are identical
    same = population_correctness(params, gen, task, tokenizer, examples, sigma=0.0, population=3, samples_per_member=2,
                                  temperature=1.0, max_new_tokens=6, common_random_numbers=True)
    assert np.array(same["member_correct"]).shape == (3, 5, 2) and np.array(same["center_correct"]).shape == (5, 6)
    assert same["member_correct"][0] == same["member_correct"][1] == same["member_correct"][2]
    r = diversity_report(same)
    assert r["js_divergence"] == 0.0 and r["num_members"] == 3 and r["center_samples"] == 3
    # greedy members with a perturbation far below float32 resolution coincide too
    greedy = population_correctness(params, gen, task, tokenizer, examples, sigma=1e-12, population=3,
                                     temperature=0.0, max_new_tokens=6, center_samples=1)
    assert diversity_report(greedy)["js_divergence"] == 0.0 and greedy["weights_unchanged"]
    # a large perturbation at temperature 1 with independent seeds: members differ
    far = population_correctness(params, gen, task, tokenizer, examples, sigma=0.5, population=3, samples_per_member=2,
                                 temperature=1.0, max_new_tokens=6)
    assert far["member_correct"] != same["member_correct"]
    assert 0.0 <= diversity_report(far)["js_divergence"] <= np.log(2)
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n


def test_member_bookkeeping_against_manual_perturbation(setup, tokenizer):
    """Member i of the runner is exactly theta + sigma * eps(key 0, direction i), generated with its own seed."""
    from evolm.backends.base import SamplingParams
    from evolm.seeding import derive_seed

    model, params, gen = setup
    task = LowVowels()
    examples = task.examples("test", 3)
    out = population_correctness(params, gen, task, tokenizer, examples, sigma=0.3, estimator="antithetic", population=4,
                                 samples_per_member=2, temperature=1.0, max_new_tokens=5, seed=7)
    assert out["layout"] == [(0, 1), (0, -1), (1, 1), (1, -1)]
    prompts = [task.render_prompt(e, tokenizer) for e in examples]
    params.perturb(0, 1, -1, 0.3)  # member 3
    try:
        manual = gen.generate(prompts, SamplingParams(n=2, temperature=1.0, max_new_tokens=5,
                                                      seed=derive_seed(7, "diversity-sampling", "member", 3) % 2**31))
    finally:
        params.restore()
    assert out["member_correct"][3] == [[int(task.is_correct(c.text, e)) for c in cs] for e, cs in zip(examples, manual)]


def test_null_jsd_baseline_splits_the_centre():
    center = [[1, 1, 0, 0], [1, 0, 1, 0]]
    # two pseudo-members of two samples: prompt 0 -> p = (1, 0), prompt 1 -> (0.5, 0.5)
    assert null_js_divergence(center, 2, 2) == pytest.approx(verifier_js_divergence([[1.0, 0.5], [0.0, 0.5]]))
    assert null_js_divergence(center, 3, 2) is None
    per = null_js_divergence(center, 2, 2, per_prompt=True)  # prompt 0: JSD of (1, 0) = ln 2; prompt 1: 0
    assert per == pytest.approx([np.log(2), 0.0]) and np.mean(per) == pytest.approx(null_js_divergence(center, 2, 2))
    r = diversity_report({"member_correct": [[[1, 1], [0, 1]], [[0, 0], [1, 0]]], "center_correct": center})
    assert len(r["js_divergence_null_per_prompt"]) == len(r["js_divergence_per_prompt"]) == 2


def test_update_subset_matches_apply_update(setup, tokenizer):
    model, params, gen = setup
    subset = coordinate_subset(params, 2000, seed=1)
    assert subset.size == 2000 and subset.total == params.numel
    coefficients, scale = [0.5, -1.0, 2.0], 1e-2
    vec = subset_update(params, 3, coefficients, scale, subset)
    before = [t.clone() for t in params.tensors]
    params.apply_update(3, coefficients, scale)
    delta = np.concatenate([(t.view(-1)[idx] - b.view(-1)[idx]).numpy() for t, b, idx in
                            zip(params.tensors, before, subset.per_tensor)])
    assert np.allclose(vec, delta, atol=1e-7) and np.abs(vec).max() > 0
    everything = coordinate_subset(params, 10**9)
    assert everything.size == params.numel


def test_update_samples_on_a_tiny_model(setup, tokenizer):
    from evolm.backends.base import SamplingParams

    model, params, gen = setup
    task = TASKS["vowels"]()
    examples = task.examples("train", 4)
    before = _snapshot(model)
    sampling = SamplingParams(n=1, temperature=0.0, max_new_tokens=4)
    samples = {}
    for est in ("one_point", "antithetic"):
        s = update_samples(params, gen, task, tokenizer, examples, estimator=est, population=4, sigma=0.05, lr=0.01,
                           repeats=3, coords=3000, sampling=sampling)
        assert s["vectors"].shape == (3, 3000) and s["status"] == ["applied"] * 3 and s["weights_unchanged"]
        assert all(len(f) == 4 for f in s["fitness"])
        spread = update_spread(s["vectors"])
        assert -1 <= spread["mean_pairwise_cosine"] <= 1 and spread["relative_variance"] > 0
        samples[est] = s
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n
    # the same keys give the same updates: the estimate is a function of (weights, prompts, noise key)
    again = update_samples(params, gen, task, tokenizer, examples, estimator="antithetic", population=4, sigma=0.05,
                           lr=0.01, repeats=2, coords=3000, sampling=sampling)
    assert np.array_equal(again["vectors"], samples["antithetic"]["vectors"][:2])
    assert not np.array_equal(samples["antithetic"]["vectors"][0], samples["antithetic"]["vectors"][1])


@pytest.fixture
def saved_tiny(tmp_path, tokenizer):
    model = make_tiny_model(tokenizer)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    return tmp_path / "tiny"


def test_cli_diversity_and_update_variance(saved_tiny, tmp_path, capsys):
    from evolm.commands import main

    out = tmp_path / "an"
    assert main(["analyze", "diversity", "--model", str(saved_tiny), "--task", "vowels-third", "--population", "3",
                 "--sigma", "0.3", "--count", "3", "--samples-per-member", "2", "--max-new-tokens", "5", "--noise", "stream",
                 "--out", str(out)]) == 0
    r = json.loads((out / "diversity.json").read_text())
    assert r["setup"]["sigma"] == 0.3 and r["num_members"] == 3 and r["center_samples_per_prompt"] == 6
    assert r["js_divergence_null"] is not None and r["weights_unchanged"] is True
    assert (out / "diversity.png").stat().st_size > 1000
    # the samples file re-analyses to the same numbers
    assert main(["analyze", "diversity", "--from", str(out / "diversity_samples.json"), "--out", str(tmp_path / "again")]) == 0
    again = json.loads((tmp_path / "again" / "diversity.json").read_text())
    assert again["population"] == r["population"] and again["js_divergence"] == r["js_divergence"]

    assert main(["analyze", "update-variance", "--model", str(saved_tiny), "--task", "vowels", "--population", "4",
                 "--sigma", "0.05", "--repeats", "2", "--count", "3", "--coords", "1000", "--max-new-tokens", "4", "--noise", "stream",
                 "--out", str(out)]) == 0
    u = json.loads((out / "update_variance.json").read_text())
    assert set(u["estimators"]) == {"one_point", "antithetic"} and u["setup"]["coordinates"] == 1000
    assert u["estimators"]["antithetic"]["directions_per_update"] == 2 and (out / "update_variance.png").exists()

    capsys.readouterr()
    assert main(["analyze", "diversity", "--model", str(saved_tiny), "--task", "vowels", "--temperature", "0",
                 "--samples-per-member", "2", "--out", str(out)]) == 2
    assert "temperature" in capsys.readouterr().err
    assert main(["analyze", "update-variance", "--model", str(saved_tiny), "--task", "vowels", "--estimator", "two_point",
                 "--out", str(out)]) == 2
    assert main(["analyze", "update-variance", "--model", str(saved_tiny), "--task", "vowels", "--population", "3",
                 "--out", str(out)]) == 2
