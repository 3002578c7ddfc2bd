"""The sampler seam: prompts in, a `Rollout` out, and the log-probs of a rollout's completions under a model.

GRPO, RFT and evaluation each hold one `Sampler` and nothing else of the engine's sampling: it encodes the prompts
(the chat template, left-padding to a bucket, each prompt repeated for its group; on XLA widths only grow), knows
the stop and pad tokens, picks the execution mode (`sampling.sample`: the lean Gemma forward, eager or fixed-shape,
compiled where `torch.compile` runs, or HF's forward for any other model) and the log-prob forward
(`logprobs.completion_logprobs`). So every caller samples the same way on the same device: RFT compiles where GRPO
does. The fast paths (the streamed LM head, bf16 products, prepacked weights, the sampler's head moments) sit
behind these two methods; `SamplerSettings(lean=False)` runs the plain HF forward, the reference they are tested
against.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from ..data.chat import stop_token_ids
from .device import compile_supported, host_syncs_are_cheap
from .logprobs import ForwardOptions, HeadOptions, completion_logprobs
from .sampling import GroupPrompts, Rollout, SampledHead, SamplerSettings, sample
from .sharding import gathered


class Sampler:
    """One model's sampler: `generate(prompts)` → `Rollout` with `group_size` completions per prompt (each prompt's
    rows together), and `logprobs(rollout)` → the completions' per-token log-probs and entropies."""

    def __init__(self, model: torch.nn.Module, tokenizer: Any, settings: SamplerSettings | None = None, *,
                 group_size: int = 1, generator: torch.Generator | None = None,
                 share: tuple[int, int] = (0, 1)) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.share = share
        """(index, count): `generate` samples block `index` of `count` equal blocks of the prompts it is given (the
        data parallel processes of one run, `distributed.World`), with the sampling noise one process would draw
        for those rows; (0, 1) samples them all."""
        self.settings = settings or SamplerSettings()
        self.group_size, self.generator = group_size, generator
        self.device = next(model.parameters()).device
        self.stop_ids = stop_token_ids(tokenizer)
        self.pad_id: int = tokenizer.pad_token_id
        self.prompts = GroupPrompts(tokenizer, bucket=self.settings.prompt_bucket, group_size=group_size,
                                    device=self.device, max_length=self.settings.max_prompt_tokens)
        self.compiled = (self.settings.compiled if self.settings.compiled is not None
                         else compile_supported(self.device))

    def generate(self, prompts: list, *, temperature: float | None = None, top_p: float | None = None) -> Rollout:
        """`group_size` completions for each of `prompts` (chat messages or strings), rows (len(prompts) × G, …);
        with a `share` of (i, n), block i of n of them.
        On cpu/cuda the completion columns that are padding in every row are dropped (`Rollout.trimmed`); XLA
        keeps its one fixed shape."""
        s = self.settings
        ids, mask = self.prompts(prompts)  # every prompt's rows: one width, whichever block is sampled
        index, count = self.share
        if count > 1:
            if len(prompts) % count:
                raise ValueError(f"{len(prompts)} prompts do not split over {count} processes: give a multiple of "
                                 f"{count}")
            block = slice(index * ids.shape[0] // count, (index + 1) * ids.shape[0] // count)
            ids, mask = ids[block], mask[block]
        now = replace(s, temperature=s.temperature if temperature is None else temperature,
                      top_p=s.top_p if top_p is None else top_p, compiled=self.compiled, noise_block=self.share)
        with gathered(self.model):  # weights sharded over processes: whole while sampling (`sharding`)
            roll = sample(self.model, ids, mask, now, stop_ids=self.stop_ids, pad_id=self.pad_id,
                          generator=self.generator, group_size=self.group_size)
        return roll.trimmed() if host_syncs_are_cheap(self.device) else roll

    def logprobs(self, rollout: Rollout, rows: slice = slice(None), *, model: torch.nn.Module | None = None,
                 temperature: float | None = None, entropy_grad: bool = True, sampled: bool = False,
                 product_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(log π, entropy), each (rows, N), of `rollout`'s completion tokens at `rows` under `model` (default this
        sampler's; a reference policy's too), at `temperature` (default the settings'). `sampled`: use what the
        sampler kept of the LM head (the rollout must carry head moments, and `model` must hold the weights that
        sampled it). `entropy_grad=False`: no gradient flows through the entropy. `product_dtype`: the padding-free
        forward's frozen-weight products."""
        s = self.settings
        head = (SampledHead(rollout.sampling_logprobs[rows], rollout.head_mean[rows], rollout.entropy[rows])
                if sampled else None)
        ids = torch.cat([rollout.prompt_ids[rows], rollout.completion_ids[rows]], dim=1)
        attention = torch.cat([rollout.prompt_mask[rows], rollout.completion_mask[rows]], dim=1)
        return completion_logprobs(
            model or self.model, ids, attention, rollout.prompt_ids.shape[1],
            s.temperature if temperature is None else temperature,
            forward=ForwardOptions(group_size=self.group_size if s.share_prompt_forward else 1,
                                   padding_free=s.padding_free, product_dtype=product_dtype),
            head=HeadOptions(entropy_grad=entropy_grad), sampled=head,
        )
