"""Online difficulty targeting: draw prompts from the levels where the policy's pass rate is near one half.

A group of G completions teaches GRPO something only when its outcomes differ, which is likeliest at a pass rate p near
0.5 (the outcome's variance p(1 − p) is largest there) and impossible at 0 or 1. From the rollouts already made, each
level (a template, a difficulty grade: the rows' `level` column) keeps a pass-rate estimate; a prompt drawn from the
task's stream is kept with probability proportional to its level's p(1 − p), so kept prompts come from each level in
proportion to p(1 − p) times the stream's own share of that level (balanced online difficulty filtering,
arXiv 2504.03380). Host-side bookkeeping only: the same on cpu, cuda and XLA.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

MEMORY = 0.9
"""Each time a level's groups are scored, its earlier evidence counts this much (the policy moves: old pass rates go
stale); ≈ the last 10 batches of a level count."""
MIN_WEIGHT = 0.01
"""The smallest p(1 − p) a level is kept at, so a level that looks solved or hopeless is still drawn now and then
(≈ 1 prompt in 25 of an even level's) and its estimate can move."""
MAX_DRAWS = 100_000
"""Draws from the stream for one prompt before giving up (at MIN_WEIGHT about 25 are needed on average)."""


def pass_rate(successes: float, trials: float) -> float:
    """The level's pass rate under a uniform prior: p = (s + 1) / (n + 2) (0.5 for a level never seen)."""
    return (successes + 1.0) / (trials + 2.0)


def keep_probability(successes: float, trials: float) -> float:
    """max(p(1 − p), MIN_WEIGHT) / 0.25: 1 at p = 0.5, the chance that a prompt of this level is kept."""
    p = pass_rate(successes, trials)
    return max(p * (1.0 - p), MIN_WEIGHT) / 0.25


class DifficultyTargeting:
    """Pass-rate counts per level and the prompt filter they drive. `next_prompt(stream)` draws rows until one is
    kept (each draw's coin comes from the seed and the draw's index, so a resumed run keeps the same rows);
    `record(levels, outcomes)` adds a batch's outcomes (1 = right) per completion."""

    def __init__(self, key: str = "level", seed: int = 0) -> None:
        self.key, self.seed = key, seed
        self.counts: dict[str, list[float]] = {}
        """level → [successes, trials], both decayed by MEMORY per scored batch of that level."""
        self.draws = 0
        """Rows drawn from the stream so far (kept or not)."""

    def next_prompt(self, stream: Iterator[dict[str, Any]]) -> dict[str, Any]:
        for _ in range(MAX_DRAWS):
            row = next(stream)
            self.draws += 1
            level = self.level(row)
            coin = random.Random(f"{self.seed}:{self.draws}").random()
            if coin < keep_probability(*self.counts.get(level, (0.0, 0.0))):
                return row
        raise RuntimeError(f"difficulty targeting kept none of {MAX_DRAWS} prompts drawn")

    def level(self, row: dict[str, Any]) -> str:
        if self.key not in row:
            raise ValueError(f"GRPOConfig.difficulty_targeting: a prompt row has no {self.key!r} column (it has "
                             f"{sorted(row)}); give each row its level, or turn difficulty targeting off")
        return str(row[self.key])

    def record(self, levels: list[str], outcomes: list[float]) -> None:
        """Add one scored batch: `outcomes[i]` (1 right, 0 wrong) of a completion whose prompt's level is
        `levels[i]`."""
        batch: dict[str, list[float]] = {}
        for level, outcome in zip(levels, outcomes, strict=True):
            if outcome != outcome:  # NaN: the reward did not apply to this completion
                continue
            s, n = batch.setdefault(level, [0.0, 0.0])
            batch[level] = [s + float(outcome), n + 1.0]
        for level, (s, n) in batch.items():
            old_s, old_n = self.counts.get(level, (0.0, 0.0))
            self.counts[level] = [MEMORY * old_s + s, MEMORY * old_n + n]

    def pass_rates(self) -> dict[str, float]:
        """Each level's current pass-rate estimate (logged with every step)."""
        return {level: pass_rate(s, n) for level, (s, n) in sorted(self.counts.items())}

    def state(self) -> dict[str, Any]:
        return {"counts": self.counts, "draws": self.draws}

    def restore(self, state: dict[str, Any], stream: Iterator[dict[str, Any]]) -> None:
        """Continue a saved run: its counts, and the stream moved past the rows it had drawn."""
        self.counts = {k: list(v) for k, v in state["counts"].items()}
        for _ in range(state["draws"]):
            next(stream)
        self.draws = state["draws"]
