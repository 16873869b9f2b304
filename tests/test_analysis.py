"""Analyses on synthetic state dicts with known answers, plus CLI smoke runs on tiny saved models."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from conftest import make_tiny_model
from evolm.analysis import compression, diversity, sparsity
from evolm.categories import CATEGORIES, layer_index, param_category, param_subcategory
from evolm.analysis.drift import drift
from evolm.analysis.localisation import top_k_localisation
from evolm.analysis.weights import check_compatible, deduplicate_tied, load_into_model, load_state_info
from evolm.errors import UserError
from evolm.rewards import Verdict
from evolm.tasks import TASKS, register
from evolm.tasks.base import Example, Task, last_number


# -- categories ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, category, sub", [
    ("model.embed_tokens.weight", "embedding", "embedding.tokens.weight"),
    ("lm_head.weight", "lm_head", "lm_head.weight"),
    ("model.norm.weight", "norm", "norm.final.weight"),
    ("model.layers.3.input_layernorm.weight", "norm", "norm.input_layernorm.weight"),
    ("model.layers.3.post_attention_layernorm.weight", "norm", "norm.post_attention_layernorm.weight"),
    ("model.layers.0.pre_feedforward_layernorm.weight", "norm", "norm.pre_feedforward_layernorm.weight"),
    ("model.layers.0.self_attn.q_norm.weight", "norm", "norm.q_norm.weight"),
    ("model.layers.11.self_attn.q_proj.weight", "attention", "attention.q.weight"),
    ("model.layers.11.self_attn.k_proj.bias", "attention", "attention.k.bias"),
    ("model.layers.11.self_attn.v_proj.bias", "attention", "attention.v.bias"),
    ("model.layers.11.self_attn.o_proj.weight", "attention", "attention.o.weight"),
    ("model.layers.2.mlp.gate_proj.weight", "mlp", "mlp.gate.weight"),
    ("model.layers.2.mlp.down_proj.weight", "mlp", "mlp.down.weight"),
    ("transformer.wte.weight", "embedding", "embedding.tokens.weight"),
    ("transformer.wpe.weight", "embedding", "embedding.positions.weight"),
    ("transformer.h.0.ln_1.bias", "norm", "norm.ln_1.bias"),
    ("transformer.ln_f.weight", "norm", "norm.final.weight"),
    ("transformer.h.5.attn.c_attn.weight", "attention", "attention.qkv.weight"),
    ("transformer.h.5.attn.c_proj.bias", "attention", "attention.o.bias"),
    ("transformer.h.5.mlp.c_fc.weight", "mlp", "mlp.up.weight"),
    ("transformer.h.5.mlp.c_proj.weight", "mlp", "mlp.down.weight"),
    ("score.weight", "other", "other.weight"),
])
def test_param_category_names(name, category, sub):
    assert param_category(name) == category
    assert param_subcategory(name) == sub
    assert category in CATEGORIES


def test_layer_index():
    assert layer_index("model.layers.17.mlp.up_proj.weight") == 17
    assert layer_index("transformer.h.3.ln_2.weight") == 3
    assert layer_index("model.norm.weight") is None


def test_categories_module_is_stdlib_only():
    code = ("import sys; import evolm.categories; "
            "bad = [m for m in ('torch', 'numpy', 'transformers') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_tiny_llama_every_parameter_is_categorised(tiny_model):
    cats = {param_category(n) for n, _ in tiny_model.named_parameters()}
    assert cats == {"embedding", "norm", "attention", "mlp"}  # tied: lm_head is not a separate parameter


# -- synthetic state dicts ----------------------------------------------------------------------------

def _planted_pair():
    """Base with known norms (||θ0||² = 96) and a planted update (||Δ||² = 5): norm 1, attention 4."""
    base = {
        "model.layers.0.input_layernorm.weight": torch.ones(16),            # ||·||² = 16
        "model.layers.0.self_attn.q_proj.weight": torch.full((8, 8), 0.5),  # 16
        "model.layers.0.mlp.up_proj.weight": torch.ones(4, 8),              # 32
        "model.embed_tokens.weight": torch.full((16, 8), 0.5),              # 32
    }
    trained = {k: v.clone() for k, v in base.items()}
    trained["model.layers.0.input_layernorm.weight"][:4] += 0.5            # Δ² = 4 × 0.25 = 1
    trained["model.layers.0.self_attn.q_proj.weight"] += 0.25              # Δ² = 64 × 0.0625 = 4
    return base, trained


def test_drift_planted_known_answer():
    base, trained = _planted_pair()
    d = drift(base, trained)
    assert d["relative_distance"] == pytest.approx(math.sqrt(5 / 96), rel=1e-12)
    assert d["num_params"] == 16 + 64 + 32 + 128 and d["num_changed"] == 4 + 64
    assert d["max_abs_delta"] == 0.5
    cat = d["by_category"]
    assert cat["norm"]["relative_distance"] == pytest.approx(0.25)
    assert cat["attention"]["relative_distance"] == pytest.approx(0.5)
    assert cat["mlp"]["relative_distance"] == 0.0 and cat["embedding"]["num_changed"] == 0
    assert cat["norm"]["share_of_squared_distance"] == pytest.approx(0.2)
    assert cat["attention"]["share_of_squared_distance"] == pytest.approx(0.8)
    assert sum(c["share_of_squared_distance"] for c in cat.values()) == pytest.approx(1.0)
    assert "lm_head" not in cat
    assert d["by_subcategory"]["attention.q.weight"]["num_changed"] == 64
    assert d["by_layer"]["0"]["distance"] == pytest.approx(math.sqrt(5))
    assert d["by_layer"]["none"]["distance"] == 0.0
    assert drift(base, base)["relative_distance"] == 0.0


def test_drift_rejects_different_architectures():
    base, trained = _planted_pair()
    trained["extra.weight"] = torch.zeros(2)
    with pytest.raises(UserError):
        drift(base, trained)
    with pytest.raises(UserError):
        check_compatible(base, {**base, "model.embed_tokens.weight": torch.zeros(3, 8)})


def _random_model_pair(seed=0, noise=1e-4):
    g = torch.Generator().manual_seed(seed)
    shapes = {
        "model.embed_tokens.weight": (50, 16),
        "model.norm.weight": (16,),
        **{f"model.layers.{i}.{n}": s for i in range(3) for n, s in {
            "input_layernorm.weight": (16,), "post_attention_layernorm.weight": (16,),
            "self_attn.q_proj.weight": (16, 16), "self_attn.q_proj.bias": (16,),
            "self_attn.k_proj.weight": (8, 16), "self_attn.k_proj.bias": (8,),
            "mlp.up_proj.weight": (32, 16), "mlp.down_proj.weight": (16, 32)}.items()},
    }
    base = {k: torch.randn(s, generator=g) * 0.05 for k, s in shapes.items()}
    trained = {k: v + torch.randn(v.shape, generator=g) * noise for k, v in base.items()}
    return base, trained


def test_localisation_finds_planted_norm_coordinates():
    base, trained = _random_model_pair()
    planted = [("model.layers.0.input_layernorm.weight", 3), ("model.layers.1.post_attention_layernorm.weight", 7),
               ("model.layers.2.input_layernorm.weight", 0), ("model.norm.weight", 15)]
    for i, (name, idx) in enumerate(planted):
        trained[name][idx] = base[name][idx] + 0.1 * (i + 1)
    trained["model.layers.1.self_attn.q_proj.bias"][5] = base["model.layers.1.self_attn.q_proj.bias"][5] - 0.05
    loc = top_k_localisation(base, trained, k=5)
    assert loc["by_category"] == {"norm": 4, "attention": 1, "mlp": 0, "embedding": 0, "lm_head": 0, "other": 0}
    assert loc["by_subcategory"]["attention.q.bias"] == 1
    found = [(c["name"], c["index"][0]) for c in loc["coordinates"][:4]]
    assert found == list(reversed(planted))  # largest planted delta first
    first = loc["coordinates"][0]
    assert first["delta"] == pytest.approx(0.4, rel=1e-5) and first["trained"] - first["base"] == pytest.approx(first["delta"])
    assert loc["max_abs_delta"] == pytest.approx(0.4, rel=1e-5) and loc["kth_abs_delta"] == pytest.approx(0.05, rel=1e-4)
    # with k beyond the planted ones, the rest is noise of 1e-4 scale
    assert top_k_localisation(base, trained, k=6)["kth_abs_delta"] < 1e-3


def test_localisation_multi_dimensional_index_and_embedding_updates():
    base, trained = _random_model_pair(seed=1)
    trained["model.embed_tokens.weight"][42, 11] += 1.0
    trained["model.layers.2.mlp.down_proj.weight"][3, 30] -= 0.5
    loc = top_k_localisation(base, trained, k=2)
    assert loc["coordinates"][0]["name"] == "model.embed_tokens.weight" and loc["coordinates"][0]["index"] == [42, 11]
    assert loc["coordinates"][1]["index"] == [3, 30] and loc["coordinates"][1]["delta"] < 0
    assert loc["by_category"]["embedding"] == 1 and loc["by_category"]["mlp"] == 1


def test_localisation_ignores_unchanged_coordinates():
    base, _ = _random_model_pair()
    trained = {k: v.clone() for k, v in base.items()}
    trained["model.norm.weight"][2] += 1.0
    loc = top_k_localisation(base, trained, k=10)
    assert loc["num_selected"] == 1 and loc["by_category"]["norm"] == 1


# -- sparsity -----------------------------------------------------------------------------------------

def test_threshold_update_is_bit_exact():
    g = torch.Generator().manual_seed(0)
    base = {"a.weight": torch.randn(200, 50, generator=g) * 3, "model.norm.weight": torch.rand(300, generator=g) + 0.5}
    trained = {k: v + torch.randn(v.shape, generator=g) * torch.logspace(-7, -1, v.numel()).view(v.shape) for k, v in base.items()}
    trained["a.weight"][0, :10] = base["a.weight"][0, :10]  # some exact zeros in Δ
    for tau in (0.0, 1e-5, 1e-3, 0.05, float("inf")):
        out = sparsity.threshold_update(base, trained, tau)
        for name in base:
            b, t, o = base[name], trained[name], out[name]
            mask = (t - b).abs() >= tau
            assert torch.equal(o[mask], t[mask]) and torch.equal(o[~mask], b[~mask])
            # θ0 + Δ·1[|Δ| ≥ τ] in exact (float64) arithmetic: the difference of two float32s is exact there
            exact = b.double() + (t.double() - b.double()) * mask.double()
            assert torch.equal(o.double(), exact)
    assert all(torch.equal(v, trained[k]) for k, v in sparsity.threshold_update(base, trained, 0.0).items())
    assert all(torch.equal(v, base[k]) for k, v in sparsity.threshold_update(base, trained, float("inf")).items())


def test_update_sparsity_known_fractions():
    base = {"model.norm.weight": torch.zeros(100), "model.layers.0.mlp.up_proj.weight": torch.ones(10, 10)}
    trained = {"model.norm.weight": torch.arange(1, 101, dtype=torch.float32) * 1e-3,  # |Δ| = 0.001 .. 0.1, exact
               "model.layers.0.mlp.up_proj.weight": torch.ones(10, 10)}                  # unchanged
    s = sparsity.update_sparsity(base, trained, [0.0505, 0.5, 1e-6])
    assert s["num_params"] == 200 and s["num_nonzero"] == 100
    assert s["fraction_below"] == [0.5, 1.0, 0.0]
    assert s["num_kept"] == [50, 0, 100]
    assert s["kept_fraction"] == [0.25, 0.0, 0.5]
    assert s["by_category"]["mlp"]["num_nonzero"] == 0 and s["by_category"]["norm"]["fraction_below"][0] == 0.5
    # the coordinates counted as kept are exactly those the thresholded model takes from θ
    for tau, kept in zip(s["taus"], s["num_kept"]):
        out = sparsity.threshold_update(base, trained, tau)
        changed = sum(int((out[n] != base[n]).sum()) for n in base)
        assert changed == kept


def test_single_update_rms_formula_and_monte_carlo():
    records = [{"step": 1, "scale": 0.1, "coefficients": [3.0, 4.0]},
               {"step": 2, "scale": 0.2, "coefficients": [3.0, -4.0]},
               {"step": 3, "scale": 100.0, "coefficients": [1.0]}]
    assert sparsity.single_update_rms(records) == pytest.approx(1.0)  # median of 0.5, 1.0, 100
    # one update u = scale · Σ c_i ε_i with standard-normal ε_i has per-coordinate RMS scale · ||c||
    g = torch.Generator().manual_seed(0)
    coeffs = torch.randn(16, generator=g)
    noise = torch.randn(16, 200_000, generator=g, dtype=torch.float64)
    update = 0.003 * (coeffs.double()[:, None] * noise).sum(0)
    predicted = sparsity.single_update_rms([{"scale": 0.003, "coefficients": coeffs.tolist()}])
    assert float(update.pow(2).mean().sqrt()) == pytest.approx(predicted, rel=0.01)
    with pytest.raises(UserError):
        sparsity.single_update_rms([])
    with pytest.raises(UserError):
        sparsity.single_update_rms([{"step": 1}])
    assert sparsity.tau_grid(0.01, [0.5, 2]) == [0.005, 0.02]


def test_sparsity_curve_with_fake_evaluator():
    base, trained = _random_model_pair(noise=1e-4)
    important = ("model.layers.0.input_layernorm.weight", 1)
    trained[important[0]][important[1]] += 0.05

    calls = []

    def evaluate(state):  # "accuracy" = whether the one important update survived
        calls.append(1)
        kept = bool(state[important[0]][important[1]] == trained[important[0]][important[1]])
        return {"greedy_pass@1": 1.0 if kept else 0.0}

    taus = sparsity.tau_grid(1e-4, [0.5, 1, 4, 1000])
    curve = sparsity.sparsity_curve(base, trained, taus, evaluate, multipliers=[0.5, 1, 4, 1000])
    assert len(calls) == len(taus) + 2
    assert [p["metrics"]["greedy_pass@1"] for p in curve["points"]] == [1.0, 1.0, 1.0, 0.0]
    assert curve["reference"] == {"base": {"greedy_pass@1": 0.0}, "trained": {"greedy_pass@1": 1.0}}
    fb = [p["fraction_below"] for p in curve["points"]]
    assert fb == sorted(fb) and fb[2] > 0.99 and fb[3] == 1.0
    assert curve["points"][1]["multiplier"] == 1.0


# -- compression --------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4, 2])
def test_fake_quantize_error_bound(bits):
    g = torch.Generator().manual_seed(bits)
    w = torch.randn(32, 96, generator=g) * torch.logspace(-4, 1, 32)[:, None]  # rows of very different scales
    w[5] = 0.0
    q = compression.fake_quantize(w, bits, axis=0)
    scale = w.abs().amax(dim=1, keepdim=True) / (2 ** (bits - 1) - 1)
    err = (w - q).abs()
    assert torch.all(err <= scale / 2 * (1 + 1e-6) + 1e-30)
    assert torch.all(q[5] == 0)
    levels = torch.round(q / torch.where(scale > 0, scale, torch.ones_like(scale)))
    assert levels.abs().max() <= 2 ** (bits - 1) - 1
    assert all(len(torch.unique(levels[r])) <= 2 ** bits - 1 for r in range(32))
    # the largest entry of each row is representable exactly (up to float rounding)
    idx = w.abs().argmax(dim=1)
    assert torch.allclose(q.gather(1, idx[:, None]), w.gather(1, idx[:, None]), rtol=1e-6, atol=0)
    if bits == 8:  # per-channel is much better than per-tensor on rows of different scales
        per_tensor = compression.fake_quantize(w, bits, axis=None)
        assert (w - q).norm() < (w - per_tensor).norm()


@pytest.mark.parametrize("group", [128, 32, 7])
def test_fake_quantize_groups(group):
    g = torch.Generator().manual_seed(group)
    w = torch.randn(6, 576, generator=g)
    w[2, 3] = 50.0  # one outlier: only its own group's step grows
    q = compression.fake_quantize_groups(w, 4, group)
    assert q.shape == w.shape
    per_channel = compression.fake_quantize(w, 4, axis=0)
    for start in range(0, 576, group):
        block, qb = w[:, start:start + group], q[:, start:start + group]  # the last group may be short (576 = 4.5 x 128)
        scale = block.abs().amax(dim=1, keepdim=True) / 7
        assert torch.all((block - qb).abs() <= scale / 2 * (1 + 1e-6) + 1e-30)
        assert torch.equal(qb, compression.fake_quantize(block, 4, axis=0))  # each group quantised on its own
    # the outlier row: per-channel int4 rounds most of it to zero, groups keep all but the outlier's group
    assert (w[2] - q[2]).norm() < (w[2] - per_channel[2]).norm()
    assert compression.parse_method("int4g128") == {"kind": "quantize", "bits": 4, "group": 128}
    state = {"model.layers.0.self_attn.q_proj.weight": w, "model.norm.weight": torch.ones(576)}
    out = compression.compress(state, f"int4g{group}")
    assert torch.equal(out["model.layers.0.self_attn.q_proj.weight"], q)
    assert out["model.norm.weight"] is state["model.norm.weight"]


def test_magnitude_prune_global_and_per_tensor():
    base, _ = _random_model_pair()
    pruned = compression.magnitude_prune(base, 0.5, scope="global")
    names = compression.selected_names(base)
    assert names and all(param_category(n) in ("attention", "mlp") and base[n].dim() == 2 for n in names)
    for n in base:
        if n not in names:
            assert pruned[n] is base[n]  # norms, biases, embeddings untouched
    total = sum(base[n].numel() for n in names)
    zeros = sum(int((pruned[n] == 0).sum()) for n in names)
    assert zeros == round(0.5 * total)
    kept_min = min(float(pruned[n][pruned[n] != 0].abs().min()) for n in names)
    pruned_max = max(float(base[n][pruned[n] == 0].abs().max()) for n in names)
    assert pruned_max <= kept_min
    per = compression.magnitude_prune(base, 0.25, scope="per_tensor")
    for n in names:
        assert int((per[n] == 0).sum()) == round(0.25 * base[n].numel())
    with_norms = compression.magnitude_prune(base, 0.5, categories=("norm",), matrices_only=False)
    norms = [n for n in base if param_category(n) == "norm"]
    assert len(norms) == 7 and sum(int((with_norms[n] == 0).sum()) for n in norms) == 7 * 16 // 2


def test_compress_methods_and_table():
    base, trained = _random_model_pair(noise=1e-3)
    assert compression.parse_method("int4") == {"kind": "quantize", "bits": 4}
    assert compression.parse_method("prune-tensor:0.3") == {"kind": "prune", "sparsity": 0.3, "scope": "per_tensor"}
    for bad in ("int1", "int32", "int4g0", "int4g", "prune:1.5", "gzip"):
        with pytest.raises(UserError):
            compression.parse_method(bad)
    same = compression.compress(trained, "none")
    assert all(same[k] is trained[k] for k in trained)

    def evaluate(state):
        return {"greedy_pass@1": float(sum(int((v == 0).sum()) for v in state.values()))}

    table = compression.compression_table({"base": base, "es": trained}, ["none", "int8", "int4", "prune:0.5"], evaluate, base=base)
    rows = {(r["model"], r["method"]): r for r in table["rows"]}
    assert len(rows) == 8 and all("problems" not in r for r in rows.values())

    def evaluate_with_problems(state):
        return {**evaluate(state), "problems": [{"id": "p0", "greedy_correct": True}]}

    table2 = compression.compression_table({"es": trained}, ["int8"], evaluate_with_problems, base=base)
    assert table2["rows"][0]["problems"] == [{"id": "p0", "greedy_correct": True}]
    assert "problems" not in table2["rows"][0]["metrics"]
    assert compression.problems_file_name("es", "prune:0.5") == "es_prune-0.5.json"
    assert rows[("es", "none")]["relative_error"] == 0.0 and rows[("es", "none")]["error_to_update"] == 0.0
    assert "error_to_update" not in rows[("base", "int8")]
    assert 0 < rows[("es", "int8")]["relative_error"] < rows[("es", "int4")]["relative_error"]
    assert rows[("es", "int4")]["error_to_update"] > rows[("es", "int8")]["error_to_update"] > 0
    assert rows[("es", "prune:0.5")]["zero_fraction"] == pytest.approx(0.5, abs=1e-3)
    assert rows[("es", "prune:0.5")]["metrics"]["greedy_pass@1"] >= 0.5 * table["compressed_params"]


# -- diversity ----------------------------------------------------------------------------------------

def test_diversity_zero_for_identical_members_positive_for_distinct():
    same = [[0.2, 0.9, 0.5]] * 4
    assert diversity.verifier_js_divergence(same) == pytest.approx(0.0, abs=1e-12)
    cov = diversity.population_coverage(same, [0.2, 0.9, 0.5])
    assert cov["population"] == pytest.approx(cov["center"]) and cov["gap"] == pytest.approx(0.0, abs=1e-12)
    distinct = [[1.0, 0.0], [0.0, 1.0]]
    assert diversity.verifier_js_divergence(distinct) == pytest.approx(math.log(2))
    cov = diversity.population_coverage(distinct, [0.5, 0.5])
    assert cov["population"] == 1.0 and cov["center"] == pytest.approx(0.75) and cov["gap"] > 0
    mild = [[0.3, 0.5], [0.4, 0.5]]
    assert 0 < diversity.verifier_js_divergence(mild) < diversity.verifier_js_divergence(distinct)


def test_population_beats_matched_centre_sampling():
    """Lemma 2's inequality when the centre's success probability is the members' mean (AM–GM)."""
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(20):
        p = rng.uniform(0, 1, size=(8, 30)) ** rng.uniform(0.2, 3)
        cov = diversity.population_coverage(p, p.mean(axis=0))
        assert cov["population"] >= cov["center"] - 1e-12


def test_pass_at_k_matches_brute_force():
    from itertools import combinations

    n = 7
    for c in range(n + 1):
        outcomes = [1] * c + [0] * (n - c)
        for k in range(1, n + 1):
            subsets = list(combinations(range(n), k))
            brute = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
            assert diversity.pass_at_k(n, c, k) == pytest.approx(brute)


def test_diversity_from_samples_uses_unbiased_centre_estimator():
    members = [[[1, 0, 0, 0], [0, 0, 0, 0]], [[0, 0, 0, 0], [1, 1, 0, 0]]]
    center = [[1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 1]]
    out = diversity.diversity_from_samples(members, center)
    assert out["center_estimator"] == "unbiased" and out["center_samples"] == 2
    assert out["center"] == pytest.approx(diversity.pass_at_k(8, 1, 2))
    assert out["population"] == pytest.approx((0.25 + 0.5) / 2)  # prompt 1: 1 − (1 − 0)(1 − 0.5)
    assert out["js_divergence"] > 0
    plug = diversity.diversity_from_samples(members, center, n_center=16)
    assert plug["center_estimator"] == "plug-in"
    with pytest.raises(UserError):
        diversity.diversity_report({"p_members": [[0.5]]})


# -- weights: loading, tied embeddings, copying into a model -----------------------------------------

def test_deduplicate_tied_in_memory(tiny_model):
    state, aliases = deduplicate_tied(tiny_model.state_dict())
    assert aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    assert "lm_head.weight" not in state and "model.embed_tokens.weight" in state


def test_load_state_and_load_into_model(tmp_path, tokenizer):
    model = make_tiny_model(tokenizer, seed=1)
    model.save_pretrained(tmp_path / "m")
    state, info = load_state_info(str(tmp_path / "m"))
    assert info.tied_embeddings and info.stored_dtypes == ["float32"] and "lm_head.weight" not in state
    assert all(t.dtype == torch.float32 for t in state.values())
    own = dict(model.named_parameters())
    assert set(state) == set(own) and all(torch.equal(state[n], own[n]) for n in state)
    other = make_tiny_model(tokenizer, seed=2)
    load_into_model(other, state)
    assert all(torch.equal(p, own[n]) for n, p in other.named_parameters())
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()  # still tied
    with pytest.raises(UserError):
        load_into_model(other, {k: v for k, v in state.items() if "norm" not in k})


# -- real evaluator and CLI on tiny saved models ------------------------------------------------------

@register
class EchoTask(Task):
    """Test task: an example is correct when the greedy completion equals a stored reference text."""

    name = "analysis-test-echo"
    references: dict[str, str] = {}

    def examples(self, split, count, seed=0):
        items = [Example(id=f"{split}-{i}", question=f"Count to {i + 2}.", answer=str(i + 2)) for i in range(6)]
        return items[:count]

    def extract_answer(self, completion):
        return last_number(completion)

    def check(self, completion, example):
        ref = self.references.get(example.id)
        ok = completion == ref if ref is not None else self.extract_answer(completion) == example.answer
        return Verdict(format_ok=True, correct=ok, answer=completion)


def test_task_evaluator_scores_loaded_weights(tokenizer):
    from evolm.analysis.evaluator import TaskEvaluator
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator

    model = make_tiny_model(tokenizer, seed=3)
    base = {k: v.clone() for k, v in deduplicate_tied(model.state_dict())[0].items()}
    task = TASKS["analysis-test-echo"]()
    examples = task.examples("test", 4)
    prompts = [task.render_prompt(e, tokenizer) for e in examples]
    outs = HFGenerator(model, tokenizer).generate(prompts, SamplingParams(max_new_tokens=6))
    EchoTask.references = {e.id: o[0].text for e, o in zip(examples, outs)}
    try:
        g = torch.Generator().manual_seed(0)
        perturbed = {k: v + torch.randn(v.shape, generator=g) * 0.5 for k, v in base.items()}
        evaluator = TaskEvaluator(model, tokenizer, task, examples, n=4, ks=(1, 2), max_new_tokens=6)
        m_perturbed = evaluator(perturbed)
        m_base = evaluator(base)
        assert m_base["greedy_pass@1"] == 1.0 and m_perturbed["greedy_pass@1"] < 1.0
        assert 0.0 <= m_base["pass@1"] <= m_base["pass@2"] <= 1.0 and m_base["num_examples"] == 4
        assert evaluator(base) == m_base  # common random numbers: same weights, same metrics
        assert [p["id"] for p in m_base["problems"]] == [str(e.id) for e in examples]
        assert all(p["greedy_correct"] for p in m_base["problems"]) and all(p["n"] == 4 for p in m_base["problems"])
        assert sum(p["c"] for p in m_perturbed["problems"]) / 16 == pytest.approx(m_perturbed["pass@1"])
    finally:
        EchoTask.references = {}
    with pytest.raises(UserError):
        TaskEvaluator(model, tokenizer, task, examples, n=2, ks=(4,))


@pytest.fixture(scope="module")
def saved_models(tmp_path_factory, tokenizer):
    """A base dir, an 'ES-like' run dir (planted norm updates, seed log, config) and a 'GRPO-like' dir."""
    root = tmp_path_factory.mktemp("analysis_models")
    model = make_tiny_model(tokenizer, seed=5)
    model.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 1e-4)
        model.model.layers[0].input_layernorm.weight[:7] += 0.3
        model.model.layers[1].post_attention_layernorm.weight[:3] -= 0.2
    run = root / "es_run"
    model.save_pretrained(run / "final")
    tokenizer.save_pretrained(run / "final")
    (run / "config.toml").write_text(f'[model]\nspec = "{root / "base"}"\n\n[task]\nname = "analysis-test-echo"\n\n'
                                     '[generation]\nmax_new_tokens = 4\n')
    (run / "run.json").write_text('{"kind": "es"}\n')
    (run / "seed_log.jsonl").write_text("".join(json.dumps({"step": s, "scale": 1e-5, "coefficients": [3.0, 4.0]}) + "\n"
                                                for s in range(1, 4)))
    grpo = make_tiny_model(tokenizer, seed=5)
    with torch.no_grad():
        grpo.model.embed_tokens.weight[100:110] += 0.01
    grpo.save_pretrained(root / "grpo")
    return root


def _cli(*argv):
    from evolm.commands import main

    return main(list(argv))


def test_cli_drift_and_localisation(saved_models, tmp_path, capsys):
    root = saved_models
    out = tmp_path / "out"
    assert _cli("analyze", "drift", "--trained", f"es={root / 'es_run'}", "--trained", f"grpo={root / 'grpo'}",
                "--out", str(out)) == 0
    result = json.loads((out / "drift.json").read_text())
    assert (out / "drift.png").stat().st_size > 1000
    assert result["tied_embeddings"] is True and result["base"]["spec"] == str(root / "base")  # from the run's config
    es, grpo = result["models"]["es"], result["models"]["grpo"]
    assert es["by_category"]["norm"]["share_of_squared_distance"] > 0.5
    assert set(grpo["by_category"]) == {"embedding", "norm", "attention", "mlp"}
    assert grpo["by_category"]["embedding"]["share_of_squared_distance"] == pytest.approx(1.0)
    assert "by_tensor" not in es

    assert _cli("analyze", "localization", "--base", str(root / "base"), "--trained", f"es={root / 'es_run'}",
                "--trained", f"grpo={root / 'grpo'}", "--k", "10", "--k", "20", "--out", str(out)) == 0
    loc = json.loads((out / "localisation.json").read_text())
    assert loc["models"]["es"]["10"]["by_category"]["norm"] == 10
    assert loc["models"]["grpo"]["20"]["by_category"]["embedding"] == 20
    assert (out / "localisation.png").exists()
    assert "es top-10: norm 10" in capsys.readouterr().out


def test_cli_sparsity_curve_with_seed_log(saved_models, tmp_path):
    root = saved_models
    out = tmp_path / "out"
    assert _cli("analyze", "sparsity", "--trained", str(root / "es_run"), "--limit", "3", "--multipliers", "1,100,10000",
                "--out", str(out)) == 0
    r = json.loads((out / "sparsity.json").read_text())
    assert r["tau_scale"] == pytest.approx(5e-5) and "seed_log" in r["tau_scale_source"]
    m = r["models"]["es_run"]
    assert [p["tau"] for p in m["points"]] == pytest.approx([5e-5, 5e-3, 0.5])
    assert m["points"][1]["kept_fraction"] == pytest.approx(10 / m["num_params"])  # only the planted norm coordinates
    assert m["points"][2]["kept_fraction"] == 0.0
    assert r["evaluation"]["task"] == "analysis-test-echo" and r["evaluation"]["max_new_tokens"] == 4
    assert all("greedy_pass@1" in p["metrics"] for p in m["points"]) and set(m["reference"]) == {"base", "trained"}
    assert (out / "sparsity.png").exists()
    # each thresholded model's per-problem results: evaluation files the study pairs (masked vs trained)
    assert [p["problems_file"] for p in m["points"]] == [f"sparsity/es_run_x{x}.json" for x in (1, 100, 10000)]
    assert m["reference_files"] == {"base": "sparsity/es_run_base.json", "trained": "sparsity/es_run_trained.json"}
    assert all("problems" not in p["metrics"] for p in m["points"]) and "problems" not in m["reference"]["base"]
    for f in [p["problems_file"] for p in m["points"]] + list(m["reference_files"].values()):
        evaluation = json.loads((out / f).read_text())
        assert len(evaluation["problems"]) == 3 and all("greedy_correct" in q for q in evaluation["problems"])
    x1 = json.loads((out / "sparsity" / "es_run_x1.json").read_text())
    assert sum(q["greedy_correct"] for q in x1["problems"]) / 3 == m["points"][0]["metrics"]["greedy_pass@1"]


def test_cli_sparsity_no_eval_needs_a_scale(saved_models, tmp_path, capsys):
    root = saved_models
    assert _cli("analyze", "sparsity", "--base", str(root / "base"), "--trained", str(root / "grpo"), "--no-eval",
                "--out", str(tmp_path)) == 2
    assert "--tau-scale" in capsys.readouterr().err
    assert _cli("analyze", "sparsity", "--base", str(root / "base"), "--trained", str(root / "grpo"), "--no-eval",
                "--tau-scale", "1e-3", "--out", str(tmp_path)) == 0
    r = json.loads((tmp_path / "sparsity.json").read_text())
    assert r["models"]["grpo"]["num_nonzero"] > 0 and "points" not in r["models"]["grpo"]
    assert _cli("analyze", "sparsity", "--trained", str(root / "es_run"), "--metric", "pass@4", "--limit", "1",
                "--out", str(tmp_path)) == 2
    assert "--metric pass@4 is not measured" in capsys.readouterr().err


def test_cli_compression(saved_models, tmp_path):
    root = saved_models
    assert _cli("analyze", "compression", "--trained", f"es={root / 'es_run'}", "--methods", "none,int8,prune:0.5",
                "--limit", "2", "--n", "2", "--pass-k", "2", "--out", str(tmp_path)) == 0
    r = json.loads((tmp_path / "compression.json").read_text())
    assert [(row["model"], row["method"]) for row in r["rows"]] == [
        (m, meth) for m in ("base", "es") for meth in ("none", "int8", "prune:0.5")]
    assert all("pass@2" in row["metrics"] for row in r["rows"])
    assert r["categories"] == ["attention", "mlp"] and r["compressed_tensors"] == 14
    assert (tmp_path / "compression.png").exists()
    # each row's per-problem results: an evaluation file the study pairs over problems (and not in the table)
    assert all("problems" not in row for row in r["rows"])
    row = next(row for row in r["rows"] if row["model"] == "es" and row["method"] == "prune:0.5")
    assert row["problems_file"] == "compression/es_prune-0.5.json"
    from evolm.report.study import problem_values, task_report

    evaluation = json.loads((tmp_path / row["problems_file"]).read_text())
    problems = evaluation["problems"]
    assert len(problems) == 2 and all(p["n"] == 2 and 0 <= p["c"] <= 2 for p in problems)
    assert sum(p["greedy_correct"] for p in problems) / 2 == row["metrics"]["greedy_pass@1"]
    values = problem_values(task_report(evaluation, tmp_path / row["problems_file"]), "pass@2")
    assert sum(values.values()) / 2 == pytest.approx(row["metrics"]["pass@2"])
    none = json.loads((tmp_path / "compression" / "es_none.json").read_text())
    assert [p["id"] for p in none["problems"]] == [p["id"] for p in problems]  # the same problems: pairable


def test_cli_diversity_and_errors(tmp_path, capsys):
    f = tmp_path / "measured.json"
    f.write_text(json.dumps({"member_correct": [[[1, 0], [0, 0]], [[0, 0], [1, 1]]],
                             "center_correct": [[1, 0, 0, 0], [0, 0, 0, 1]], "sigma": 0.001}))
    assert _cli("analyze", "diversity", "--from", str(f), "--out", str(tmp_path)) == 0
    r = json.loads((tmp_path / "diversity.json").read_text())
    assert r["js_divergence"] > 0 and r["input"] == {"sigma": 0.001} and (tmp_path / "diversity.png").exists()
    assert _cli("analyze", "drift", "--base", "smollm2-135m") == 2
    assert "--trained" in capsys.readouterr().err
    assert _cli("analyze", "compression", "--trained", str(tmp_path), "--methods", "zip") == 2
    assert _cli("analyze") == 2


@pytest.mark.slow
def test_real_smollm2_drift_localisation_and_weight_swap():
    """The real 272-tensor SmolLM2 with tied embeddings: planted norm updates are found; weights swap in exactly."""
    from evolm import models

    base, info = load_state_info(models.DEFAULT_MODEL)
    assert info.tied_embeddings and info.num_tensors == 272 and "lm_head.weight" not in base
    trained = dict(base)
    for i in range(0, 30, 3):
        name = f"model.layers.{i}.input_layernorm.weight"
        trained[name] = base[name].clone()
        trained[name][:12] += 0.05
    d = drift(base, trained)
    assert d["num_changed"] == 120 and d["by_category"]["norm"]["share_of_squared_distance"] == pytest.approx(1.0)
    loc = top_k_localisation(base, trained, 144)
    assert loc["num_selected"] == 120 and loc["by_category"]["norm"] == 120
    model, _ = models.load(models.DEFAULT_MODEL)
    load_into_model(model, trained)
    assert torch.equal(model.model.layers[3].input_layernorm.weight, trained["model.layers.3.input_layernorm.weight"])
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_curve_problem_files_with_a_shared_base(tmp_path):
    from evolm.commands.analyze import _write_curve_problems

    def metrics(v):
        return {"greedy_pass@1": v, "problems": [{"id": "p0", "greedy_correct": bool(v)}]}

    base = metrics(0.0)  # one base's metrics object, shared by both models (as _cmd_sparsity builds them)
    result = {"models": {m: {"points": [{"multiplier": 0.5, "metrics": metrics(1.0)}],
                             "reference": {"base": base, "trained": metrics(1.0)}} for m in ("es", "grpo")}}
    _write_curve_problems(tmp_path, result, {"task": "t", "n": 0})
    assert result["models"]["es"]["reference_files"]["base"] == "sparsity/es_base.json"
    assert result["models"]["grpo"]["reference_files"] == {"base": "sparsity/es_base.json",
                                                           "trained": "sparsity/grpo_trained.json"}
    assert result["models"]["grpo"]["points"][0]["problems_file"] == "sparsity/grpo_x0.5.json"
    assert json.loads((tmp_path / "sparsity" / "es_base.json").read_text())["problems"] == [{"id": "p0", "greedy_correct": False}]


def test_a_top_k_cut_inside_a_tie_reports_the_whole_tied_set():
    """bfloat16 updates take few distinct values: when the k-th |Δ| is shared, the top k is a tie-break by
    tensor name, and ``at_least_kth`` counts every coordinate at or above it, by category."""
    from evolm.analysis.localisation import top_k_localisations

    base = {"a.embed_tokens.weight": torch.zeros(50), "b.layers.0.mlp.up_proj.weight": torch.zeros(200),
            "b.layers.0.input_layernorm.weight": torch.zeros(10)}
    trained = {"a.embed_tokens.weight": torch.full((50,), 0.5), "b.layers.0.mlp.up_proj.weight": torch.full((200,), 0.5),
               "b.layers.0.input_layernorm.weight": torch.full((10,), 0.25)}
    loc = top_k_localisations(base, trained, [20, 260])
    assert loc[20]["by_category"]["embedding"] == 20 and loc[20]["tied"]  # the alphabetically first tensor's
    tie = loc[20]["at_least_kth"]
    assert tie["num_coordinates"] == 250 and tie["by_category"]["embedding"] == 50 and tie["by_category"]["mlp"] == 200
    assert tie["by_category"]["norm"] == 0 and tie["enrichment"]["mlp"]["observed"] == 200
    untied = loc[260]  # every changed coordinate: nothing is cut
    assert not untied["tied"] and untied["at_least_kth"]["num_coordinates"] == 260
