"""Evaluation throughput against raw generation throughput on the same prompts (target: ratio >= 0.9).

Both sides sample exactly the same completions: the raw side calls ``generator.generate`` with the
batches and per-batch seeds that ``evaluate_task`` uses, with entropy recording on, so the ratio
isolates the evaluator's own cost (prompt rendering, cache lookups and fsynced appends, scoring with
the task's checker, pass@k / maj@k summaries). A third timing without entropy recording shows what
measuring entropy during generation costs. Timings are wall-clock and process CPU time (the CPU
figure is steadier on a shared machine).

    python benchmarks/eval_throughput.py                       # SmolLM2-135M on CPU, CSQA, 8 x 8 samples
    python benchmarks/eval_throughput.py --task gsm8k --max-new-tokens 64
    python benchmarks/eval_throughput.py --device cuda --random-init CONFIG_DIR --task-param csqa.path=FILE
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--random-init", metavar="DIR", help="build a randomly initialised model from DIR's config.json and tokenizer "
                                                         "(throughput only; for machines without the weights)")
    ap.add_argument("--task", default="csqa")
    ap.add_argument("--task-param", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--problems", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=1, help="alternate raw/eval timings this many times")
    args = ap.parse_args()

    import torch

    from evolm import models
    from evolm.backends.base import SamplingParams
    from evolm.backends.hf import HFGenerator
    from evolm.evaluate import GenerationCache, evaluate_task
    from evolm.seeding import ids_seed
    from evolm.tasks import make_task

    torch.set_num_threads(args.threads)
    if args.random_init:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        config = AutoConfig.from_pretrained(args.random_init)
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype)).to(args.device).eval()
        tokenizer = AutoTokenizer.from_pretrained(args.random_init)
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        model, tokenizer = models.load(args.model, dtype=args.dtype, threads=args.threads, device=args.device)
    params = dict(kv.split("=", 1) for kv in args.task_param)
    task = make_task(args.task, **{k.split(".", 1)[-1]: v for k, v in params.items()})
    examples = task.examples("test", args.problems, seed=0)
    prompts = [task.render_prompt(e, tokenizer) for e in examples]
    generator = HFGenerator(model, tokenizer, batch_size=args.batch_size)
    sampling = SamplingParams(n=args.n, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)
    per_call = max(1, args.batch_size // args.n)
    chunks = [list(range(i, min(i + per_call, len(examples)))) for i in range(0, len(examples), per_call)]

    def raw(entropy: bool):
        out = []
        for chunk in chunks:
            p = replace(sampling, seed=ids_seed(sampling.seed, [examples[i].id for i in chunk]), return_entropy=entropy)
            out += generator.generate([prompts[i] for i in chunk], p)
        return out

    fp = models.fingerprint(model)
    generator.generate(prompts[:1], replace(sampling, n=2, max_new_tokens=4))  # warm-up
    samples = len(examples) * args.n
    rows = []
    for rep in range(args.repeats):
        raw_out, raw_wall, raw_cpu = timed(lambda: raw(True))
        with tempfile.TemporaryDirectory() as cache_dir:
            res, ev_wall, ev_cpu = timed(lambda: evaluate_task(generator, task, tokenizer, examples, sampling, ks=[1, args.n],
                                                               cache=GenerationCache(cache_dir, fp), progress=False))
        _, plain_wall, plain_cpu = timed(lambda: raw(False))
        raw_texts = [[task.check(c.text, e).answer for c in cs] for cs, e in zip(raw_out, examples)]
        identical = raw_texts == [p.answers for p in res.problems]
        rows.append({"raw_wall_s": raw_wall, "raw_cpu_s": raw_cpu, "eval_wall_s": ev_wall, "eval_cpu_s": ev_cpu,
                     "raw_no_entropy_wall_s": plain_wall, "raw_no_entropy_cpu_s": plain_cpu, "same_answers": identical})
    tot = {k: sum(r[k] for r in rows) for k in rows[0] if k != "same_answers"}
    report = {
        "device": args.device, "model": "random-init " + args.random_init if args.random_init else args.model, "task": args.task,
        "problems": len(examples), "n": args.n, "max_new_tokens": args.max_new_tokens, "batch_size": args.batch_size,
        "threads": args.threads, "repeats": args.repeats, "samples_per_run": samples,
        "raw_samples_per_s": samples * args.repeats / tot["raw_wall_s"],
        "eval_samples_per_s": samples * args.repeats / tot["eval_wall_s"],
        "ratio_wall": tot["raw_wall_s"] / tot["eval_wall_s"],
        "ratio_cpu": tot["raw_cpu_s"] / tot["eval_cpu_s"],
        "entropy_cost_wall": tot["raw_wall_s"] / tot["raw_no_entropy_wall_s"] - 1,
        "same_answers": all(r["same_answers"] for r in rows),
        "mean_tokens": res.summary["mean_tokens"], "runs": rows,
    }
    print(json.dumps(report, indent=2))
    print(f"eval/raw throughput: {report['ratio_wall']:.3f} (wall), {report['ratio_cpu']:.3f} (CPU time); target >= 0.9")


if __name__ == "__main__":
    main()
