"""evolm against Qiu et al.'s own ES script, side by side on their Countdown prompts, one thread each.

    python benchmarks/peer_qiu.py --qiu-repo ~/src/es-fine-tuning-paper --out runs/bench/peer_qiu
    python benchmarks/peer_qiu.py --qiu-repo DIR --out DIR --members 2 --prompts 2 --max-new-tokens 4 --iterations 1  # smoke

``--qiu-repo`` is a checkout of github.com/VsonicV/es-fine-tuning-paper (read at commit 523afc8): its
``countdown/es_fine-tuning_countdown.py`` (HF ``generate``, one model per ``--gpu_threads``), ``countdown_task.py``
and ``data/countdown.json``. Nothing of it is imported into evolm; this script runs it as a peer.

Method (the measurement of issue 44: same run, one thread each, pinned to separate cores, started together):

- **Their side**: ``countdown/`` copied under ``--out``, its module constants set to the sizes below
  (``NUM_ITERATIONS``, ``POPULATION_SIZE``, ``max_new_tokens``; sigma, alpha, greedy decoding and seed as
  published), the model placed on the CPU (``device_map={"": "cpu"}`` where it names the accelerator's
  process index, a CUDA device) and the per-iteration CUDA memory print removed (a CPU build of torch has no
  CUDA allocator); run as ``--model_name <the embedded SmolLM2-135M-Instruct directory> --precision fp32
  --gpu_threads 1 --data_sample P`` with ``OMP_NUM_THREADS=1``. Seconds per iteration: its own
  ``Iteration i/N, Time: X s`` lines (perturb, generate, reward, restore for every member, then the update).
- **evolm's side**: ``evolm es --config configs/es-countdown-qiu.toml`` (their prompts verbatim, no chat
  template, their reward, greedy) on the same file's first P rows, the same N, P and token limit, float32,
  one thread, no held-out evaluation; seconds per update from ``metrics.jsonl`` (the same span: members and
  update). ``generation.prefix_cache`` is on (the default); ``--no-prefix-cache`` turns it off.
  ``generation.cpu_matmul`` is ``auto`` (oneDNN linears where torch has oneDNN); ``--cpu-matmul torch`` runs
  torch's BLAS as evolm did before it.
- Both processes start at once, ``taskset`` to cores 0 and 1 (when the machine has two), so the machine's
  state is shared; the load average is recorded before and after. Their first iteration includes no
  compilation that evolm's lacks (neither compiles), so every iteration counts; medians are reported.

Writes ``--out``/peer_qiu.json and prints one markdown row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = "es_fine-tuning_countdown.py"
ITERATION = re.compile(r"Iteration (\d+)/(\d+), Time: ([0-9.]+)s")


def patch_script(source: str, iterations: int, population: int, max_new_tokens: int) -> str:
    """Their script with our sizes and a CPU device; each edit must apply exactly once (a changed script fails loudly)."""
    edits = [(r"^NUM_ITERATIONS = \d+", f"NUM_ITERATIONS = {iterations}"),
             (r"^POPULATION_SIZE = \d+", f"POPULATION_SIZE = {population}"),
             (r"^max_new_tokens = \d+", f"max_new_tokens = {max_new_tokens}"),
             (r'device_map=\{"": accelerator\.process_index\}', 'device_map={"": "cpu"}'),
             (r"^(\s*)print\(f\"GPU Memory:.*$", r"\1pass")]
    for pattern, repl in edits:
        source, n = re.subn(pattern, repl, source, flags=re.M)
        if n != 1:
            raise SystemExit(f"peer_qiu: {SCRIPT} changed: '{pattern}' matched {n} times, not once; check --qiu-repo's commit "
                             "(read at 523afc8)")
    return source


def _pin(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and (os.cpu_count() or 1) >= 2 else []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qiu-repo", required=True, help="checkout of github.com/VsonicV/es-fine-tuning-paper")
    ap.add_argument("--out", required=True)
    ap.add_argument("--members", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--no-prefix-cache", action="store_true")
    ap.add_argument("--cpu-matmul", choices=["auto", "onednn", "torch"], default="auto",
                    help="evolm's generation.cpu_matmul (torch: torch's BLAS, as evolm ran before oneDNN linears)")
    args = ap.parse_args(argv)

    repo, out = Path(args.qiu_repo).expanduser(), Path(args.out)
    src = repo / "countdown"
    if not (src / SCRIPT).is_file() or not (src / "data" / "countdown.json").is_file():
        print(f"peer_qiu: {src} lacks {SCRIPT} or data/countdown.json; pass a checkout of "
              "github.com/VsonicV/es-fine-tuning-paper as --qiu-repo", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT / "src"))
    from evolm import models

    model_dir = models.local_dir("smollm2-135m")
    qiu = out / "qiu"
    if qiu.exists():
        shutil.rmtree(qiu)
    shutil.copytree(src, qiu)
    (qiu / SCRIPT).write_text(patch_script((src / SCRIPT).read_text(), args.iterations, args.members, args.max_new_tokens))
    data = (qiu / "data" / "countdown.json").resolve()
    # their script saves its model to f"{model_name}_es_..." beside the name it was given: a link inside --out keeps
    # that save (and the hub cache it names) under --out, never beside the user's model cache
    (qiu / "smollm2").symlink_to(model_dir, target_is_directory=True)

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(ROOT / "src")}
    their_cmd = _pin(1) + [sys.executable, SCRIPT, "--model_name", "smollm2", "--precision", "fp32", "--gpu_threads", "1",
                           "--data_sample", str(args.prompts), "--hf_cache_dir", str(out / "hf_cache")]
    name = "evolm-side"
    if (out / name).exists():
        shutil.rmtree(out / name)
    sets = [f"run.out_dir='{out}'", f"run.name='{name}'", "run.progress=false", "run.save='none'",
            "model.threads=1", "distributed.workers=0", f"es.iterations={args.iterations}",
            f"es.population={args.members}", f"es.prompts_per_iteration={args.prompts}",
            f"generation.max_new_tokens={args.max_new_tokens}", f"generation.batch_size={args.prompts}",
            f"generation.prefix_cache={'false' if args.no_prefix_cache else 'true'}", "eval.before_after=false",
            f"generation.cpu_matmul='{args.cpu_matmul}'",
            f"task.params={{path='{data}', train_rows={args.prompts}, test_rows=1}}"]
    ours_cmd = _pin(0) + [sys.executable, "-m", "evolm", "es", "--config", str(ROOT / "configs" / "es-countdown-qiu.toml")]
    for s in sets:
        ours_cmd += ["--set", s]

    load_before = os.getloadavg()
    t0 = time.time()
    with open(out / "qiu.log", "w") as qlog, open(out / "evolm.log", "w") as elog:
        theirs = subprocess.Popen(their_cmd, cwd=qiu, env=env, stdout=qlog, stderr=subprocess.STDOUT)
        ours = subprocess.Popen(ours_cmd, env=env, stdout=elog, stderr=subprocess.STDOUT)
        rc = (theirs.wait(), ours.wait())
    load_after = os.getloadavg()
    if any(rc):
        print(f"peer_qiu: a side failed (theirs rc {rc[0]}, evolm rc {rc[1]}); see {out}/qiu.log and {out}/evolm.log",
              file=sys.stderr)
        return 1
    their_s = [float(m.group(3)) for m in ITERATION.finditer((out / "qiu.log").read_text())]
    records = [json.loads(line) for line in (out / name / "metrics.jsonl").read_text().splitlines() if line.strip()]
    our_s = [r["seconds"] for r in records if r.get("kind") == "train"]
    result = {"cpu": _cpu_name(), "threads": 1, "model": "smollm2-135m", "dtype": "float32", "members": args.members,
              "prompts": args.prompts, "max_new_tokens": args.max_new_tokens, "iterations": args.iterations,
              "prefix_cache": not args.no_prefix_cache, "cpu_matmul": args.cpu_matmul, "qiu_commit": _commit(repo),
              "seconds_qiu": their_s, "seconds_evolm": our_s,
              "median_qiu": statistics.median(their_s), "median_evolm": statistics.median(our_s),
              "ratio": statistics.median(their_s) / statistics.median(our_s),
              "load_before": list(load_before), "load_after": list(load_after), "wall_s": time.time() - t0}
    (out / "peer_qiu.json").write_text(json.dumps(result, indent=2) + "\n")
    print("| members x prompts x tokens | Qiu et al. s/iter | evolm s/iter | ratio | load before -> after |")
    print("|---|---|---|---|---|")
    print(f"| {args.members} x {args.prompts} x {args.max_new_tokens} | {result['median_qiu']:.1f} | "
          f"{result['median_evolm']:.1f} | **{result['ratio']:.2f}x** | {load_before[0]:.2f} -> {load_after[0]:.2f} |")
    return 0


def _commit(repo: Path) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    raise SystemExit(main())
