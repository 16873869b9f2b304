"""Collect the reference-numerics experiment into docs/study/refnum/ (the study's data directory: claims.toml's Q3 reads it): run files without weights, analyses, a summary.

    python experiments/refnum/summarise.py runs/refnum --out docs/study/refnum

For every finished or stopped run ``runs/refnum/<name>`` (null walks: ``<name>-null``) it copies the small
files (config.toml, run.json, config_history.jsonl, seed_log.jsonl, metrics.jsonl: ``--resume`` continues a
copy by replaying its seed log) and ``analyses/<name>/*.json|png``, then writes ``summary.json`` and
``summary.md``: per run the horizon T, the drift (relative distance; for reference arithmetic the part due to
restore error, from the exact float32 shadow logged per update), the sparsity fraction at τ = m × the
single-update RMS (lr / √N) against the paper's 77.6-93.0% and the Gaussian-walk prediction erf(m / √(2T)),
the top-100 |Δ| by category against the exchangeable null (enrichment, exact 95% interval, one-sided p) and,
for bf16 arithmetic, against the dtype-matched null, and the share of moved coordinates that moved one ulp.
The runs with task rewards (the real arms: ES in the three arithmetics and GRPO in bf16, each with a held-out
evaluation before and after) add their held-out pass@k and entropy, and ``task_contrasts`` sets each against
the exact float32 ES run of the same model and horizon (also written alone to ``real_arm.json``, which the
study's Q3d tests read). Rows of runs no longer under RUNS (a walk rebuilt
elsewhere, or analysed at an earlier update) are kept from the existing summary.json.
Nothing is computed from the weights here: every number is read from a file the analyses wrote.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

SMALL = ("config.toml", "run.json", "config_history.jsonl", "seed_log.jsonl", "metrics.jsonl", "eval_before.json", "eval_after.json")
HELDOUT = ("greedy", "pass@1", "pass@4", "pass@16", "entropy", "distinct_correct")
CATS = ("norm", "attention", "mlp", "embedding")
PAPER_SPARSITY = (0.776, 0.930)


def copy_run_files(run: Path, dest: Path) -> None:
    """A run's small files (``SMALL``, no weights) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in SMALL:
        if (run / name).exists():
            shutil.copy2(run / name, dest / name)


def copy_analyses(analyses: Path, dest: Path) -> None:
    """An analysis directory's ``*.json`` and ``*.png`` into ``dest`` (nothing when it does not exist)."""
    if not analyses.is_dir():
        return
    dest.mkdir(parents=True, exist_ok=True)
    for f in analyses.iterdir():
        if f.suffix in (".json", ".png"):
            shutil.copy2(f, dest / f.name)


def _load(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def _train(run: Path) -> list[dict]:
    p = run / "metrics.jsonl"
    return [r for r in (json.loads(l) for l in p.read_text().splitlines() if l.strip()) if r.get("kind") == "train"] if p.exists() else []


def summarise_run(run: Path, analyses: Path, at: int | None = None) -> dict:
    """One row: ``run``'s config and logs, ``analyses``' files; ``at``: the analyses are of update ``at``
    (weights rebuilt by ``evolm replay --step``), so the logs are read up to it."""
    info, train = _load(run / "run.json") or {}, _train(run)
    if at is not None:
        train = [r for r in train if int(r["step"]) <= at]
    import tomllib

    cfg = tomllib.loads((run / "config.toml").read_text())
    es = cfg.get("es")  # None: a GRPO run (its updates are AdamW's; no single-update RMS, no walk prediction)
    out = {"run": run.name + (f"-at-{at}" if at is not None else ""), "model": cfg["model"]["spec"], "dtype": cfg["model"]["dtype"],
           "method": "es" if es else "grpo", "arithmetic": es.get("arithmetic", "exact") if es else "autograd",
           "population": es["population"] if es else None, "lr": (es or cfg["grpo"])["lr"], "sigma": es["sigma"] if es else None,
           "fitness": info.get("fitness", "task reward"), "updates": max((int(r["step"]) for r in train), default=0),
           "finished": (run / "final" / "config.json").exists() or info.get("status") == "finished"}
    out["single_update_rms"] = out["lr"] / math.sqrt(out["population"]) if es else None
    before, after = _load(run / "eval_before.json"), _load(run / "eval_after.json")
    if before and after and at is None:  # held-out: the same problems before and after (the real arms)
        out["heldout"] = {"problems": after["summary"]["problems"], "n": after["summary"]["n"], "step": after.get("step"),
                          **{m: {"before": before["summary"][m], "after": after["summary"][m],
                                 "change": after["summary"][m] - before["summary"][m]} for m in HELDOUT}}
    last = train[-1] if train else {}
    if "ref_error_rel" in last:  # the exact float32 shadow of the same updates (reference arithmetic)
        out["restore_error"] = {k: last[k] for k in ("ref_error_rel", "ref_error_frac", "ref_moved_rel", "ref_moved_exact_rel",
                                                     "ref_moved_ratio", "ref_changed_frac", "ref_exact_changed_frac", "ref_sample")}
        ratio = last["ref_moved_ratio"]
        out["restore_error"]["share_of_squared_drift"] = 1 - 1 / ratio ** 2 if ratio else None
    syncs = [r for r in train if r.get("replica_divergence")]  # the artifact's engines, measured before each sync
    if syncs:
        out["replica_divergence"] = [{"step": int(r["step"]), **{k: r["replica_divergence"][k]
                                                                 for k in ("relative_distance_max", "differing_max")}}
                                     for r in syncs]
    drift = _load(analyses / "drift.json")
    if drift:
        label, m = next(iter(drift["models"].items()))
        out["drift"] = {"relative_distance": m["relative_distance"], "changed_fraction": m["num_changed"] / m["num_params"],
                        "rms_delta": m["rms_delta"],
                        "walk_rms": out["single_update_rms"] * math.sqrt(out["updates"]) if es else None,
                        "share_of_squared_distance": {c: m["by_category"][c]["share_of_squared_distance"] for c in CATS
                                                      if c in m["by_category"]}}
    sp = _load(analyses / "sparsity.json")
    if sp:
        m = next(iter(sp["models"].values()))
        T = max(out["updates"], 1)
        out["sparsity"] = {"multipliers": sp["multipliers"], "tau": m["taus"],
                           "fraction_below_of_nonzero": m["fraction_below"],
                           "walk_prediction": [math.erf(x / math.sqrt(2 * T)) for x in sp["multipliers"]] if es else None,
                           "nonzero_fraction": m["num_nonzero"] / m["num_params"], "paper": list(PAPER_SPARSITY),
                           "by_category": {c: m["by_category"][c]["fraction_below"] for c in CATS if c in m["by_category"]}}
    loc = _load(analyses / "localisation.json")
    if loc:
        m = next(iter(loc["models"].values()))
        fields = ("observed", "expected", "enrichment", "enrichment_interval", "p_enriched")
        out["top_k"] = {k: {c: {f: m[k]["enrichment"]["by_category"][c][f] for f in fields} for c in CATS}
                        for k in ("100", "144") if k in m}
        out["at_least_kth"] = {k: {"threshold": m[k]["at_least_kth"]["threshold"], "tied": m[k]["tied"],
                                   "num_coordinates": m[k]["at_least_kth"]["num_coordinates"],
                                   **{c: {f: m[k]["at_least_kth"]["enrichment"][c][f] for f in fields} for c in CATS}}
                               for k in ("100", "144") if k in m and m[k].get("at_least_kth")}
    mag = _load(analyses / "magnitude.json")
    if mag:
        m = next(iter(mag["models"].values()))
        out["magnitude"] = {"dtype": m["dtype"], "k": m["k"],
                            "relative_top_k": m["relative"]["by_category"],
                            "dtype_null": {c: m["dtype_null"]["by_category"][c] for c in CATS if c in m["dtype_null"]["by_category"]},
                            # coordinates without a step count (θ0 = 0 or θ far from θ0), kept at their Δ in the null
                            "held_out": {f: m["dtype_null"]["held_out"][f] for f in ("num", "in_observed_top_k")}
                            if "held_out" in m["dtype_null"] else None,
                            "one_step_share": {c: m["steps"]["by_category"][c]["one_step_share"] for c in CATS
                                               if c in m["steps"]["by_category"]},
                            "median_steps": {c: m["steps"]["by_category"][c]["median_steps"] for c in CATS
                                             if c in m["steps"]["by_category"]}}
    return out


def _below_1x(row: dict) -> float | None:
    s = row.get("sparsity")
    return s["fraction_below_of_nonzero"][s["multipliers"].index(1.0)] if s and 1.0 in s["multipliers"] else None


def contrasts(rows: list[dict]) -> dict:
    """Per model: the reference bf16 walk against the exact float32 walk at the same number of updates
    (the float32 run's analyses at that update, replayed, when it ran longer): drift ratio, the share of
    moved coordinates below τ = 1 × the single-update RMS (and its difference), the share that moved."""
    out = {}
    for ref in (r for r in rows if r["arithmetic"] == "reference" and r["fitness"] != "task reward" and "drift" in r):
        exact = [r for r in rows if r["model"] == ref["model"] and r["arithmetic"] == "exact" and r["dtype"] == "float32"
                 and r["updates"] == ref["updates"] and r["fitness"] == ref["fitness"] and "drift" in r]
        if not exact:
            continue
        e = exact[0]
        a, b = _below_1x(ref), _below_1x(e)
        out[ref["model"]] = {"updates": ref["updates"], "reference": ref["run"], "exact": e["run"],
                             "drift_reference": ref["drift"]["relative_distance"], "drift_exact": e["drift"]["relative_distance"],
                             "drift_ratio": ref["drift"]["relative_distance"] / e["drift"]["relative_distance"],
                             "below_tau_reference": a, "below_tau_exact": b,
                             "below_tau_difference": None if a is None or b is None else a - b,
                             "moved_reference": ref["drift"]["changed_fraction"], "moved_exact": e["drift"]["changed_fraction"],
                             "walk_prediction": math.erf(1 / math.sqrt(2 * ref["updates"]))}
    return out


def _top100(row: dict, category: str) -> float | None:
    """The expected count of ``category`` among the top-100 |Δ|: ``analyze magnitude``'s tie-aware count (a tie
    at the 100th value split evenly; bf16 updates tie by the thousand) when analysed, else the tie-broken one."""
    null = row.get("magnitude", {}).get("dtype_null", {}).get(category)
    if null is not None:
        return null["observed"]
    return row.get("top_k", {}).get("100", {}).get(category, {}).get("observed")


def task_contrasts(rows: list[dict]) -> dict:
    """The real arms (task rewards), per model: every other run (reference bf16, exact bf16, artifact bf16, GRPO bf16)
    against the exact float32 ES run of the same model and horizon: drift ratio, moved share, share of moved below
    τ = 1 × the ES single-update RMS, the expected top-100 norm / attention count (ties split evenly, ``_top100``)
    with its enrichment over the dtype-matched null, and the held-out changes side by side; an artifact arm also
    its drift over the reference bf16 arm's (``drift_ratio_over_reference``) and its replicas' divergence before
    each sync."""
    def changes(row):
        return {m: v["change"] for m, v in row.get("heldout", {}).items() if isinstance(v, dict)}

    out = {}
    for base in (r for r in rows if r["fitness"] == "task reward" and r["method"] == "es" and r["arithmetic"] == "exact"
                 and r["dtype"] == "float32" and "drift" in r):
        arms, base_below = {}, _below_1x(base)
        reference = [r for r in rows if r["fitness"] == "task reward" and r["method"] == "es" and r["arithmetic"] == "reference"
                     and r["model"] == base["model"] and r["updates"] == base["updates"] and "drift" in r]
        for r in rows:
            if r is base or r["fitness"] != "task reward" or r["model"] != base["model"] or r["updates"] != base["updates"] or "drift" not in r:
                continue
            below, null = _below_1x(r), r.get("magnitude", {}).get("dtype_null", {})
            arms[r["run"]] = {"method": r["method"], "arithmetic": r["arithmetic"], "dtype": r["dtype"],
                              "drift_ratio": r["drift"]["relative_distance"] / base["drift"]["relative_distance"],
                              "moved": r["drift"]["changed_fraction"], "below_tau": below,
                              "below_tau_difference": None if below is None or base_below is None else below - base_below,
                              **{f"top100_{c}": _top100(r, c) for c in ("norm", "attention")},
                              **{f"top100_{c}_vs_dtype_null": null.get(c, {}).get("enrichment") for c in ("norm", "attention")},
                              "heldout_change": changes(r)}
            if r["arithmetic"] == "artifact":  # the artifact's loop against Qiu et al.'s single-process one, same members
                arms[r["run"]]["drift_ratio_over_reference"] = (r["drift"]["relative_distance"] / reference[0]["drift"]["relative_distance"]
                                                                if reference else None)
                arms[r["run"]]["replica_divergence"] = r.get("replica_divergence")
        out[base["model"]] = {"updates": base["updates"], "exact_f32": base["run"],
                              "exact_f32_drift": base["drift"]["relative_distance"], "exact_f32_moved": base["drift"]["changed_fraction"],
                              "exact_f32_below_tau": base_below, "exact_f32_heldout_change": changes(base), "arms": arms}
    return out


def _f(x, fmt=".3g"):
    return "—" if x is None else format(x, fmt)


def markdown(rows: list[dict]) -> str:
    lines = ["| run | T | drift ‖Δ‖/‖θ0‖ | ÷ exact walk's | ‖θ−θ*‖/‖θ*‖ (exact shadow) | moved at all | below τ = 1×RMS (of moved) "
             "| walk erf(1/√2T) | top-100 norm / attn / mlp / emb (tie-broken) | coordinates ≥ 100th value: how many, norm / attn / mlp / emb enrichment |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d, t, tie = r.get("drift", {}), r.get("top_k", {}).get("100"), r.get("at_least_kth", {}).get("100")
        below, s = _below_1x(r), r.get("sparsity")
        walk = s["walk_prediction"][s["multipliers"].index(1.0)] if s and s["walk_prediction"] else None
        err = r.get("restore_error", {})
        ratio = err.get("ref_moved_ratio")
        counts = " / ".join(str(t[c]["observed"]) for c in CATS) if t else "—"
        ties = (f"{tie['num_coordinates']:,}: " + " / ".join(_f(tie[c]["enrichment"], ".2g") for c in CATS)) if tie else "—"
        lines.append(f"| {r['run']} | {r['updates']} | {_f(d.get('relative_distance'))} | {_f(ratio, '.3f') if ratio else '1 (exact)'} "
                     f"| {_f(err.get('ref_error_rel'))} | {_f(d.get('changed_fraction'), '.1%')} | {_f(below, '.1%') if below is not None else '—'} "
                     f"| {_f(walk, '.1%') if walk is not None else '—'} | {counts} | {ties} |")
    real = [r for r in rows if "heldout" in r]
    if real:
        lines += ["", "Held-out (the same 64 test problems before and after, 16 samples at T = 1; greedy: one greedy answer each):", "",
                  "| run | method / arithmetic / dtype | T | " + " | ".join(HELDOUT) + " |", "|---|---|---|" + "---|" * len(HELDOUT)]
        for r in real:
            h = r["heldout"]
            lines.append(f"| {r['run']} | {r['method']} / {r['arithmetic']} / {r['dtype']} | {r['updates']} | "
                         + " | ".join(f"{h[m]['before']:.3f} → {h[m]['after']:.3f}" for m in HELDOUT) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", help="the experiment's output directory (runs/refnum)")
    ap.add_argument("--out", default="docs/study/refnum")
    args = ap.parse_args(argv)
    src, out = Path(args.runs), Path(args.out)
    rows = []
    for run in sorted(p for p in src.iterdir() if (p / "config.toml").exists() and (p / "run.json").exists()):
        copy_run_files(run, out / "runs" / run.name)
        analyses = src / "analyses" / run.name
        copy_analyses(analyses, out / "analyses" / run.name)
        rows.append(summarise_run(run, analyses))
        for earlier in sorted(src.glob(f"analyses/{run.name}-at-*")):  # the same run at an earlier update (replayed)
            at = int(earlier.name.rsplit("-at-", 1)[1])
            copy_analyses(earlier, out / "analyses" / earlier.name)
            rows.append(summarise_run(run, earlier, at))
    earlier = _load(out / "summary.json") or {"runs": {}}
    have = {r["run"] for r in rows}
    rows += [r for name, r in earlier["runs"].items() if name not in have]  # walks not under RUNS now: their rows as written
    for r in rows:  # except an analysis since withdrawn (a magnitude.json computed before a fix, deleted): not kept
        if "magnitude" in r and not (out / "analyses" / r["run"] / "magnitude.json").exists():
            del r["magnitude"]
    for r in rows:  # rows written before GRPO runs were summarised
        r.setdefault("method", "es")
    rows.sort(key=lambda r: (r["model"], r["fitness"] == "task reward", r["updates"], r["run"]))
    real = task_contrasts(rows)
    (out / "summary.json").write_text(json.dumps({"runs": {r["run"]: r for r in rows}, "contrasts": contrasts(rows),
                                                  "task_contrasts": real}, indent=1) + "\n")
    if real:  # the real arms' contrasts on their own: the study's Q3d tests read it ("not run" while it is missing)
        (out / "real_arm.json").write_text(json.dumps(real, indent=1) + "\n")
    (out / "summary.md").write_text(markdown(rows))
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
