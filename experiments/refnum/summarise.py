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
Nothing is computed from the weights here: every number is read from a file the analyses wrote.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from pathlib import Path

SMALL = ("config.toml", "run.json", "config_history.jsonl", "seed_log.jsonl", "metrics.jsonl")
CATS = ("norm", "attention", "mlp", "embedding")
PAPER_SPARSITY = (0.776, 0.930)


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
    label = None
    out = {"run": run.name + (f"-at-{at}" if at is not None else ""), "model": cfg["model"]["spec"], "dtype": cfg["model"]["dtype"],
           "arithmetic": cfg["es"].get("arithmetic", "exact"), "population": cfg["es"]["population"],
           "lr": cfg["es"]["lr"], "sigma": cfg["es"]["sigma"], "fitness": info.get("fitness", "task reward"),
           "updates": max((int(r["step"]) for r in train), default=0), "finished": (run / "final" / "config.json").exists()}
    out["single_update_rms"] = out["lr"] / math.sqrt(out["population"])
    last = train[-1] if train else {}
    if "ref_error_rel" in last:  # the exact float32 shadow of the same updates (reference arithmetic)
        out["restore_error"] = {k: last[k] for k in ("ref_error_rel", "ref_error_frac", "ref_moved_rel", "ref_moved_exact_rel",
                                                     "ref_moved_ratio", "ref_changed_frac", "ref_exact_changed_frac", "ref_sample")}
        ratio = last["ref_moved_ratio"]
        out["restore_error"]["share_of_squared_drift"] = 1 - 1 / ratio ** 2 if ratio else None
    drift = _load(analyses / "drift.json")
    if drift:
        label, m = next(iter(drift["models"].items()))
        out["drift"] = {"relative_distance": m["relative_distance"], "changed_fraction": m["num_changed"] / m["num_params"],
                        "rms_delta": m["rms_delta"], "walk_rms": out["single_update_rms"] * math.sqrt(out["updates"]),
                        "share_of_squared_distance": {c: m["by_category"][c]["share_of_squared_distance"] for c in CATS
                                                      if c in m["by_category"]}}
    sp = _load(analyses / "sparsity.json")
    if sp:
        m = next(iter(sp["models"].values()))
        T = max(out["updates"], 1)
        out["sparsity"] = {"multipliers": sp["multipliers"], "tau": m["taus"],
                           "fraction_below_of_nonzero": m["fraction_below"],
                           "walk_prediction": [math.erf(x / math.sqrt(2 * T)) for x in sp["multipliers"]],
                           "nonzero_fraction": m["num_nonzero"] / m["num_params"], "paper": list(PAPER_SPARSITY),
                           "by_category": {c: m["by_category"][c]["fraction_below"] for c in CATS if c in m["by_category"]}}
    loc = _load(analyses / "localisation.json")
    if loc:
        m = next(iter(loc["models"].values()))
        out["top_k"] = {k: {c: {f: m[k]["enrichment"]["by_category"][c][f] for f in
                                ("observed", "expected", "enrichment", "enrichment_interval", "p_enriched")}
                            for c in CATS} for k in ("100", "144") if k in m}
    mag = _load(analyses / "magnitude.json")
    if mag:
        m = next(iter(mag["models"].values()))
        out["magnitude"] = {"dtype": m["dtype"], "k": m["k"],
                            "relative_top_k": m["relative"]["by_category"],
                            "dtype_null": {c: m["dtype_null"]["by_category"][c] for c in CATS if c in m["dtype_null"]["by_category"]},
                            "one_step_share": {c: m["steps"]["by_category"][c]["one_step_share"] for c in CATS
                                               if c in m["steps"]["by_category"]},
                            "median_steps": {c: m["steps"]["by_category"][c]["median_steps"] for c in CATS
                                             if c in m["steps"]["by_category"]}}
    return out


def _f(x, fmt=".3g"):
    return "—" if x is None else format(x, fmt)


def markdown(rows: list[dict]) -> str:
    lines = ["| run | T | drift ‖Δ‖/‖θ0‖ | restore error's share of ‖Δ‖² | moved at all | below τ = 1×RMS (of moved) | walk erf(1/√2T) | top-100 norm / attn / mlp / emb | norm enrichment [95%] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d, s, t = r.get("drift", {}), r.get("sparsity"), r.get("top_k", {}).get("100")
        i = s["multipliers"].index(1.0) if s and 1.0 in s["multipliers"] else None
        share = r.get("restore_error", {}).get("share_of_squared_drift")
        counts = " / ".join(str(t[c]["observed"]) for c in CATS) if t else "—"
        norm = f"{t['norm']['enrichment']:.2f} [{t['norm']['enrichment_interval'][0]:.2f}, {t['norm']['enrichment_interval'][1]:.2f}]" if t else "—"
        lines.append(f"| {r['run']} | {r['updates']} | {_f(d.get('relative_distance'))} | {_f(share, '.1%') if share is not None else '0 (exact)'} "
                     f"| {_f(d.get('changed_fraction'), '.1%')} | {_f(s['fraction_below_of_nonzero'][i], '.1%') if i is not None else '—'} "
                     f"| {_f(s['walk_prediction'][i], '.1%') if i is not None else '—'} | {counts} | {norm} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("runs", help="the experiment's output directory (runs/refnum)")
    ap.add_argument("--out", default="docs/study/refnum")
    args = ap.parse_args(argv)
    src, out = Path(args.runs), Path(args.out)
    rows = []
    for run in sorted(p for p in src.iterdir() if (p / "config.toml").exists() and (p / "run.json").exists()):
        dest = out / "runs" / run.name
        dest.mkdir(parents=True, exist_ok=True)
        for name in SMALL:
            if (run / name).exists():
                shutil.copy2(run / name, dest / name)
        analyses = src / "analyses" / run.name
        if analyses.is_dir():
            adest = out / "analyses" / run.name
            adest.mkdir(parents=True, exist_ok=True)
            for f in analyses.iterdir():
                if f.suffix in (".json", ".png"):
                    shutil.copy2(f, adest / f.name)
        rows.append(summarise_run(run, analyses))
        for earlier in sorted(src.glob(f"analyses/{run.name}-at-*")):  # the same run at an earlier update (replayed)
            at = int(earlier.name.rsplit("-at-", 1)[1])
            adest = out / "analyses" / earlier.name
            adest.mkdir(parents=True, exist_ok=True)
            for f in earlier.iterdir():
                if f.suffix in (".json", ".png"):
                    shutil.copy2(f, adest / f.name)
            rows.append(summarise_run(run, earlier, at))
    rows.sort(key=lambda r: (r["model"], r["updates"], r["run"]))
    (out / "summary.json").write_text(json.dumps({"runs": {r["run"]: r for r in rows}}, indent=1) + "\n")
    (out / "summary.md").write_text(markdown(rows))
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
