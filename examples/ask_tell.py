"""ES in your own loop: ask for members, score each with your own generation and checker, tell the fitnesses.

    python examples/ask_tell.py            # 10 updates on the embedded SmolLM2-135M
    python examples/ask_tell.py --tiny     # 2 updates (what CI runs)

AskTell uses evolm's exact-restore perturbations, noise and update (evolm.es.ask_tell), so its seed log
replays with evolm.es.engine.replay onto the base weights.
"""

import argparse

import torch

from evolm import AskTell
from evolm.models import load


def score(model, tokenizer, questions, answers, max_new_tokens) -> float:
    """Share of questions whose greedy completion contains the answer (your own generation loop)."""
    chats = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
             for q in questions]
    batch = tokenizer(chats, return_tensors="pt", padding=True, add_special_tokens=False)
    with torch.no_grad():
        out = model.generate(**batch, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id)
    texts = tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
    return sum(a in t for t, a in zip(texts, answers)) / len(answers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load("smollm2-135m")
    tokenizer.padding_side = "left"
    pairs = [(a, b) for a in range(12, 40, 3) for b in range(21, 60, 7)]
    es = AskTell(model, population=2 if args.tiny else 8, sigma=1e-3, lr=5e-4, seed=0)
    for iteration in range(2 if args.tiny else 10):
        batch = pairs[iteration * 4:(iteration + 1) * 4]
        questions, answers = [f"What is {a} + {b}?" for a, b in batch], [str(a + b) for a, b in batch]
        fitness = []
        for member in es.ask():
            with member:  # the weights are theta + sigma * eps in here, restored exactly on exit
                fitness.append(score(model, tokenizer, questions, answers, 8 if args.tiny else 16))
        update = es.tell(fitness)
        print(f"update {iteration + 1}: fitness {fitness} -> {update.status}")
    print(f"seed log: {len(es.seed_log)} records (header + updates); replay with evolm.es.engine.replay")


if __name__ == "__main__":
    main()
