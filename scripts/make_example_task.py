"""Write grpo_kit/assets/data/example_task.jsonl: the example of "your own data" that notebook 09 and the tests use.

240 rows with the columns `question`, `answer` and (on half of them) `solution`, mixing three answer types the way a
hackathon task might: word problems with a number for an answer, multiple choice with a letter, and short text.
Deterministic (seeded): run it again and the file is byte for byte the same.

    python scripts/make_example_task.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from grpo_kit.data.answer_format import REASONING_CLOSE, REASONING_OPEN
from grpo_kit.data.tasks import WORD_PROBLEMS, make_word_problem

OUT = Path(__file__).resolve().parent.parent / "grpo_kit" / "assets" / "data" / "example_task.jsonl"
WORDS = ("cat", "lamp", "river", "stone", "gemma", "tiger", "paper", "cloud", "apple", "mango", "piano", "robot",
         "lemon", "train", "ocean", "pencil", "garden", "rocket", "silver", "planet", "window", "bridge", "castle",
         "forest", "winter", "summer", "number", "answer", "reason", "little", "yellow", "purple", "orange", "dragon",
         "marble", "candle", "basket", "button", "kitten", "monkey", "rabbit", "turtle", "violin", "guitar", "butter",
         "cookie")


def word_problem(rng: random.Random) -> dict[str, str]:
    template = rng.choice([t for t in WORD_PROBLEMS if len(t.steps) == 2])
    row = make_word_problem(template, rng)
    reasoning = row["completion"].split(REASONING_OPEN)[1].split(REASONING_CLOSE)[0]
    return {"question": row["prompt"][-1]["content"], "answer": row["answer"], "solution": reasoning}


def choice_problem(rng: random.Random) -> dict[str, str]:
    numbers = rng.sample(range(10, 100), 4)
    letters = "ABCD"
    question = "Which number is the largest? " + " ".join(f"({c}) {n}" for c, n in zip(letters, numbers, strict=True))
    best = max(range(4), key=lambda i: numbers[i])
    others = ", ".join(str(n) for i, n in enumerate(numbers) if i != best)
    return {"question": question, "answer": letters[best],
            "solution": f"{numbers[best]} is larger than {others}, so the answer is ({letters[best]})."}


def text_problem(rng: random.Random) -> dict[str, str]:
    word = rng.choice(WORDS) + rng.choice(("", "s"))  # 96 words in all
    spelled = "-".join(word)
    return {"question": f"Write the word '{word}' backwards.", "answer": word[::-1],
            "solution": f"{spelled} read from the end is {'-'.join(word[::-1])}."}


def main() -> None:
    rng = random.Random(2026)
    makers = (word_problem, choice_problem, text_problem)
    rows, seen = [], set()
    while len(rows) < 240:
        row = makers[len(rows) % 3](rng)
        if row["question"] in seen:
            continue
        seen.add(row["question"])
        if len(rows) % 2:  # half the rows come without a worked solution: answers only, as most data does
            row = {k: v for k, v in row.items() if k != "solution"}
        rows.append(row)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} rows to {OUT}")


if __name__ == "__main__":
    main()
