"""evolm report from tiny real runs: an ES run (held-out eval before/after, probes), a GRPO run, an
analysis directory from `evolm analyze drift`, and a two-point population sweep. The report must
render and contain every figure it lists, in the Markdown, on disk and embedded in the HTML."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_tiny_model, make_vowel_task
from evolm import config
from evolm.tasks import TASKS

TASK = make_vowel_task(1 / 3)
TASKS.setdefault(TASK.name, type(TASK))


def _es_cfg(root, name, **es):
    return config.from_dict(config.ESJob, {
        "run": {"out_dir": str(root), "name": name, "progress": False, "checkpoint_every": 0},
        "task": {"name": TASK.name},
        "generation": {"max_new_tokens": 4, "batch_size": 16},
        "es": {"iterations": 3, "population": 4, "prompts_per_iteration": 4, "sigma": 0.05, "lr": 0.02,
               "noise_table_size": 1 << 22, **es},
        "eval": {"count": 3, "n_samples": 4, "k": [1, 2, 4]},
        "probe": {"every": 2, "task": "", "count": 3, "n_samples": 2, "k": [1, 2]}})


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, tokenizer):
    from evolm.backends.hf import HFGenerator
    from evolm.commands import main
    from evolm.jobs import run_es
    from evolm.sweep import run_sweep

    root = tmp_path_factory.mktemp("report_inputs")
    base = make_tiny_model(tokenizer)
    base.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")

    def es(cfg, resume=None):
        model = make_tiny_model(tokenizer)
        return run_es(cfg, resume=resume, model=model, tokenizer=tokenizer, task=TASK,
                      generator=HFGenerator(model, tokenizer, 16), quiet=True)

    cfg = _es_cfg(root, "es")
    cfg.model.spec = str(root / "base")
    es_run = es(cfg)

    paths = {"base": root / "base", "es": es_run.path}
    try:
        from evolm.grpo import GRPOJob
        from evolm.jobs import run_grpo

        gcfg = config.from_dict(GRPOJob, {
            "run": {"out_dir": str(root), "name": "grpo", "checkpoint_every": 0, "progress": False},
            "model": {"spec": str(root / "base")}, "task": {"name": TASK.name},
            "grpo": {"steps": 2, "num_generations": 4, "prompts_per_step": 1, "max_completion_length": 4, "lr": 1e-3},
            "eval": {"before_after": False}})
        paths["grpo"] = run_grpo(gcfg, model=make_tiny_model(tokenizer), tokenizer=tokenizer, task=TASK).path
    except ImportError:  # TRL is an optional extra
        pass

    analysis = root / "analysis"
    trained = [f"es={paths['es']}"] + ([f"grpo={paths['grpo']}"] if "grpo" in paths else [])
    argv = ["analyze", "drift", "--base", str(root / "base"), "--out", str(analysis)]
    for t in trained:
        argv += ["--trained", t]
    assert main(argv) == 0
    assert main(["analyze", "localisation", "--base", str(root / "base"), "--trained", trained[0], "--k", "20",
                 "--out", str(analysis)]) == 0

    base_dict = {k: v for k, v in config.to_dict(_es_cfg(root, "x", iterations=2)).items()}
    base_dict["eval"]["before_after"] = False
    base_dict["probe"]["every"] = 0
    sweep = run_sweep(base_dict, {"es.population": [2, 4]}, root / "sweep", runner=es, config_class=config.ESJob,
                      say=lambda *a: None)
    paths.update(analysis=analysis, sweep=sweep.path)
    return paths


def _check_figures(out, result):
    md = (out / "report.md").read_text()
    page = (out / "report.html").read_text()
    listed = json.loads((out / "report.json").read_text())["figures"]
    referenced = re.findall(r"!\[[^\]]*\]\((figures/[^)]+\.png)\)", md)
    assert referenced == listed and len(set(listed)) == len(listed)
    for f in listed:
        assert (out / f).stat().st_size > 2000  # a real PNG
        assert (out / f).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert page.count("src='data:image/png;base64,") == len(listed)
    assert "figures/" not in page  # self-contained: nothing is linked
    assert sorted(p.name for p in (out / "figures").iterdir()) == sorted(f.split("/")[1] for f in listed)
    assert [str(p) for p in result.figures] == [str(out / f) for f in listed]
    return md, page, listed


def test_report_from_tiny_real_runs(inputs, tmp_path):
    from evolm.report import build_report

    out = tmp_path / "report"
    paths = [str(inputs["es"]), str(inputs["analysis"]), str(inputs["sweep"])] + \
        ([str(inputs["grpo"])] if "grpo" in inputs else [])
    result = build_report(paths, out, labels={str(inputs["es"]): "ES tiny"})
    md, page, listed = _check_figures(out, result)
    names = {f.split("/")[1].rsplit(".", 1)[0] for f in listed}
    assert {"passk", "probe", "reward", "drift", "localisation"} <= names
    assert any("population" in n for n in names) and any("curves" in n for n in names)
    for heading in ("## Held-out pass@k", "## Held-out probe", "## Training reward", "## Cost",
                    "## Analysis: drift", "## Analysis: localisation", "## Sweep sweep", "## Files read"):
        assert heading in md
    assert "ES tiny" in md and "base" in md
    if "grpo" in inputs:
        assert "| grpo | grpo |" in md
    # every number shown comes from a file, and the files are listed
    data = json.loads((out / "report.json").read_text())
    read = data["files_read"]
    for f in ("eval_before.json", "eval_after.json", "metrics.jsonl", "drift.json", "sweep.json"):
        assert any(p.endswith(f) for p in read), f
    # the pass@k table holds the base and trained curves computed from the eval files' n and c
    before = json.loads((inputs["es"] / "eval_before.json").read_text())
    table = next(t for s in data["sections"] if s["title"].startswith("Held-out pass@k") for t in s["tables"])
    base_row = next(r for r in table["rows"] if r[0] == "base")
    k1 = table["columns"].index("pass@1")
    assert base_row[k1] == pytest.approx(before["summary"]["pass@1"])
    # population-scaling table: the reference (largest N) is within the band from its first update
    pop = next(t for s in data["sections"] for t in s["tables"] if t["columns"][:2] == ["N", "within band from update"])
    assert [r[0] for r in pop["rows"]] == [2, 4] and pop["rows"][1][1] == 1
    assert "<table>" in page and "Files read" in page

    # a second report into the same directory does not keep stale figures
    only = build_report([str(inputs["analysis"])], out)
    _check_figures(out, only)
    assert sorted(p.stem for p in (out / "figures").iterdir()) == ["drift", "localisation"]


def test_report_cli_and_errors(inputs, tmp_path, capsys):
    from evolm.commands import main

    out = tmp_path / "r"
    assert main(["report", "--label", f"es={inputs['es']}", "--window", "2", "--out", str(out)]) == 0
    assert (out / "report.html").exists() and "es" in (out / "report.md").read_text()
    capsys.readouterr()
    assert main(["report", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty"), "--out", str(out)]) == 2
    assert "is not a run, sweep, eval or analysis directory" in capsys.readouterr().err
    assert main(["report", str(inputs["es"]), "--label", "bad", "--out", str(out)]) == 2
    capsys.readouterr()
    (tmp_path / "torn").mkdir()
    (tmp_path / "torn" / "run.json").write_text('{"kind": "es", "sta')
    assert main(["report", str(tmp_path / "torn"), "--out", str(out)]) == 2
    assert "run.json is not valid JSON" in capsys.readouterr().err


def _synthetic_sweep(path, grid, curves, statuses=None):
    """A sweep directory written by hand: sweep.json plus one run directory per point with train records."""
    from evolm.sweep import grid_points, point_name

    path.mkdir(parents=True)
    points = []
    for i, assignments in enumerate(grid_points(grid)):
        name = point_name(assignments)
        run = path / name
        run.mkdir()
        (run / "config.toml").write_text("[es]\npopulation = 4\n")
        (run / "run.json").write_text(json.dumps({"kind": "es", "status": "finished"}))
        status = (statuses or {}).get(i, "applied")
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s + 1, "kind": "train", "reward_mean": r, "fitness": [r] * 4, "update_status": status,
                        "seconds": 1.0, "gen_tokens": 10, "peak_rss_mb": 100.0}) + "\n" for s, r in enumerate(curves[i])))
        points.append({"name": name, "assignments": assignments, "dir": name, "status": "finished"})
    (path / "sweep.json").write_text(json.dumps({"kind": "es", "base": {}, "overrides": [], "grid": grid, "points": points}))
    return path


def test_report_sigma_estimator_shaping_eval_and_measurements(tmp_path, tokenizer):
    from evolm.analysis.update_variance import update_spread
    from evolm.commands import main
    from evolm.evaluate import evaluate_model
    from evolm.report import build_report

    sigma = _synthetic_sweep(tmp_path / "sigma", {"es.sigma": [1e-5, 1e-3, 0.1]},
                             [[0.3, 0.3, 0.3], [0.3, 0.4, 0.5], [0.3, 0.1, 0.0]], statuses={0: "zero"})
    est = _synthetic_sweep(tmp_path / "est", {"es.estimator": ["one_point", "antithetic"], "es.shaping": ["zscore", "none"]},
                           [[0.1, 0.3], [0.1, 0.2], [0.1, 0.25], [0.1, 0.15]])
    evaluate_model(make_tiny_model(tokenizer), [TASK], tokenizer=tokenizer, n=2, ks=(1, 2), limit=2, max_new_tokens=4,
                   use_cache=False, progress=False, out_dir=tmp_path / "eval")
    measured = tmp_path / "measured"
    (tmp_path / "m.json").write_text(json.dumps({"member_correct": [[[1, 0], [0, 0]], [[0, 0], [1, 1]]],
                                                 "center_correct": [[1, 0, 0, 0], [0, 0, 0, 1]]}))
    assert main(["analyze", "diversity", "--from", str(tmp_path / "m.json"), "--out", str(measured)]) == 0
    import numpy as np

    rng = np.random.default_rng(0)
    (measured / "update_variance.json").write_text(json.dumps({"kind": "update_variance", "setup": {"population": 4},
        "estimators": {e: {**update_spread(rng.standard_normal((3, 50))), "status": ["applied"] * 3,
                           "evaluations_per_update": 4} for e in ("one_point", "antithetic")}}))

    out = tmp_path / "report"
    result = build_report([str(sigma), str(est), str(tmp_path / "eval"), str(measured)], out)
    md, page, listed = _check_figures(out, result)
    names = " ".join(listed)
    for part in ("sigma-all", "estimator-es-shaping-zscore", "estimator-es-shaping-none", "shaping-es-estimator-one-point",
                 "diversity", "update-variance", "passk"):
        assert part in names, part
    assert "no_signal" in md and "below_start, collapsed" in md and "Best unflagged σ: 0.001" in md
    assert "equal budget here: yes" in md
    assert "## Analysis: diversity" in md and "## Analysis: update variance" in md


def test_sparsity_table_shows_the_curve_anchors():
    from evolm.analysis.sparsity import report_table

    result = {"metric": "greedy_pass@1", "tau_scale": 1e-4, "tau_scale_source": "seed log",
              "models": {"es": {"taus": [1e-4, 2e-4], "fraction_below": [0.2, 0.6],
                                "points": [{"tau": 1e-4, "kept_fraction": 0.8, "metrics": {"greedy_pass@1": 0.5}},
                                           {"tau": 2e-4, "kept_fraction": 0.4, "metrics": {"greedy_pass@1": 0.25}}],
                                "reference": {"base": {"greedy_pass@1": 0.125}, "trained": {"greedy_pass@1": 0.5}}}}}
    table = report_table(result)
    assert [r[0] for r in table.rows] == ["es: base θ0", "es: trained θ0 + Δ", "es", "es"]
    assert [r[-1] for r in table.rows] == [0.125, 0.5, 0.5, 0.25]
    assert [r[3] for r in table.rows] == [0.0, 1.0, 0.8, 0.4]


@pytest.mark.parametrize("module", ["evolm.analysis.plots", "evolm.analysis.drift", "evolm.analysis.sparsity",
                                    "evolm.analysis.localisation", "evolm.analysis.compression", "evolm.analysis.diversity",
                                    "evolm.analysis.update_variance", "evolm.report", "evolm.document",
                                    "evolm.commands.analyze", "evolm.commands.report"])
def test_imported_first_without_torch_or_matplotlib(module):
    """Each module imports cleanly as the first module of a fresh interpreter, and none of what
    ``evolm --help`` imports may load torch or matplotlib."""
    code = (f"import sys, {module}; heavy = [m for m in ('torch', 'matplotlib') if m in sys.modules]; "
            "assert not heavy, heavy")
    src = str(Path(__file__).resolve().parents[1] / "src")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env={**os.environ, "PYTHONPATH": src})
    assert proc.returncode == 0, proc.stderr


def test_inputs_are_read_once_with_short_labels_and_one_colour_per_run(inputs, tmp_path):
    from evolm.evaluate import write_outputs
    from evolm.report import build_report
    from evolm.report.read import Reader, gather

    es = inputs["es"]
    # two evaluations of the run, as `evolm eval --model RUN` writes them: one per invocation
    for stamp, spec in (("20260101-000000-vowels-third", str(es)), ("20260101-000100-like-base", str(inputs["base"]))):
        report = json.loads((es / "eval_after.json").read_text())
        write_outputs({"model": {"spec": spec, "fingerprint": "x"}, "settings": {"n": 4, "ks": [1, 2, 4], "temperature": 1.0,
                                                                              "top_p": 1.0, "split": "test", "seed": 0,
                                                                              "greedy": True},
                       "tasks": {"vowels-third": report}}, es / "eval" / stamp)
    (es / "analysis").mkdir()
    (es / "analysis" / "drift.json").write_text((inputs["analysis"] / "drift.json").read_text())
    try:
        # the run, its analysis directory again (another spelling) and the run once more: each read once
        src = gather([str(es), str(es / "analysis"), str(es / "." / "eval" / ".." / "analysis"), str(es) + "/"],
                     {}, Reader())
        assert [r.label for r in src.runs] == ["es"]
        assert [label for label, _, _ in src.evals] == ["es eval", "es eval (base)"]
        assert [label for label, _, _ in src.analyses["drift"]] == ["es"]
        assert src.colors["es eval"] == src.colors["es eval (base)"] == src.colors["es"]
        both = gather([str(es), str(inputs["grpo"])] if "grpo" in inputs else [str(es)], {}, Reader())
        assert len(set(both.colors.values())) == len(both.runs), "one colour per run"
        result = build_report([str(es), str(es / "analysis")], tmp_path / "r")
        md = result.markdown.read_text()
        assert md.count("## Analysis: drift") == 1
        passk = next(s for s in json.loads(result.json.read_text())["sections"] if s["title"].startswith("Held-out pass@k"))
        labels = [r[0] for r in passk["tables"][0]["rows"]]
        assert labels == ["es base", "es", "es eval", "es eval (base)"] or labels == ["base", "es", "es eval", "es eval (base)"]
        assert not any("/" in label or ":" in label for label in labels), "short labels, no paths"
    finally:
        import shutil

        shutil.rmtree(es / "analysis")
        shutil.rmtree(es / "eval")


def _mc_eval(path, problems, c):
    """An `evolm eval` output written by hand: a 4-choice task whose problems each define chance 0.25."""
    path.mkdir(parents=True)
    probs = [{"id": str(i), "n": 4, "c": c, "chance": 0.25} for i in range(problems)]
    report = {"model": {"spec": "m", "fingerprint": "f"}, "settings": {"n": 4, "ks": [1, 4]},
              "tasks": {"csqa": {"task": "csqa", "problems": probs,
                                 "summary": {"problems": problems, "n": 4, "pass@1": c / 4}}}}
    (path / "eval.json").write_text(json.dumps(report))
    return path


def test_chance_curves_and_warnings_for_all_zero_or_small_evaluations(tmp_path):
    from evolm.report import build_report
    from evolm.report.sections import chance_curve

    assert chance_curve({"problems": [{"n": 2, "chance": 0.5}, {"n": 2, "chance": 0.25}]}) == \
        pytest.approx([(0.5 + 0.25) / 2, (0.75 + 0.4375) / 2])
    assert chance_curve({"problems": [{"n": 2, "chance": None}]}) == []

    result = build_report([str(_mc_eval(tmp_path / "zero", 5, 0))], tmp_path / "r")
    data = json.loads(result.json.read_text())
    table = data["sections"][0]["tables"][0]
    chance = next(r for r in table["rows"] if r[0] == "chance (uniform guessing)")
    assert chance[table["columns"].index("pass@1")] == pytest.approx(0.25)
    assert chance[table["columns"].index("pass@4")] == pytest.approx(1 - 0.75 ** 4)
    md = result.markdown.read_text()
    assert "> **Warning:** every pass@k below is 0" in md
    assert "> **Warning:** csqa is measured on only 5 problems" in md
    assert "class='warning'" in result.html.read_text()

    ok = build_report([str(_mc_eval(tmp_path / "fine", 25, 2))], tmp_path / "r2")
    assert "Warning" not in ok.markdown.read_text()


def test_analysis_warnings_name_all_zero_and_small_results():
    from evolm.report.checks import analysis_warnings

    assert "all-zero drift for es" in analysis_warnings("drift", {"models": {"es": {"distance": 0.0}, "g": {"distance": 1.0}}})[0]
    assert analysis_warnings("drift", {"models": {"es": {"distance": 0.1}}}) == []
    assert "all-zero update" in analysis_warnings("localisation", {"models": {"es": {"20": {"max_abs_delta": 0.0}}}})[0]
    assert "only 8 problems" in analysis_warnings("sparsity", {"models": {"es": {"num_nonzero": 3}},
                                                               "evaluation": {"num_examples": 8}})[0]
    assert analysis_warnings("diversity", {"population": 0.0, "center": 0.0, "num_prompts": 40})[0].startswith("all-zero")


def _probe_run(label, method, probes, seconds_per_update):
    from evolm.report.read import Run

    train = [{"step": s, "kind": "train", "seconds_total": seconds_per_update * s, "gen_sequences_total": 32 * s,
              "gen_tokens_total": 300 * s, "peak_rss_mb": 1000.0 + s} for s in range(1, max(probes) + 1)]
    return Run(label=label, path=Path(label), kind=method, info={}, config={}, train=train,
               probes=[{"step": s, "task": "arithmetic", "pass@1": v} for s, v in probes.items()])


def test_cost_at_matched_quality_uses_the_lowest_best_probe():
    from evolm.document import Table
    from evolm.report.sections import matched_quality

    grpo = _probe_run("grpo", "grpo", {0: 0.1, 5: 0.5, 10: 0.6}, 60.0)
    es = _probe_run("es", "es", {0: 0.1, 5: 0.15, 10: 0.3, 15: 0.25}, 40.0)
    words, table = matched_quality([grpo, es])
    assert "first reached 0.3" in words and "(update 0: 0.1)" in words
    assert isinstance(table, Table)
    rows = {r[0]: r for r in table.rows}
    assert rows["grpo"][2:] == [5, 300.0, 160.0, 1500.0, 1005.0]   # GRPO's first probe at or above 0.3
    assert rows["es"][2:] == [10, 400.0, 320.0, 3000.0, 1010.0]
    # no run improves on the update-0 level: nothing to match, and the page says so
    flat = _probe_run("flat", "es", {0: 0.4, 5: 0.2}, 40.0)
    (only,) = matched_quality([grpo, flat])
    assert "does not exceed the update-0 probe (0.4)" in only
    assert matched_quality([grpo]) is None


def test_a_figure_of_many_runs_repeats_no_colour():
    from evolm.document import COLORS
    from evolm.report.sections import EXTRA_COLORS, figure_colors

    class Src:
        def color(self, label):  # the page colour: cycles like read.assign_colors once runs outnumber COLORS
            return COLORS[int(label[1:]) % len(COLORS)]

    labels = [f"r{i}" for i in range(14)]
    colors = figure_colors(labels, Src())
    assert len(set(colors.values())) == 14
    assert [colors[f"r{i}"] for i in range(10)] == COLORS  # runs keep their page colour where it is free
    assert all(colors[f"r{i}"] in EXTRA_COLORS for i in range(10, 14))
