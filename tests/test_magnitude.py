"""Magnitude-aware analyses (evolm/analysis/magnitude.py): planted random walks in bfloat16 and float32.

A pure walk of ±1-ulp steps in bfloat16 puts the largest |Δ| on the largest weights (the norm weights
here, spread around 1 against matrices of scale 0.02): the absolute top-k count is "enriched in norm",
while relative terms and the dtype-matched null must see nothing. A float32 Gaussian walk of the same
length is isotropic: no absolute enrichment. A bfloat16 walk whose norm coordinates take more steps is
an ES-like finding: enriched against the dtype-matched null.
"""

from __future__ import annotations

import math

import pytest
import torch

from evolm.analysis.magnitude import (dtype_null_localisation, magnitude_analysis, relative_localisation,
                                      relative_sparsity, step_counts, ulp)

NORM = "model.layers.0.input_layernorm.weight"
SHAPES = {NORM: (4000,), "model.layers.0.self_attn.q_proj.weight": (200, 1000),
          "model.layers.0.mlp.up_proj.weight": (200, 1000), "model.embed_tokens.weight": (100, 1000)}


def _base(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in SHAPES.items():
        if name == NORM:  # log-uniform over [0.25, 4): a spread of mantissas like the matrices'
            x = torch.exp2(torch.rand(shape, generator=g) * 4 - 2)
        else:
            x = torch.randn(shape, generator=g) * 0.02
        out[name] = x.to(torch.bfloat16).to(torch.float32)
    return out


def _ulp_walk(base, steps, seed=1, dtype="bfloat16"):
    """Every coordinate takes ``steps[name]`` random ±1-ulp steps in ``dtype``'s spacing."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, x in base.items():
        x = x.clone()
        for _ in range(steps.get(name, steps["*"])):
            sign = torch.randint(0, 2, x.shape, generator=g).float() * 2 - 1
            x = (x + sign * ulp(x, dtype)).to(getattr(torch, dtype)).to(torch.float32)
        out[name] = x
    return out


def _gauss_walk(base, steps=16, sigma=1e-3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {n: x + sum(torch.randn(x.shape, generator=g) * sigma for _ in range(steps)) for n, x in base.items()}


def test_ulp_is_the_dtype_spacing():
    x = torch.tensor([1.0, 1.5, 0.75, -3.0, 0.0, 0.02])
    assert ulp(x, "bfloat16").tolist()[:4] == [2 ** -7, 2 ** -7, 2 ** -8, 2 ** -6]
    assert ulp(x, "float32")[0] == 2 ** -23 and ulp(x, "float16")[0] == 2 ** -10
    assert ulp(torch.tensor([0.0]), "bfloat16")[0] == 2 ** -133  # subnormal spacing at 0
    for dtype in ("bfloat16", "float16"):
        y = torch.tensor([0.02, 1.3, 7.0]).to(getattr(torch, dtype)).float()
        up = (y + ulp(y, dtype)).to(getattr(torch, dtype)).float()
        half = (y + 0.49 * ulp(y, dtype)).to(getattr(torch, dtype)).float()
        assert torch.all(up > y) and torch.equal(half, y)  # one ulp is the next value; less rounds back


def test_bf16_ulp_walk_is_norm_enriched_in_absolute_terms_only():
    base = _base()
    walked = _ulp_walk(base, {"*": 16})
    result = magnitude_analysis(base, walked, "bfloat16", k=100, permutations=1000)
    absolute = result["absolute"]["enrichment"]["norm"]
    assert absolute["observed"] >= 90 and absolute["p_enriched"] < 1e-50  # the artefact: top k in norm weights
    relative = result["relative"]["enrichment"]["norm"]
    assert relative["p_enriched"] > 0.01 and relative["observed"] < 10
    null = result["dtype_null"]["by_category"]["norm"]
    assert null["p_enriched"] > 0.05 and 0.8 < null["enrichment"] < 1.25  # the null explains it
    steps = result["steps"]["by_category"]
    assert steps["norm"]["median_steps"] == pytest.approx(steps["attention"]["median_steps"], rel=0.5)


def test_float32_gaussian_walk_is_not_enriched_absolutely_nor_against_the_dtype_null():
    # the old null (step counts shuffled across spacings) read this walk as "norm depleted", p = 0.024
    base = _base()
    walked = _gauss_walk(base)
    result = magnitude_analysis(base, walked, "float32", k=100, permutations=1000)
    assert result["absolute"]["enrichment"]["norm"]["p_enriched"] > 0.01
    for c, rec in result["dtype_null"]["by_category"].items():
        assert min(rec["p_enriched"], rec["p_depleted"]) > 0.01, (c, rec)
    steps = result["steps"]["by_category"]
    assert steps["norm"]["median_steps"] < steps["attention"]["median_steps"] / 10  # big weights, big ulps
    sparsity = result["relative_sparsity"]["by_category"]
    assert sparsity["norm"]["fraction_below"][2] > 0.5 > sparsity["attention"]["fraction_below"][2]  # τ = 1e-2


def test_extra_steps_in_norm_weights_are_enriched_against_the_dtype_null():
    # the positive control: ES-like, the norm coordinates take 4x the steps of the others (norm weights on
    # the matrices' scale here: with norm weights near 1 the null itself puts the whole top k there)
    base = _base()
    base[NORM] = (torch.randn(SHAPES[NORM], generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16).float()
    walked = _ulp_walk(base, {"*": 4, NORM: 16})
    rel = relative_localisation(base, walked, k=100)["enrichment"]["norm"]
    assert rel["p_enriched"] < 1e-6
    null = dtype_null_localisation(base, walked, "bfloat16", k=100, permutations=1000)["by_category"]["norm"]
    assert null["observed"] > null["null_interval"][1] and null["p_enriched"] <= 1 / 1001 + 1e-12


def test_relative_analyses_leave_out_zero_base_and_unchanged_coordinates():
    base = {NORM: torch.tensor([0.0, 1.0, 2.0, 4.0]), "model.layers.0.mlp.up_proj.weight": torch.tensor([0.5, 0.25])}
    trained = {NORM: torch.tensor([0.1, 1.0, 2.1, 4.0]), "model.layers.0.mlp.up_proj.weight": torch.tensor([0.55, 0.3])}
    loc = relative_localisation(base, trained, k=2)
    assert loc["num_zero_base"] == 1 and loc["by_category"]["mlp"] == 2  # r = 0.1 and 0.2 beat the norm's 0.05
    sp = relative_sparsity(base, trained, [0.15])
    assert sp["num_changed"] == 3 and sp["by_category"]["norm"]["fraction_below"] == [1.0]
    assert step_counts(base, trained, "bfloat16")["by_category"]["norm"]["num_changed"] == 2


def test_analyze_magnitude_cli_writes_json_and_png(tmp_path, tokenizer):
    # a tiny llama (norm weights 1, matrices ~0.02) rounded to bf16 as the base, a bf16 ulp walk of it as trained
    import json

    from conftest import make_tiny_model

    from evolm.commands import main

    model = make_tiny_model(tokenizer).to(torch.bfloat16).to(torch.float32)
    model.save_pretrained(tmp_path / "base")
    state = {n: p.data for n, p in model.named_parameters()}
    for n, x in _ulp_walk(state, {"*": 4}).items():
        state[n].copy_(x)
    model.save_pretrained(tmp_path / "walked")
    code = main(["analyze", "magnitude", "--base", str(tmp_path / "base"), "--trained", f"bf16={tmp_path / 'walked'}",
                 "--dtype", "bfloat16", "--permutations", "1000", "--out", str(tmp_path / "out")])
    assert code == 0
    result = json.loads((tmp_path / "out" / "magnitude.json").read_text())
    m = result["models"]["bf16"]
    assert m["dtype"] == "bfloat16" and m["absolute"]["by_category"]["norm"] >= 90
    assert m["dtype_null"]["permutations"] == 1000 and (tmp_path / "out" / "magnitude.png").exists()
    assert m["dtype_null"]["null"] == "within-spacing"
    refused = main(["analyze", "magnitude", "--base", str(tmp_path / "base"), "--trained", f"bf16={tmp_path / 'walked'}",
                    "--dtype", "bfloat16", "--permutations", "20", "--out", str(tmp_path / "out20")])
    assert refused == 2 and not (tmp_path / "out20").exists()  # 20 permutations: p cannot go below 0.048


def test_the_step_dtype_is_the_one_the_run_updated_in(tmp_path):
    from evolm.commands.analyze import _run_dtype

    cases = {"ref": '[model]\ndtype = "bfloat16"\n[es]\narithmetic = "reference"\n',
             "exact": '[model]\ndtype = "bfloat16"\n[es]\narithmetic = "exact"\n',
             "grpo": '[model]\ndtype = "bfloat16"\n[grpo]\nsteps = 1\n'}
    for name, text in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.toml").write_text(text)
    assert [_run_dtype(str(tmp_path / n)) for n in cases] == ["bfloat16", "float32", "bfloat16"]
    assert _run_dtype("smollm2-135m") == "float32"


def test_a_top_k_cut_inside_a_tie_splits_the_tie_evenly_and_reports_the_whole_set():
    """bf16 updates take few distinct values: when the k-th largest is shared, each tied coordinate
    counts (k − above) / tied (a random tie-break's expectation, the same on the observed and the null
    side), never a tie-break by position; the set at or above the k-th value is reported whole. The
    result does not depend on where the coordinates sit."""
    from evolm.analysis.magnitude import _top_k_cut
    from evolm.categories import CATEGORIES

    ids = {c: i for i, c in enumerate(CATEGORIES)}
    score = torch.cat([torch.full((10,), 2.0), torch.ones(60), torch.ones(40), torch.full((500,), 0.5)])
    cats = torch.tensor([ids["norm"]] * 10 + [ids["attention"]] * 60 + [ids["mlp"]] * 40 + [ids["embedding"]] * 500,
                        dtype=torch.int8)
    cut = _top_k_cut(score, cats, 20)
    assert cut["size"] == 110 and cut["tied"] == 100 and cut["kth"] == 1.0
    assert cut["counts"]["norm"] == 10 and cut["counts"]["attention"] == pytest.approx(6.0)
    assert cut["counts"]["mlp"] == pytest.approx(4.0) and cut["counts"]["embedding"] == 0
    assert sum(cut["counts"].values()) == pytest.approx(20)
    assert cut["at_least_kth"]["attention"] == 60 and cut["at_least_kth"]["mlp"] == 40
    order = torch.randperm(score.numel(), generator=torch.Generator().manual_seed(0))
    assert _top_k_cut(score[order], cats[order], 20)["counts"] == cut["counts"]
    whole = _top_k_cut(score, cats, 10)  # the cut falls between two values: plain integer counts
    assert whole["size"] == 10 and whole["counts"]["norm"] == 10 and isinstance(whole["counts"]["norm"], int)


def test_float32_null_with_zero_bases_is_finite_and_counts_the_observed_top_k():
    """A float32 weight at exactly 0 has spacing 2^-149: its step count overflowed float32, the observed |Δ| of
    such coordinates read infinite and filled the top k (the exact-f32 real arm's record). The observed counts
    must be those of plain |Δ|."""
    gen = torch.Generator().manual_seed(0)
    base = {"model.layers.0.self_attn.q_proj.weight": torch.randn(64, 64, generator=gen) * 0.02,
            "model.embed_tokens.weight": torch.zeros(32, 64)}  # zero bases
    delta = {n: torch.randn(w.shape, generator=gen) * 1e-3 for n, w in base.items()}
    delta["model.layers.0.self_attn.q_proj.weight"] *= 10  # the attention weights moved more: they hold the top 100
    trained = {n: base[n] + delta[n] for n in base}
    rec = dtype_null_localisation(base, trained, "float32", k=100, permutations=1000)
    assert rec["at_least_kth"]["kth"] is not None and math.isfinite(rec["at_least_kth"]["kth"])
    top = torch.cat([delta[n].flatten() for n in base]).abs().topk(100).values
    assert rec["at_least_kth"]["kth"] == pytest.approx(float(top[-1]), rel=1e-6)
    assert rec["observed"]["attention"] == 100 and rec["observed"]["embedding"] == 0


def test_zero_and_off_binade_bases_are_held_out_of_the_dtype_null():
    """Dequantised 4-bit bases hold exact zeros (325,128 in SmolLM2-135M): in bf16 a zero's spacing is 2^-133, so
    a 1e-4 move reads ~1e36 "steps", and wherever a shuffle put those counts was the null's top k (the null read
    parameter shares, and a pure ±1-ulp walk looked ~100x norm-enriched). Coordinates that walked away from θ0's
    spacing (θ0 = 0, a tiny θ0, a sign change) keep their observed Δ in every shuffle instead, so the pure walk is
    explained by spacing again, and the held-out count is reported."""
    base = _base()
    gen = torch.Generator().manual_seed(5)
    zeroed = {}
    for name, x in base.items():
        if name != NORM:
            mask = torch.rand(x.shape, generator=gen) < 0.002  # SmolLM2's share is 0.0024
            x[mask] = 0.0
            x[torch.rand(x.shape, generator=gen) < 0.001] = 1e-8  # tiny, non-zero: its spacing is ~1e-15
            zeroed[name] = mask | (x == 1e-8)
    walked = _ulp_walk(base, {"*": 16})
    for name, mask in zeroed.items():  # a bf16 zero (or tiny weight) takes the update whole: ~1e-4, not an ulp of 0
        move = (torch.randn(base[name].shape, generator=gen) * 1e-4).to(torch.bfloat16).float()
        walked[name] = torch.where(mask, (base[name] + move).to(torch.bfloat16).float(), walked[name])
    null = dtype_null_localisation(base, walked, "bfloat16", k=100, permutations=1000)
    norm = null["by_category"]["norm"]
    assert norm["observed"] >= 90  # the top 100 |Δ| are still the norm weights' ulps (2^-9 .. 2^-5 ≫ 1e-4)
    assert norm["null_mean"] >= 90 and 0.9 < norm["enrichment"] < 1.1  # spacing explains it (before the rule: 7)
    expected_held = sum(int((m & (walked[n] != base[n])).sum()) for n, m in zeroed.items())
    assert null["held_out"]["num"] >= expected_held > 0 and null["held_out"]["by_category"]["norm"] == 0
    assert sum(null["held_out"]["in_observed_top_k"].values()) == 0
    steps = step_counts(base, walked, "bfloat16")["by_category"]["mlp"]
    assert steps["num_held_out"] > 0 and steps["mean_steps"] < 100  # the held-out coordinates' ~1e36 left out


# -- the calibrated (within-spacing) null, issue 40 ------------------------------------------------------------

SCALES = {NORM: None, "model.layers.0.self_attn.q_proj.weight": 0.05, "model.layers.0.mlp.up_proj.weight": 0.01,
          "model.embed_tokens.weight": 0.02}
"""Categories of different weight scales (as in real models: attention, MLP and embeddings differ): step counts
Δ / ulp(θ0) then differ by category for an isotropic Δ, which the old null mistook for effects."""


def _scaled_base(seed=0):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in SHAPES.items():
        x = torch.exp2(torch.rand(shape, generator=g) * 4 - 2) if SCALES[name] is None else torch.randn(shape, generator=g) * SCALES[name]
        out[name] = x.to(torch.bfloat16).to(torch.float32)
    return out


def _bf16_walk(base, updates=12, sigma=3e-4, seed=1, boost=None):
    """Seeded random-fitness updates applied in place in bfloat16 (the reference arithmetic): every update is
    an isotropic Gaussian (an ES step from N(0, 1) fitness), added to the bf16 weights and rounded to bf16.
    ``boost``: {name: factor} scales one tensor's updates (a planted effect)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, x in base.items():
        x = x.to(torch.bfloat16)
        for _ in range(updates):
            step = torch.randn(x.shape, generator=g) * sigma * (boost or {}).get(name, 1.0)
            x = (x.float() + step).to(torch.bfloat16)
        out[name] = x.float()
    return out


def _no_effect(rec, alpha=0.01):
    return {c: r for c, r in rec["by_category"].items() if min(r["p_enriched"], r["p_depleted"]) <= alpha}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_dtype_null_reports_no_effect_on_exact_float32_walks(seed):
    base = _scaled_base()
    walked = _gauss_walk(base, seed=seed)
    rec = dtype_null_localisation(base, walked, "float32", k=100, permutations=2000, seed=seed)
    assert rec["null"] == "within-spacing" and rec["permutations"] == 2000
    assert not _no_effect(rec), _no_effect(rec)
    for r in rec["by_category"].values():
        assert r["null_interval"][0] <= r["observed"] <= r["null_interval"][1]
        assert r["null_mean"] == pytest.approx(r["expected"], abs=0.5)  # the permutations' mean is the exact mean


@pytest.mark.parametrize("seed", [1, 2])
def test_the_dtype_null_reports_no_effect_on_seeded_random_fitness_bf16_walks(seed):
    base = _scaled_base()
    walked = _bf16_walk(base, seed=seed)
    assert sum(int((walked[n] != base[n]).sum()) for n in base) > 100_000  # the walk moved
    rec = dtype_null_localisation(base, walked, "bfloat16", k=100, permutations=2000, seed=seed)
    assert not _no_effect(rec), _no_effect(rec)
    assert sum(r["observed"] for r in rec["by_category"].values()) == pytest.approx(100)  # ties split, summing to k


def test_the_dtype_null_detects_larger_steps_within_a_spacing():
    # planted: the attention coordinates' updates are 1.5x the others'; float32 and bf16 alike
    base = _scaled_base()
    attention = "model.layers.0.self_attn.q_proj.weight"
    walked = {n: x + torch.randn(x.shape, generator=torch.Generator().manual_seed(9)) * (1.5e-3 if n == attention else 1e-3)
              for n, x in base.items()}
    rec = dtype_null_localisation(base, walked, "float32", k=100, permutations=2000)["by_category"]["attention"]
    assert rec["p_enriched"] < 0.01 and rec["enrichment"] > 1.2
    base = _base()  # one scale for every matrix: a category with the largest weights has spacing groups of its own,
    base[NORM] = (torch.randn(SHAPES[NORM], generator=torch.Generator().manual_seed(3)) * 0.02).to(torch.bfloat16).float()
    walked = _bf16_walk(base, boost={attention: 1.5})  # where no null can tell its steps from its spacing
    rec = dtype_null_localisation(base, walked, "bfloat16", k=100, permutations=2000)["by_category"]["attention"]
    assert rec["p_enriched"] < 0.01 and rec["enrichment"] > 1.2


def test_the_dtype_null_refuses_fewer_than_1000_permutations():
    base = _scaled_base()
    with pytest.raises(ValueError, match=">= 1000"):
        dtype_null_localisation(base, _gauss_walk(base), "float32", permutations=20)


def test_a_tied_top_k_is_counted_as_the_even_split_of_the_tie():
    # 1,000 norm and 99,000 MLP coordinates all moved by the same |Δ|: a top 10 over that tie holds 0.1 norm
    # coordinates (its even split), not 1,000 nor a tie-break's 10
    base = {NORM: torch.full((1000,), 0.75), "model.layers.0.mlp.up_proj.weight": torch.full((99_000,), 0.75)}
    trained = {n: x + 2 ** -9 for n, x in base.items()}
    rec = dtype_null_localisation(base, trained, "bfloat16", k=10, permutations=1000)
    assert rec["at_least_kth"]["size"] == 100_000 and rec["observed"]["norm"] == pytest.approx(0.1)
    norm = rec["by_category"]["norm"]
    assert norm["expected"] == pytest.approx(0.1) and norm["p_enriched"] == 1.0 and norm["p_depleted"] == 1.0
