"""``evolm export RUN_DIR --to DIR``: a finished run as a Hugging Face hub-ready model folder (weights in
Hugging Face names, tokenizer, configs, a model card, the run's files), optionally pushed to the hub
(``evolm.export``)."""

from __future__ import annotations

import argparse


def register(sub) -> None:
    p = sub.add_parser(
        "export", help="write a finished run as a hub-ready model folder (model card included); optionally push it",
        description="Write the final weights of a finished run (ES, GRPO or pipeline) as a Hugging Face model folder: "
                    "safetensors in Hugging Face names, config.json, generation_config.json, the tokenizer and chat "
                    "template, a model card README.md (hub front matter; base model and its fingerprint, method, task "
                    "and reward, budget, held-out before/after table, resolved config, citations) and evolm_run/ (the "
                    "run's config.toml, run.json, metrics and evaluation files, and an ES run's seed_log.jsonl, from "
                    "which `evolm replay DIR/evolm_run` rebuilds the weights). An ES run saved with run.save = 'none' "
                    "is rebuilt from its seed log first. DIR must be new or empty: nothing is overwritten. The folder "
                    "loads with from_pretrained and with lm-eval-harness (lm_eval --model hf --model_args "
                    "pretrained=DIR).",
        epilog="examples:\n  evolm export runs/es-demo --to exports/es-demo\n"
               "  evolm export runs/es-demo --to exports/es-demo-bf16 --dtype bfloat16 --push-to-hub me/es-demo --private",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="a finished evolm run directory")
    p.add_argument("--to", required=True, metavar="DIR", help="folder to write (must not exist, or be empty)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="dtype of the exported weights (default: as the run's final/ stores them, float32 unless "
                        "run.save_dtype says otherwise)")
    p.add_argument("--push-to-hub", metavar="REPO", default=None,
                   help="then upload the folder to this hub model repository (org/name; created if absent; needs a "
                        "network and a token: `hf auth login` or HF_TOKEN)")
    p.add_argument("--private", action="store_true", help="with --push-to-hub: create the repository private")
    p.set_defaults(func=run)


def run(args) -> int:
    from evolm import export  # torch (casting, rebuilding): imported when the verb runs
    from evolm.errors import UserError

    if args.private and not args.push_to_hub:
        raise UserError("--private applies to --push-to-hub REPO; pass the repository too")
    if args.push_to_hub:
        export.check_hub()  # offline: one line before anything is written
    name = args.push_to_hub.split("/")[-1] if args.push_to_hub else None
    folder = export.export_run(args.run_dir, args.to, dtype=args.dtype, name=name)
    print(f"wrote {folder}")
    if args.push_to_hub:
        print(f"pushed to {export.push_to_hub(folder, args.push_to_hub, private=args.private)}")
    return 0
