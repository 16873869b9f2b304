"""Summarise the artifact null walks (experiments/refnum/artifact_walks.sh): per model and seed, the paper's own
arithmetic (the artifact's 8-engine loop) and Qiu et al.'s single-process bf16 loop against exact float32.

    python experiments/refnum/artifact_summary.py runs/refnum-artifact                                 # OUT/summary.json
    python experiments/refnum/artifact_summary.py runs/refnum-artifact --publish docs/study/artifact   # and publish

Reads OUT/aw-<model>-<arm>-s<seed>-null (run files) and OUT/analyses/aw-...-null (drift.json, sparsity.json,
written by the script's analyses), builds each row with summarise.py's ``summarise_run`` (the same numbers as the
Q3 walks), and per model lists, seed by seed (only seeds whose three arms reached the same update with both
analyses, and only once every seed the tests are declared over has: ``--seeds``, default 0,1,2; before that the
finished seeds' numbers are under ``so_far``), the numbers the study's Q4 tests read with the seed as the unit:

- ``drift_ratio_artifact``, ``drift_ratio_reference``: relative distance ||theta - theta0|| / ||theta0|| of the
  artifact (reference) walk over the exact float32 walk's, same seed, same updates;
- ``artifact_over_reference``: the artifact walk's drift over the reference walk's;
- ``below_tau_difference_artifact`` (``_reference``): share of moved coordinates below tau = 1 x the single-update
  RMS (lr / sqrt(N)), that walk minus the exact walk (C5's signature);
- ``divergence_before_sync`` / ``differing_before_sync``: the largest relative distance of a replica from replica
  0 (share of coordinates whose bits differ) logged just before a sync (``replica_divergence`` records);
- C6's localisation, per arm (``exact``, ``reference``, ``artifact``) and category (``norm``, ``attention``):
  ``top100_<cat>_<arm>``, the expected count among the top 100 |Δ| with a tie at the 100th value split evenly
  (``analyze localisation``'s ``tie_split``; bf16 walks tie by the hundred), ``top100_<cat>_enrichment_<arm>`` its
  enrichment over the category's parameter share (the exchangeable null), and ``top100_<cat>_vs_dtype_null_<arm>``
  over the dtype-spacing null (``analyze magnitude``: each coordinate's step count moved to another coordinate and
  scaled by that one's ulp; None where magnitude was not run). Exploratory: no Q4 test reads them.

Writes only OUT/summary.json and OUT/summary.md unless ``--publish DIR`` is given, which also copies the runs'
small files (no weights) and analyses under DIR. Nothing is computed from weights here.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from summarise import _below_1x, copy_analyses, copy_run_files, summarise_run  # noqa: E402

NAME = re.compile(r"^aw-(?P<model>[a-z0-9]+)-(?P<arm>exact|reference|artifact)-s(?P<seed>\d+)-null$")
ARMS = ("exact", "reference", "artifact")
MODELS = ("smollm2-135m", "gemma3-270m")
"""The models the study's Q4 tests read (model.spec of the refnum configs)."""


def _divergence(run: Path) -> tuple[float | None, float | None]:
    """The largest ``relative_distance_max`` and ``differing_max`` over the run's pre-sync records."""
    p = run / "metrics.jsonl"
    recs = [r["replica_divergence"] for r in map(json.loads, p.read_text().splitlines() if p.exists() else [])
            if isinstance(r, dict) and r.get("replica_divergence")]
    if not recs:
        return None, None
    return max(r["relative_distance_max"] for r in recs), max(r["differing_max"] for r in recs)


LOCALISED = ("norm", "attention")


def _tie_split(analyses: Path) -> dict:
    """``analyze localisation``'s top-100 record with the tie at the 100th |Δ| split evenly, by category ({} if none)."""
    p = analyses / "localisation.json"
    if not p.exists():
        return {}
    top = next(iter(json.loads(p.read_text())["models"].values())).get("100", {})
    if "tie_split" not in top and "coordinates" in top and "kth_abs_delta" in top:  # written before tie_split existed
        from evolm.analysis.localisation import tie_split

        top = {"tie_split": tie_split(top)}
    return top.get("tie_split", {}).get("by_category", {})


SEEDS = (0, 1, 2)
"""The seeds the study's Q4 tests are declared over (artifact_walks.sh's default SEEDS)."""


def summarise(out: Path, declared: tuple[int, ...] = SEEDS) -> dict:
    """Per model, the per-seed contrasts the Q4 tests read, filled only once every declared seed has finished (a t
    over the seeds finished so far would let the number of seeds depend on the numbers: optional stopping); until
    then the tested lists stay empty, the finished seeds' numbers are under ``so_far`` and the missing seeds under
    ``waiting_for``."""
    rows, by = {}, {}
    for run in sorted(p for p in out.iterdir() if NAME.match(p.name) and (p / "config.toml").exists()):
        m = NAME.match(run.name)
        row = summarise_run(run, out / "analyses" / run.name)
        row["arm"], row["seed"] = m["arm"], int(m["seed"])
        if m["arm"] == "artifact":
            row["divergence_before_sync"], row["differing_before_sync"] = _divergence(run)
        row["tie_split"] = _tie_split(out / "analyses" / run.name)
        rows[run.name] = row
        by.setdefault(row["model"], {}).setdefault(row["seed"], {})[m["arm"]] = row
    contrasts = {}
    for model in MODELS:  # every model the tests name, with empty lists until a seed finishes
        by.setdefault(model, {})
    for model, seeds in sorted(by.items()):
        c = {k: [] for k in ("seeds", "updates", "drift_ratio_artifact", "drift_ratio_reference", "artifact_over_reference",
                             "below_tau_difference_artifact", "below_tau_difference_reference",
                             "divergence_before_sync", "differing_before_sync")}
        loc = {f"top100_{cat}{what}_{arm}": [] for arm in ARMS for cat in LOCALISED
               for what in ("", "_enrichment", "_vs_dtype_null")}
        c.update(loc)
        c["incomplete"] = []
        for seed, arms in sorted(seeds.items()):
            ok = (all(a in arms and "drift" in arms[a] and "sparsity" in arms[a] for a in ARMS)
                  and len({arms[a]["updates"] for a in ARMS}) == 1)
            if not ok:
                c["incomplete"].append({"seed": seed, "arms": {a: arms[a]["updates"] for a in arms}})
                continue
            e, r, a = (arms[x] for x in ARMS)
            d = {x: arms[x]["drift"]["relative_distance"] for x in ARMS}
            c["seeds"].append(seed)
            c["updates"].append(e["updates"])
            c["drift_ratio_artifact"].append(d["artifact"] / d["exact"])
            c["drift_ratio_reference"].append(d["reference"] / d["exact"])
            c["artifact_over_reference"].append(d["artifact"] / d["reference"])
            c["below_tau_difference_artifact"].append(_below_1x(a) - _below_1x(e))
            c["below_tau_difference_reference"].append(_below_1x(r) - _below_1x(e))
            c["divergence_before_sync"].append(a.get("divergence_before_sync"))
            c["differing_before_sync"].append(a.get("differing_before_sync"))
            for arm in ARMS:
                for cat in LOCALISED:
                    tie = arms[arm].get("tie_split", {}).get(cat, {})
                    null = arms[arm].get("magnitude", {}).get("dtype_null", {}).get(cat, {})
                    c[f"top100_{cat}_{arm}"].append(tie.get("observed"))
                    c[f"top100_{cat}_enrichment_{arm}"].append(tie.get("enrichment"))
                    c[f"top100_{cat}_vs_dtype_null_{arm}"].append(null.get("enrichment"))
        c["waiting_for"] = [s for s in declared if s not in c["seeds"]]
        if c["waiting_for"] and c["seeds"]:
            tested = [k for k in c if k not in ("incomplete", "waiting_for")]
            c["so_far"] = {k: c[k] for k in tested}
            c.update({k: [] for k in tested})
        contrasts[model] = c
    return {"runs": rows, "contrasts": contrasts}


def markdown(summary: dict) -> str:
    lines = ["# The artifact's arithmetic against exact float32: null walks", "",
             "| model | seed | updates | drift artifact / exact | reference / exact | artifact / reference | "
             "below tau, artifact - exact | reference - exact | replica divergence before sync |", "|---|---|---|---|---|---|---|---|---|"]
    f = lambda x: "–" if x is None else f"{x:.4g}"  # noqa: E731
    for model, c in summary["contrasts"].items():
        missing = c.get("waiting_for", [])
        waiting = ("seeds " if len(missing) > 1 else "seed ") + ", ".join(map(str, missing))
        for rows, note in ((c, ""), (c.get("so_far", {}), f": so far (the tests wait for {waiting})")):
            for i, seed in enumerate(rows.get("seeds", [])):
                lines.append(f"| {model} | {seed} | {rows['updates'][i]}{note} | {f(rows['drift_ratio_artifact'][i])} | "
                             f"{f(rows['drift_ratio_reference'][i])} | {f(rows['artifact_over_reference'][i])} | "
                             f"{f(rows['below_tau_difference_artifact'][i])} | "
                             f"{f(rows['below_tau_difference_reference'][i])} | {f(rows['divergence_before_sync'][i])} |")
        for inc in c["incomplete"]:
            lines.append(f"| {model} | {inc['seed']} | incomplete: {inc['arms']} | | | | | | |")
    lines += ["", "Top 100 |Δ| (a tie at the 100th value split evenly): expected count, enrichment over the parameter "
              "share, and over the dtype-spacing null where `analyze magnitude` ran (exploratory: no Q4 test reads these)", "",
              "| model | seed | " + " | ".join(f"{cat}, {arm}" for arm in ARMS for cat in LOCALISED) + " |",
              "|---|---|" + "---|" * (len(ARMS) * len(LOCALISED))]
    for model, judged in summary["contrasts"].items():
        for c, note in ((judged, ""), (judged.get("so_far", {}), " (so far)")):
            for i, seed in enumerate(c.get("seeds", [])):
                cells = []
                for arm in ARMS:
                    for cat in LOCALISED:
                        n, e, d = (c[f"top100_{cat}{w}_{arm}"][i] for w in ("", "_enrichment", "_vs_dtype_null"))
                        cells.append(f"{f(n)} ({f(e)}x" + (f"; spacing null {f(d)}x)" if d is not None else ")"))
                lines.append(f"| {model} | {seed}{note} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _finished(run: Path) -> bool:
    p = run / "run.json"
    return p.exists() and json.loads(p.read_text()).get("status") == "finished"


def publish(out: Path, dest: Path) -> None:
    """Copy the finished walks (a walk still running or stopped stays under OUT) and the summary."""
    for run in sorted(p for p in out.iterdir() if NAME.match(p.name) and _finished(p)):
        copy_run_files(run, dest / "runs" / run.name)
        copy_analyses(out / "analyses" / run.name, dest / "analyses" / run.name)
    for name in ("summary.json", "summary.md"):
        shutil.copy2(out / name, dest / name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", help="artifact_walks.sh's output directory (runs/refnum-artifact)")
    ap.add_argument("--publish", default="", help="also copy the small files, analyses and summary here "
                                                   "(docs/study/artifact, which the study's Q4 tests read)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)),
                    help="the seeds the tests are declared over (comma-separated; default %(default)s): a model's "
                         "tested lists stay empty until all of them have finished")
    args = ap.parse_args(argv)
    out = Path(args.out)
    try:
        declared = tuple(int(x) for x in args.seeds.split(","))
    except ValueError:
        print(f"artifact_summary: --seeds {args.seeds!r} is not a comma-separated list of integers (e.g. 0,1,2)",
              file=sys.stderr)
        return 2
    if not out.is_dir():
        print(f"artifact_summary: {out} is not a directory; give artifact_walks.sh's OUT", file=sys.stderr)
        return 2
    summary = summarise(out, declared)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    if args.publish:
        Path(args.publish).mkdir(parents=True, exist_ok=True)
        publish(out, Path(args.publish))
    print((out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
