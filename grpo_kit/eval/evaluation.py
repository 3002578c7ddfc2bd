"""Evaluation on a held-out set: greedy accuracy, format rate and the completions themselves; k samples per problem
(pass@1, maj@k, pass@k); and the paired difference between two models on the same problems, with its interval."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..data.answer_format import ANSWER_CLOSE, ANSWER_OPEN, extract_answer
from ..data.chat import decode_completions
from ..data.rewards import correctness_reward, strict_format_reward
from ..data.tasks import completion_text
from ..engine.sampler import Sampler, SamplerSettings


@dataclass(frozen=True)
class Batching:
    """How evaluation feeds prompts to the sampler: shapes only, never a token."""

    size: int = 64
    """Prompts per sampler call at most; the calls are made equal (200 prompts at 64: four of 50)."""
    prompt_bucket: int = 32
    """Prompts are left-padded to a multiple of this many tokens (the GRPO run's `prompt_bucket` keeps its shapes)."""


def generate_completions(
    model: torch.nn.Module, tokenizer: Any, prompts: list, *, max_new_tokens: int = 40, greedy: bool = True,
    temperature: float = 1.0, generator: torch.Generator | None = None, batching: Batching = Batching(),
) -> list[str]:
    """Completions for `prompts` with the kit's sampler (`Sampler` takes every other `SamplerSettings`), in equal
    batches of at most `batching.size`, the last one padded with repeats where they cannot be equal, so every batch
    has the same shape."""
    sampler = Sampler(model, tokenizer, SamplerSettings(
        max_new_tokens=max_new_tokens, temperature=temperature, greedy=greedy, prompt_bucket=batching.prompt_bucket),
        generator=generator)
    batch_size = batching.size
    batch_size = math.ceil(len(prompts) / math.ceil(len(prompts) / batch_size)) if prompts else batch_size
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        real = len(chunk)
        chunk = chunk + [chunk[-1]] * (batch_size - real) if len(prompts) > batch_size else chunk
        comp = sampler.generate(chunk).completion_ids.cpu()
        texts += decode_completions(tokenizer, comp[:real].tolist())
    return texts


def _correct(dataset: Any, prompts: list, completions: list[str], answers: list, *, repeat: int) -> list[float]:
    """`correctness_reward` of each completion (each answer `repeat` times in a row), under the rows' `answer_type`
    where the dataset has that column (a user's task)."""
    columns = dataset.column_names if hasattr(dataset, "column_names") else list(dataset)
    answers = [a for a in answers for _ in range(repeat)]
    types = None
    if "answer_type" in columns:
        types = [t for t in dataset["answer_type"] for _ in range(repeat)]
    return correctness_reward(prompts, completions, answer=answers, answer_type=types)


def evaluate(
    model: torch.nn.Module,
    tokenizer: Any,
    dataset: Any,
    *,
    max_new_tokens: int = 40,
    batching: Batching = Batching(),
    samples: int = 8,
) -> dict[str, Any]:
    """Greedy accuracy (correct answer in `<answer>`) and strict-format rate on `dataset` (prompt, answer); `correct`
    says which problems were solved, `samples` shows the first `samples` (prompt, completion, answer, correct)."""
    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    completions = generate_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batching=batching)
    correct = _correct(dataset, prompts, completions, answers, repeat=1)
    formatted = strict_format_reward(prompts, completions)
    n = max(len(completions), 1)
    return {
        "accuracy": sum(correct) / n,
        "format_rate": sum(formatted) / n,
        "n": len(completions),
        "correct": [bool(k) for k in correct],
        "samples": [
            {"prompt": p[-1]["content"] if isinstance(p, list) else p, "completion": c, "answer": a, "correct": bool(k)}
            for p, c, a, k in list(zip(prompts, completions, answers, correct, strict=True))[:samples]
        ],
    }


def sampled_scores(
    model: torch.nn.Module, tokenizer: Any, dataset: Any, *, k: int, max_new_tokens: int = 40, temperature: float = 1.0,
    batching: Batching = Batching(), seed: int = 0,
) -> dict[str, Any]:
    """k completions per problem of `dataset` (prompt, answer), sampled at `temperature` (seeded), scored three ways:

        pass@1  = mean over problems of c_i / k          (sampled accuracy: how often one sample is right)
        maj@k   = share of problems whose most frequent extracted answer among the k is right (ties: the first seen)
        pass@k  = share of problems with c_i ≥ 1         (how often the model *can* solve it; the unbiased
                  estimator 1 − C(n − c, k) / C(n, k) at n = k)

    with c_i the number of correct samples of problem i (`correct_counts`). RL tends to raise pass@1 and maj@k more
    than pass@k (it sharpens what the model already samples)."""
    if k < 1:
        raise ValueError(f"sampled_scores: k={k}: must be ≥ 1")
    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    repeated = [p for p in prompts for _ in range(k)]
    completions = generate_completions(model, tokenizer, repeated, max_new_tokens=max_new_tokens, greedy=False,
                                       temperature=temperature, generator=torch.Generator().manual_seed(seed),
                                       batching=batching)
    correct = _correct(dataset, repeated, completions, answers, repeat=k)
    counts, majority = [], []
    for i in range(len(answers)):
        group = range(i * k, (i + 1) * k)
        counts.append(sum(1 for j in group if correct[j]))
        votes = Counter(a for j in group if (a := extract_answer(completion_text(completions[j]))) is not None)
        majority.append(
            f"{ANSWER_OPEN}{votes.most_common(1)[0][0]}{ANSWER_CLOSE}" if votes else "")  # no answer: never right
    majority_right = [bool(c) for c in _correct(dataset, [None] * len(answers), majority, answers, repeat=1)]
    n = max(len(prompts), 1)
    return {"pass@1": sum(counts) / (n * k), f"maj@{k}": sum(majority_right) / n,
            f"pass@{k}": sum(c > 0 for c in counts) / n, "correct_counts": counts, "majority_correct": majority_right}


def pass_at_k(
    model: torch.nn.Module, tokenizer: Any, dataset: Any, *, k: int, max_new_tokens: int = 40, temperature: float = 1.0,
    batching: Batching = Batching(), seed: int = 0,
) -> float:
    """pass@k alone (see `sampled_scores`): the share of problems in `dataset` with at least one correct answer among
    k completions sampled at `temperature` (seeded)."""
    if k < 1:
        raise ValueError(f"pass_at_k: k={k}: must be ≥ 1")
    return sampled_scores(model, tokenizer, dataset, k=k, max_new_tokens=max_new_tokens, temperature=temperature,
                          batching=batching, seed=seed)[f"pass@{k}"]


BOOTSTRAP_SAMPLES = 10_000
"""Bootstrap resamples behind a paired difference's interval (its ends move by < 0.1 point between seeds)."""


def paired_difference(first: Sequence[Sequence[bool]], second: Sequence[Sequence[bool]], *,
                      samples: int = BOOTSTRAP_SAMPLES, seed: int = 0) -> dict[str, Any]:
    """second − first in points of accuracy, over problems paired within each seed (`first[s][i]`: problem i of
    seed s solved by the first model). The 95 % interval is the 2.5th–97.5th percentile of the difference over
    `samples` bootstrap resamples of each seed's problems (with replacement, seeds kept apart)."""
    rng = np.random.default_rng(seed)
    diffs = [np.asarray(b, dtype=float) - np.asarray(a, dtype=float) for a, b in zip(first, second, strict=True)]
    n = sum(len(d) for d in diffs)
    if n == 0:
        raise ValueError("paired_difference: no paired problems")
    totals = np.zeros(samples)
    for d in diffs:
        totals += d[rng.integers(0, len(d), size=(samples, len(d)))].sum(axis=1)
    low, high = np.percentile(100 * totals / n, [2.5, 97.5])
    fixed = int(sum((d > 0).sum() for d in diffs))
    broken = int(sum((d < 0).sum() for d in diffs))
    return {"mean": round(100 * sum(d.sum() for d in diffs) / n, 2), "low": round(float(low), 2),
            "high": round(float(high), 2), "fixed": fixed, "broken": broken, "paired_problems": n}
