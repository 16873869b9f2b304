"""ES from Python with your own data and reward, in TRL's shape (docs/custom-tasks.md).

    python examples/own_reward.py                 # 20 updates on the embedded SmolLM2-135M (~15-20 min on one CPU core)
    python examples/own_reward.py --tiny          # 2 updates (what CI runs)
    python examples/own_reward.py --method grpo   # the same arguments, evolm's GRPO baseline

The reward function lives in this file at module level: evolm records it as examples/own_reward.py:ends_with_answer,
so `evolm es --resume`, `evolm replay` and `evolm eval --like` find it again. The training call sits under
`if __name__ == "__main__":`, so finding the function does not train again.
"""

import argparse
import json
import re
from pathlib import Path

from evolm import ESConfig, ESTrainer, GRPOConfig, GRPOTrainer

HERE = Path(__file__).resolve().parent


def ends_with_answer(prompts, completions, answer, **columns):
    """1.0 when the completion's last number is the gold answer (TRL's reward_funcs signature)."""
    out = []
    for completion, gold in zip(completions, answer):
        numbers = re.findall(r"-?\d+", completion)
        out.append(1.0 if numbers and numbers[-1] == str(gold) else 0.0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="2 updates on a handful of prompts (a smoke run)")
    parser.add_argument("--method", choices=["es", "grpo"], default="es")
    parser.add_argument("--out", default="runs/own-reward")
    args = parser.parse_args()

    rows = [json.loads(line) for line in (HERE / "data" / "sums.jsonl").read_text().splitlines()]
    train, test = rows[:180], rows[180:]  # a list of dicts or a datasets.Dataset
    common = dict(output_dir=f"{args.out}-{args.method}", prompt_column="question", system_prompt="Answer with the number only.",
                  max_new_tokens=8 if args.tiny else 16, eval_count=4 if args.tiny else 20,
                  eval_samples=2 if args.tiny else 4, eval_k=[1, 2] if args.tiny else [1, 4],
                  overrides=["probe.every=0"])
    if args.method == "es":
        config = ESConfig(iterations=2 if args.tiny else 20, population=2 if args.tiny else 8,
                          prompts_per_iteration=2 if args.tiny else 16, **common)
        trainer = ESTrainer("smollm2-135m", [ends_with_answer], config, train_dataset=train, eval_dataset=test)
    else:
        config = GRPOConfig(max_steps=1 if args.tiny else 20, num_generations=2 if args.tiny else 8,
                            prompts_per_step=2 if args.tiny else 4, **common)
        trainer = GRPOTrainer("smollm2-135m", [ends_with_answer], config, train_dataset=train, eval_dataset=test)
    result = trainer.train()
    print(f"run directory: {result.run_dir}")
    for label, summary in (("before", result.eval_before), ("after", result.eval_after)):
        if summary:
            shown = {k: round(v, 3) for k, v in summary.items() if isinstance(v, float) and ("pass@" in k or "greedy" in k)}
            print(f"held-out {label}: {shown}")


if __name__ == "__main__":
    main()
