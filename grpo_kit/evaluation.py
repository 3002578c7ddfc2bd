"""Greedy evaluation on a held-out set: accuracy, format rate, and the completions themselves."""

from __future__ import annotations

from typing import Any

import torch

from .chat import stop_token_ids
from .rewards import correctness_reward, strict_format_reward
from .sampling import encode_prompts, sample


def generate_completions(
    model: torch.nn.Module, tokenizer: Any, prompts: list, *, max_new_tokens: int = 40, batch_size: int = 64,
    bucket: int = 32, greedy: bool = True, temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0,
    generator: torch.Generator | None = None,
) -> list[str]:
    """Completions for `prompts` with the kit's sampler, in fixed-size batches (the last one padded with
    repeats so every batch has the same shape)."""
    stops, pad = stop_token_ids(tokenizer), tokenizer.pad_token_id
    texts: list[str] = []
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        real = len(chunk)
        chunk = chunk + [chunk[-1]] * (batch_size - real) if len(prompts) > batch_size else chunk
        ids, mask = encode_prompts(tokenizer, chunk, bucket)
        roll = sample(model, ids, mask, max_new_tokens=max_new_tokens, stop_ids=stops, pad_id=pad, temperature=temperature, top_k=top_k, top_p=top_p,
                      greedy=greedy, generator=generator)
        comp = roll.completion_ids.cpu()
        texts += tokenizer.batch_decode(comp[:real], skip_special_tokens=True)
    return texts


def evaluate(
    model: torch.nn.Module, tokenizer: Any, dataset: Any, *, max_new_tokens: int = 40, batch_size: int = 64, bucket: int = 32,
) -> dict[str, Any]:
    """Greedy accuracy (correct answer in `<answer>`) and strict-format rate on `dataset` (prompt, answer)."""
    prompts, answers = list(dataset["prompt"]), list(dataset["answer"])
    completions = generate_completions(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                       bucket=bucket)
    correct = correctness_reward(prompts, completions, answer=answers)
    formatted = strict_format_reward(prompts, completions)
    n = max(len(completions), 1)
    return {
        "accuracy": sum(correct) / n,
        "format_rate": sum(formatted) / n,
        "n": len(completions),
        "samples": [
            {"prompt": p[-1]["content"] if isinstance(p, list) else p, "completion": c, "answer": a, "correct": bool(k)}
            for p, c, a, k in list(zip(prompts, completions, answers, correct, strict=True))[:8]
        ],
    }
