"""A task of a package's own: write a word with many vowels. It subclasses ``evolm.Task`` (examples,
answer extraction and a checker) and is registered through the ``evolm.tasks`` entry point."""

import random

from evolm import Example, Task, Verdict


class VowelWords(Task):
    name = "vowel_words"
    instruction = "Answer with one word."
    default_max_new_tokens = 16  # `evolm eval`'s completion length for this task (one word)

    def configure(self, target: float = 0.5) -> None:
        self.target = float(target)

    def examples(self, split, count, seed=0):
        rng = random.Random(f"{split}-{seed}")
        offset = 0 if split == "train" else 10_000  # train and test never share a prompt
        return [Example(f"{split}-{seed}-{i}", f"Write a word like '{rng.choice(['aqua', 'idea', 'audio', 'queue'])}' "
                        f"(#{offset + rng.randint(0, 9999)}).", None, {"target": self.target})
                for i in range(count or 16)]

    def extract_answer(self, completion):
        return completion.strip() or None

    def check(self, completion, example):
        letters = [c for c in completion.lower() if c.isalpha()]
        share = sum(c in "aeiou" for c in letters) / len(letters) if letters else 0.0
        return Verdict(format_ok=bool(letters), correct=share >= example.meta["target"], answer=completion.strip() or None)
