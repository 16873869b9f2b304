"""experiments/refnum/artifact_summary.py: the per-seed numbers the study's Q4 tests read, from hand-written walk
directories and analyses (nothing trains here), and the study's Q4 tests reading them with the seed as the unit."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from evolm.report import study
from evolm.report.study import NOT_RUN, REPRODUCED, CONTRADICTED, load_claims

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def aws():
    path = ROOT / "experiments" / "refnum" / "artifact_summary.py"
    spec = importlib.util.spec_from_file_location("artifact_summary", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _walk(out: Path, model: str, arm: str, seed: int, updates: int, distance: float, below: float,
          divergence: float | None = None, status: str = "finished") -> None:
    spec = {"smollm2": "smollm2-135m", "gemma": "gemma3-270m"}[model]
    name = f"aw-{model}-{arm}-s{seed}-null"
    run = out / name
    run.mkdir(parents=True)
    arithmetic = {"exact": "exact", "reference": "reference", "artifact": "artifact"}[arm]
    (run / "config.toml").write_text(f'[model]\nspec = "{spec}"\ndtype = "bfloat16"\n\n[es]\npopulation = 32\n'
                                     f'lr = 0.00025\nsigma = 0.0015\narithmetic = "{arithmetic}"\n')
    (run / "run.json").write_text(json.dumps({"status": status, "fitness": "null: seeded N(0,1)"}))
    recs = [{"kind": "train", "step": s} for s in range(1, updates + 1)]
    if divergence is not None:
        recs[-1]["replica_divergence"] = {"relative_distance": [divergence], "differing": [0.5],
                                          "relative_distance_max": divergence, "differing_max": 0.5}
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    a = out / "analyses" / name
    a.mkdir(parents=True)
    (a / "drift.json").write_text(json.dumps({"models": {name: {
        "relative_distance": distance, "num_changed": 90, "num_params": 100, "rms_delta": 1e-4, "by_category": {}}}}))
    (a / "sparsity.json").write_text(json.dumps({"multipliers": [0.5, 1.0, 2.0], "models": {name: {
        "taus": [1, 2, 3], "fraction_below": [below / 2, below, 0.9], "num_nonzero": 90, "num_params": 100,
        "by_category": {}}}}))


def test_per_seed_contrasts_and_incomplete_seeds(tmp_path, aws, capsys):
    out = tmp_path / "runs"
    for seed, (art, ref) in enumerate([(0.0120, 0.020), (0.0121, 0.021), (0.0119, 0.019)]):
        _walk(out, "smollm2", "exact", seed, 6, 0.010, 0.07)
        _walk(out, "smollm2", "reference", seed, 6, ref, 0.01)
        _walk(out, "smollm2", "artifact", seed, 6, art, 0.02, divergence=1e-3 * (seed + 1))
    _walk(out, "gemma", "exact", 0, 6, 0.010, 0.07)  # a seed with one arm only
    _walk(out, "gemma", "reference", 0, 3, 0.010, 0.07, status="running")  # a walk under way: never published
    assert aws.main([str(out), "--publish", str(tmp_path / "docs" / "artifact")]) == 0
    s = json.loads((out / "summary.json").read_text())
    c = s["contrasts"]["smollm2-135m"]
    assert c["seeds"] == [0, 1, 2] and c["updates"] == [6, 6, 6]
    assert c["drift_ratio_artifact"] == pytest.approx([1.2, 1.21, 1.19])
    assert c["artifact_over_reference"] == pytest.approx([0.6, 0.0121 / 0.021, 0.0119 / 0.019])
    assert c["below_tau_difference_artifact"] == pytest.approx([-0.05] * 3)
    assert c["divergence_before_sync"] == pytest.approx([1e-3, 2e-3, 3e-3])
    g = s["contrasts"]["gemma3-270m"]
    assert g["seeds"] == [] and g["incomplete"] == [{"seed": 0, "arms": {"exact": 6, "reference": 3}}]
    published = tmp_path / "docs" / "artifact"
    assert (published / "summary.json").read_text() == (out / "summary.json").read_text()
    assert (published / "runs" / "aw-smollm2-artifact-s0-null" / "metrics.jsonl").exists()
    assert (published / "analyses" / "aw-smollm2-artifact-s0-null" / "drift.json").exists()
    assert (published / "runs" / "aw-gemma-exact-s0-null").exists()
    assert not (published / "runs" / "aw-gemma-reference-s0-null").exists()

    # the study's own Q4 tests read the published summary: SmolLM2 judged over 3 seeds, Gemma not run yet
    claims = load_claims(ROOT / "experiments" / "study" / "claims.toml")
    q4 = next(c for c in claims.claim if c.id == "Q4")
    read = lambda p: json.loads(Path(p).read_text())  # noqa: E731
    res = {t.name: study.evaluate_test(q4, t, tmp_path / "docs", read) for t in q4.test}
    assert res["drift: artifact loop over exact float32, SmolLM2, 3 seeds"].verdict == REPRODUCED
    assert res["drift: artifact loop over the single-process bf16 loop, SmolLM2, 3 seeds"].verdict == REPRODUCED
    assert res["below tau among moved, artifact minus exact, SmolLM2, 3 seeds"].verdict == CONTRADICTED
    assert res["drift: artifact loop over exact float32, Gemma, 3 seeds"].verdict == NOT_RUN


def test_writes_only_under_out_without_publish(tmp_path, aws):
    out = tmp_path / "runs"
    _walk(out, "smollm2", "exact", 0, 2, 0.01, 0.1)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert aws.main([str(out)]) == 0
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert set(after) - set(before) == {Path("runs/summary.json"), Path("runs/summary.md")}
    assert aws.main([str(tmp_path / "missing")]) == 2
    assert aws.main([str(out), "--seeds", "0,one"]) == 2  # one line naming the fix, nothing written


def test_localisation_per_seed_reads_the_tie_split_and_the_spacing_null(tmp_path, aws):
    out = tmp_path / "runs"
    for arm in ("exact", "reference", "artifact"):
        _walk(out, "smollm2", arm, 0, 4, 0.01, 0.05)
    a = out / "analyses" / "aw-smollm2-artifact-s0-null"
    tie = {"norm": {"observed": 0.5, "enrichment": 20.0}, "attention": {"observed": 41.7, "enrichment": 2.1}}
    fields = {"observed": 1, "expected": 1.0, "enrichment": 1.0, "enrichment_interval": [0.5, 2.0], "p_enriched": 0.5}
    top = {"enrichment": {"by_category": {c: fields for c in ("norm", "attention", "mlp", "embedding")}},
           "tie_split": {"by_category": tie}}
    (a / "localisation.json").write_text(json.dumps({"models": {"x": {"100": top}}}))
    (a / "magnitude.json").write_text(json.dumps({"models": {"x": {
        "dtype": "bfloat16", "k": 100, "relative": {"by_category": {}}, "steps": {"by_category": {}},
        "dtype_null": {"by_category": {"norm": {"observed": 0.5, "enrichment": 0.1},
                                       "attention": {"observed": 41.7, "enrichment": 1.05}}}}}}))
    assert aws.main([str(out), "--seeds", "0"]) == 0
    c = json.loads((out / "summary.json").read_text())["contrasts"]["smollm2-135m"]
    assert c["top100_attention_artifact"] == [41.7] and c["top100_attention_enrichment_artifact"] == [2.1]
    assert c["top100_attention_vs_dtype_null_artifact"] == [1.05] and c["top100_norm_vs_dtype_null_artifact"] == [0.1]
    assert c["top100_attention_reference"] == [None] and c["top100_norm_vs_dtype_null_exact"] == [None]  # not analysed
    assert "41.7 (2.1x; spacing null 1.05x)" in (out / "summary.md").read_text()


def test_a_model_is_judged_only_when_every_declared_seed_has_finished(tmp_path, aws):
    """The Q4 tests are declared over seeds 0, 1, 2: a t over the seeds finished so far would let the number of seeds
    depend on the results (optional stopping). Until the last declared seed finishes, the tested lists stay empty
    (the tests read not run) and the finished seeds' numbers are listed under ``so_far``."""
    out = tmp_path / "runs"
    for seed in (0, 1):
        _walk(out, "gemma", "exact", seed, 6, 0.010, 0.07)
        _walk(out, "gemma", "reference", seed, 6, 0.020, 0.01)
        _walk(out, "gemma", "artifact", seed, 6, 0.012, 0.02, divergence=1e-3)
    _walk(out, "gemma", "exact", 2, 6, 0.010, 0.07)
    assert aws.main([str(out), "--publish", str(tmp_path / "docs" / "artifact")]) == 0
    g = json.loads((out / "summary.json").read_text())["contrasts"]["gemma3-270m"]
    assert g["seeds"] == [] and g["drift_ratio_artifact"] == [] and g["waiting_for"] == [2]
    assert g["so_far"]["seeds"] == [0, 1] and g["so_far"]["drift_ratio_artifact"] == pytest.approx([1.2, 1.2])
    md = (out / "summary.md").read_text()
    assert "so far (the tests wait for seed 2)" in md and "| gemma3-270m | 1 (so far) | " in md  # both tables
    claims = load_claims(ROOT / "experiments" / "study" / "claims.toml")
    q4 = next(c for c in claims.claim if c.id == "Q4")
    t = next(t for t in q4.test if t.name == "drift: artifact loop over exact float32, Gemma, 3 seeds")
    read = lambda p: json.loads(Path(p).read_text())  # noqa: E731
    assert study.evaluate_test(q4, t, tmp_path / "docs", read).verdict == NOT_RUN

    # declared seeds are an option of the script (the walks script's SEEDS), and all of them finished: judged
    assert aws.main([str(out), "--seeds", "0,1"]) == 0
    g = json.loads((out / "summary.json").read_text())["contrasts"]["gemma3-270m"]
    assert g["seeds"] == [0, 1] and g["waiting_for"] == [] and "so_far" not in g
