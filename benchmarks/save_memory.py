"""Peak memory across a checkpoint and ``final/``, streamed against the earlier float32-copy save, and the
memory account's lines against what they measure, on the CPU.

    python benchmarks/save_memory.py --json docs/benchmarks/save_memory_cpu.json
    python benchmarks/save_memory.py --tiny          # a random 2-layer model (the CPU test, seconds)

Method. One fresh child per (dtype, save): SmolLM2-135M loaded in ``dtype`` (bfloat16: float32 masters;
float32: in place), the ES ``ParamSet`` built by ``engine.build_paramset`` (counter noise, or the table
for the account's table line) and one update applied; then ``VmHWM`` is reset (``/proc/self/clear_refs``)
and ``steady`` is the RSS. The child then writes a checkpoint (``RunDir.save_checkpoint`` with the masters
file) and ``final/`` (``RunDir.save_final``) either as evolm writes them now (``streamed``: tensor by
tensor) or as it did before (``copy``: ``copy.deepcopy(model).to(float32)`` with the masters copied in,
``save_pretrained``, and ``masters.safetensors`` from cloned masters, re-enacted here). ``save peak -
steady`` is compared with the largest tensor in float32 (the target: at most one tensor beyond the steady
state). The account's lines (``evolm.memory.es_account``) are compared with the RSS growth they predict:
the masters (growth of building the ParamSet, bf16), the table (growth of building it) and the save
transient. Runs only what it is asked; read the load average it records.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MiB = 2**20


def _rss() -> dict[str, float]:
    """VmRSS and VmHWM of this process in bytes (``memory_per_param._status`` reads them in MiB)."""
    from memory_per_param import _status  # this script's folder is on sys.path

    return {k: v * MiB for k, v in _status().items()}


def _reset_peak() -> None:
    from memory_per_param import _reset_peaks

    _reset_peaks(["self"])


def child(args) -> dict:
    import copy

    import torch

    torch.set_num_threads(1)
    from evolm import config, memory, models
    from evolm.es.engine import build_paramset, float32_model, save_masters
    from evolm.runs import RunDir

    if args.tiny:
        sys.path.insert(0, str(ROOT / "tests"))
        from conftest import make_tiny_model  # noqa: E402

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(models.local_dir(models.DEFAULT_MODEL))
        model = make_tiny_model(tok).to(getattr(torch, args.dtype))
    else:
        model, tok = models.load(models.DEFAULT_MODEL, dtype=args.dtype, threads=1)
    cfg = config.from_dict(config.ESJob, {}, [f"model.dtype='{args.dtype}'", f"es.noise='{args.noise}'",
                                             "distributed.workers=0", "model.threads=1", "model.device='cpu'"])
    before_params = _rss()["VmRSS"]
    params = build_paramset(model, cfg)
    built = _rss()["VmRSS"] - before_params
    params.perturb(0, 0, 1, 1e-3)
    params.restore()
    params.apply_update(0, [1.0, -1.0], 1e-4)
    largest = max(p.numel() for p in model.parameters())
    shape = memory.ModelShape.of_model(model)
    account = {ln.item: ln.bytes for ln in memory.es_account(cfg, shape, cuda_here=False)}
    out = Path(tempfile.mkdtemp(prefix="save-memory-"))
    run = RunDir(out)
    _reset_peak()
    steady = _rss()["VmRSS"]
    if args.save == "streamed":
        run.save_checkpoint(float32_model(model, params), 1, {}, write_extra=lambda tmp: save_masters(params, tmp))
        run.save_final(float32_model(model, params), tok)
    else:  # the save evolm made before: a float32 deep copy of the model, masters cloned for their file
        from safetensors.torch import save_file

        def f32():
            if not params.keeps_masters:
                return model
            clone = copy.deepcopy(model).to(torch.float32)
            named = dict(clone.named_parameters())
            for name, master in zip(params.names, params.masters):
                named[name].data.copy_(master.view_as(named[name]))
            return clone

        def masters(tmp):
            if params.masters is not None:
                save_file(params.state_dict(), str(tmp / "masters.safetensors"))

        ck = out / "checkpoints" / "step_000001"
        ck.mkdir(parents=True)
        m = f32()
        m.save_pretrained(ck)
        masters(ck)
        del m
        m = f32()
        m.save_pretrained(out / "final")
        del m
    peak = _rss()["VmHWM"]
    import shutil

    shutil.rmtree(out, ignore_errors=True)
    return {"dtype": args.dtype, "noise": args.noise, "save": args.save, "params": shape.params,
            "largest_tensor_f32_bytes": 4 * largest, "steady_bytes": steady, "save_peak_bytes": peak,
            "save_extra_bytes": peak - steady, "extra_over_largest": (peak - steady) / (4 * largest),
            "paramset_build_bytes": built, "account": account}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", default="")
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--noise", default="counter")
    p.add_argument("--save", default="streamed")
    args = p.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)))
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1"}
    rows = []
    plan = [("bfloat16", "counter", "copy"), ("bfloat16", "counter", "streamed"), ("float32", "counter", "streamed"),
            ("float32", "table", "streamed")]
    for dtype, noise, save in plan:
        cmd = [sys.executable, __file__, "--child", "--dtype", dtype, "--noise", noise, "--save", save] + (["--tiny"] if args.tiny else [])
        done = subprocess.run(cmd, capture_output=True, text=True, env=env)
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.exit(f"child {dtype}/{noise}/{save} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(line[7:]))
        r = rows[-1]
        print(f"{dtype:9s} {noise:8s} {save:9s} steady {r['steady_bytes'] / MiB:7.0f} MiB  save peak {r['save_peak_bytes'] / MiB:7.0f} MiB"
              f"  +{r['save_extra_bytes'] / MiB:6.0f} MiB = {r['extra_over_largest']:.2f} x largest tensor "
              f"({r['largest_tensor_f32_bytes'] / MiB:.0f} MiB)", flush=True)
    by = {(r["dtype"], r["noise"], r["save"]): r for r in rows}
    bf = by[("bfloat16", "counter", "streamed")]
    f32c, f32t = by[("float32", "counter", "streamed")], by[("float32", "table", "streamed")]
    checks = {
        "float32 masters": (bf["account"].get("float32 masters", 0), bf["paramset_build_bytes"]),
        "noise table": (f32t["account"].get("noise table", 0), f32t["paramset_build_bytes"] - f32c["paramset_build_bytes"]),
        "save transient (one tensor, float32)": (bf["account"]["save transient (one tensor, float32)"], bf["save_extra_bytes"]),
    }
    account = {k: {"account_bytes": a, "measured_bytes": m, "measured_over_account": (m / a if a else None)}
               for k, (a, m) in checks.items()}
    for k, v in account.items():
        ratio = f"{v['measured_over_account']:.2f}" if v["measured_over_account"] is not None else "-"
        print(f"account {k:40s} {v['account_bytes'] / MiB:7.0f} MiB  measured {v['measured_bytes'] / MiB:7.0f} MiB  ratio {ratio}")
    result = {"load_average": os.getloadavg(), "rows": rows, "account_vs_measured": account,
              "model": "tiny" if args.tiny else "SmolLM2-135M-Instruct"}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
