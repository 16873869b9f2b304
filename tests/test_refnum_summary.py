"""experiments/refnum/summarise.py: the experiment's summary from the files its runs and analyses wrote.

Built on hand-written run directories and analysis files (nothing trains here): the real arms' held-out
changes, GRPO rows (no ES step, so no walk prediction), every real arm set against the exact float32 ES run
of its model and horizon, and the rows of walks no longer under the runs directory kept as written.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HELDOUT = ("greedy", "pass@1", "pass@4", "pass@16", "entropy", "distinct_correct")


@pytest.fixture(scope="module")
def summarise():
    path = Path(__file__).resolve().parents[1] / "experiments" / "refnum" / "summarise.py"
    spec = importlib.util.spec_from_file_location("refnum_summarise", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(root: Path, name: str, section: str, dtype: str, arithmetic: str | None, updates: int, before: float, after: float,
         distance: float, fitness: str | None = None) -> None:
    run = root / name
    run.mkdir(parents=True)
    es = f'\n[es]\npopulation = 30\nlr = 0.0005\nsigma = 0.001\narithmetic = "{arithmetic}"\n' if section == "es" else \
        '\n[grpo]\nlr = 1e-05\n'
    (run / "config.toml").write_text(f'[model]\nspec = "smollm2-135m"\ndtype = "{dtype}"\n{es}')
    (run / "run.json").write_text(json.dumps({"status": "finished", **({"fitness": fitness} if fitness else {})}))
    (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": s}) + "\n" for s in range(1, updates + 1)))
    if fitness is None:
        for when, value in (("before", before), ("after", after)):
            (run / f"eval_{when}.json").write_text(json.dumps({"step": 0 if when == "before" else updates, "summary": {
                "problems": 64, "n": 16, **{m: value for m in HELDOUT}}}))
    analyses = root / "analyses" / name
    analyses.mkdir(parents=True)
    if name == "es-reference-bf16":  # analyze magnitude's tie-aware counts against the dtype-matched null
        (analyses / "magnitude.json").write_text(json.dumps({"models": {"x": {
            "dtype": dtype, "k": 100, "relative": {"by_category": {}}, "steps": {"by_category": {}},
            "dtype_null": {"by_category": {"norm": {"observed": 0.5, "null_mean": 2.0, "enrichment": 0.25},
                                           "attention": {"observed": 30.0, "null_mean": 20.0, "enrichment": 1.5}}}}}}))
    (analyses / "drift.json").write_text(json.dumps({"models": {"x": {
        "relative_distance": distance, "num_changed": 50, "num_params": 100, "rms_delta": distance / 10,
        "by_category": {"norm": {"share_of_squared_distance": 0.1}, "mlp": {"share_of_squared_distance": 0.9}}}}}))


def test_real_arms_carry_their_heldout_changes_and_are_set_against_exact_float32_es(tmp_path, summarise, capsys):
    src, out = tmp_path / "runs", tmp_path / "docs"
    _run(src, "es-exact-f32", "es", "float32", "exact", 120, 0.20, 0.30, 0.010)
    _run(src, "es-reference-bf16", "es", "bfloat16", "reference", 120, 0.20, 0.25, 0.012)
    _run(src, "grpo-bf16", "grpo", "bfloat16", None, 120, 0.20, 0.40, 0.0005)
    _run(src, "es-exact-f32-null", "es", "float32", "exact", 120, 0, 0, 0.008, fitness="null: seeded N(0,1)")
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"runs": {"gone-walk": {
        "run": "gone-walk", "model": "gemma3-270m", "fitness": "null: seeded N(0,1)", "updates": 20, "arithmetic": "exact",
        "dtype": "float32", "magnitude": {"dtype": "float32"}}}}))  # a walk analysed elsewhere, not under src now
    # (its magnitude.json withdrawn: computed before the dtype null's held-out rule, deleted from out/analyses)
    assert summarise.main([str(src), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    runs = summary["runs"]
    assert set(runs) == {"es-exact-f32", "es-reference-bf16", "grpo-bf16", "es-exact-f32-null", "gone-walk"}
    assert runs["gone-walk"]["method"] == "es"  # kept as written, with the field later rows have
    assert "magnitude" not in runs["gone-walk"]  # ... except the withdrawn analysis
    assert runs["es-reference-bf16"]["magnitude"]["held_out"] is None  # written before held_out existed: none
    grpo = runs["grpo-bf16"]
    assert (grpo["method"], grpo["arithmetic"], grpo["population"], grpo["single_update_rms"]) == ("grpo", "autograd", None, None)
    assert grpo["drift"]["walk_rms"] is None and grpo["lr"] == 1e-05
    assert grpo["heldout"]["pass@1"] == {"before": 0.20, "after": 0.40, "change": pytest.approx(0.20)}
    assert "heldout" not in runs["es-exact-f32-null"]  # a walk has no task and no evaluation
    arms = summary["task_contrasts"]["smollm2-135m"]
    assert arms["exact_f32"] == "es-exact-f32" and arms["exact_f32_heldout_change"]["pass@16"] == pytest.approx(0.10)
    assert set(arms["arms"]) == {"es-reference-bf16", "grpo-bf16"}  # the walk is not a real arm
    assert arms["arms"]["es-reference-bf16"]["drift_ratio"] == pytest.approx(1.2)
    assert json.loads((out / "real_arm.json").read_text()) == summary["task_contrasts"]  # what the study's Q3d reads
    assert arms["arms"]["grpo-bf16"]["drift_ratio"] == pytest.approx(0.05)
    assert arms["arms"]["grpo-bf16"]["heldout_change"]["greedy"] == pytest.approx(0.20)
    ref = arms["arms"]["es-reference-bf16"]
    assert (ref["top100_norm"], ref["top100_norm_vs_dtype_null"], ref["top100_attention_vs_dtype_null"]) == (0.5, 0.25, 1.5)
    assert arms["arms"]["grpo-bf16"]["top100_norm"] is None  # not analysed: nothing made up
    # the walk contrast still pairs walks only: no reference walk here, so none
    assert summary["contrasts"] == {}
    page = (out / "summary.md").read_text()
    assert "| grpo-bf16 | grpo / autograd / bfloat16 | 120 | 0.200 → 0.400" in page
    assert (out / "runs" / "grpo-bf16" / "eval_after.json").exists()  # the small files are copied beside the summary
    capsys.readouterr()


def test_an_artifact_arm_is_set_against_the_reference_arm_and_carries_its_replica_divergence(tmp_path, summarise):
    src, out = tmp_path / "runs", tmp_path / "docs"
    _run(src, "es-exact-f32", "es", "float32", "exact", 120, 0.20, 0.30, 0.010)
    _run(src, "es-reference-bf16", "es", "bfloat16", "reference", 120, 0.20, 0.25, 0.012)
    _run(src, "es-artifact-bf16", "es", "bfloat16", "artifact", 120, 0.20, 0.27, 0.015)
    divergence = {"relative_distance": [0.004, 0.005], "differing": [0.2, 0.3], "relative_distance_max": 0.005,
                  "differing_max": 0.3}
    records = [{"kind": "train", "step": s, **({"replica_divergence": divergence} if s == 120 else {})} for s in range(1, 121)]
    (src / "es-artifact-bf16" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    out.mkdir()
    assert summarise.main([str(src), "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    arms = summary["task_contrasts"]["smollm2-135m"]["arms"]
    artifact = arms["es-artifact-bf16"]
    assert artifact["drift_ratio"] == pytest.approx(1.5) and artifact["drift_ratio_over_reference"] == pytest.approx(1.25)
    assert artifact["replica_divergence"] == [{"step": 120, "relative_distance_max": 0.005, "differing_max": 0.3}]
    assert "drift_ratio_over_reference" not in arms["es-reference-bf16"]
    assert summary["runs"]["es-artifact-bf16"]["replica_divergence"][0]["step"] == 120
