"""Log-probabilities of completions: every path from a model and its tokens to log π(y_t) and the entropy.

`completion_logprobs` picks the forward (padding-free through `decoder.packed_completion_hidden`, each group's
prompt once, or the plain one); `token_logprobs_and_entropy` applies the LM head chunk by chunk, or through
`frozen_head_logprobs`, the fused kernel for a frozen head; `logprobs_from_head_mean` uses what the sampler kept
of the head instead (`sampling.SampledHead`); `plan_products` decides, once per GRPO trainer, whether the update
reuses the sampler's head and whether the products run in bf16. The losses that consume these log-probs are in
`losses.py`.
This module reads the sampler's types; the sampler never imports it.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
from transformers import DynamicCache

from . import decoder, sharding
from .cpu.products import product_dtype
from .decoder import position_ids_from_mask
from .device import activation_checkpoint, data_parallel_size, host_syncs_are_cheap, is_xla
from .models import base_model
from .sampling import SampledHead, check_grouped


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float, softcap: float | None) -> torch.Tensor:
    logits = (hidden @ weight.T).float()
    if softcap:
        logits = softcap * torch.tanh(logits / softcap)
    return logits / temperature


def _chunk_stats(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, temperature: float,
                 softcap: float | None = None, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    logits = _logits(hidden, weight, temperature, softcap)
    lse = torch.logsumexp(logits, dim=-1)
    logp = logits.gather(-1, ids.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    entropy = lse - (torch.softmax(logits, dim=-1) * logits).sum(-1)
    return logp, entropy


@dataclasses.dataclass(frozen=True)
class HeadOptions:
    """How `token_logprobs_and_entropy` applies the LM head: which of the entropy's costs to pay, and how to cut and
    order the work. The log-probs are the same whichever way, up to float summation order."""

    with_entropy: bool = True
    """False skips the entropy (returned as zeros), which costs a full softmax product per position."""
    entropy_grad: bool = True
    """False: no gradient will flow through H_t, so the fused path saves a third product (H_t comes back detached)."""
    chunk_rows: int | None = None
    """Rows of logits at once; None sizes chunks to `LOGIT_CHUNK_ELEMENTS` logits (`logit_chunks`: by rows, on XLA
    by positions)."""
    recompute: bool | None = None
    """Recompute each chunk's logits in the backward pass, keeping only the hidden states; None = on when grads are
    needed and the vocabulary is ≥ 32k."""
    fused: bool | None = None
    """Take `frozen_head_logprobs` (two matrix products per token, no full-vocabulary passes); None = when W is frozen
    (LoRA, or no grad), the vocabulary is ≥ 32k and the device is not XLA."""


def token_logprobs_and_entropy(hidden: torch.Tensor, lm_head_weight: torch.Tensor, ids: torch.Tensor,
                               temperature: float = 1.0, softcap: float | None = None, *,
                               options: HeadOptions = HeadOptions()) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π(y_t) and entropy H_t from final hidden states (B, T, d) and W (V, d), chunk by chunk:

        z = softcap·tanh((h Wᵀ)/softcap) / T,   log π(y_t) = z[y_t] − logsumexp(z),
        H_t = logsumexp(z) − Σ_v softmax(z)_v z_v

    Never materialises a full-vocabulary log-softmax, and never the whole batch's logits at once: with
    Gemma's 262k vocabulary one (128 × 256) batch of logits would be 34 GB in fp32. `options` chooses the chunks,
    recomputation, the fused kernel and what the entropy costs (`HeadOptions`).
    """
    if hidden.shape[:2] != ids.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and ids {tuple(ids.shape)} disagree on (B, T)")
    fused, recompute = options.fused, options.recompute
    if fused is None:
        fused = not lm_head_weight.requires_grad and lm_head_weight.shape[0] >= 32768 and hidden.device.type != "xla"
    if fused:
        logp, entropy = frozen_head_logprobs(hidden.reshape(-1, hidden.shape[-1]), lm_head_weight, ids.reshape(-1),
                                             temperature=temperature, softcap=softcap,
                                             entropy_grad=options.entropy_grad)
        entropy = entropy.view_as(ids) if options.with_entropy else torch.zeros_like(ids, dtype=logp.dtype)
        return logp.view_as(ids), entropy
    if recompute is None:
        recompute = torch.is_grad_enabled() and lm_head_weight.shape[0] >= 32768
    chunks, dim = logit_chunks(ids.shape, lm_head_weight.shape[0], chunk_rows=options.chunk_rows,
                               xla=is_xla(hidden.device))
    stats = functools.partial(_chunk_stats, temperature=temperature, softcap=softcap,
                              with_entropy=options.with_entropy)
    logps, ents = [], []
    for chunk in chunks:
        h, y = hidden[chunk], ids[chunk]
        lp, ent = activation_checkpoint(stats, h, lm_head_weight, y) if recompute else stats(h, lm_head_weight, y)
        logps.append(lp)
        ents.append(ent)
    return torch.cat(logps, dim), torch.cat(ents, dim)


FUSED_ROWS, FUSED_COLUMNS = 256, 16384
"""Block of the fused LM head: 256 tokens × 16,384 vocabulary entries (16 MiB of fp32 logits) at a time,
the fastest of the sizes `python -m tools bench` tries on a 2-core CPU; each block is used while it is in cache."""


def _frozen_head_block(hidden: torch.Tensor, weight: torch.Tensor, *, temperature: float, softcap: float | None,
                       entropy_grad: bool) -> tuple[torch.Tensor, ...]:
    """Over the vocabulary in blocks, with a running maximum (online softmax), for rows h of `hidden`:
    lse = logsumexp(z), z̄ = Σ p z, E = Σ_v p_v c_v W_v and (entropy_grad) E_z = Σ_v p_v (z_v − z̄) c_v W_v,
    where p = softmax(z) and c_v = ∂z_v/∂(h·W_v)·T (1 without a softcap, 1 − tanh²(h·W_v/softcap) with one)."""
    rows, width = hidden.shape[0], hidden.shape[1]
    m = hidden.new_full((rows, 1), float("-inf"), dtype=torch.float32)
    total, total_z = (hidden.new_zeros((rows, 1), dtype=torch.float32) for _ in range(2))
    expect, expect_z = (hidden.new_zeros((rows, width), dtype=torch.float32) for _ in range(2))
    # block-sized buffers written in place: a fresh 16 MiB tensor per operation costs more in page faults
    # than the operation itself on a CPU
    z_buffer, p_buffer, pz_buffer = (hidden.new_empty((rows, FUSED_COLUMNS), dtype=torch.float32) for _ in range(3))
    for start in range(0, weight.shape[0], FUSED_COLUMNS):
        w = weight[start : start + FUSED_COLUMNS]
        cols = w.shape[0]
        z, p = z_buffer[:, :cols], p_buffer[:, :cols]
        if hidden.dtype == torch.float32 and cols == FUSED_COLUMNS:
            torch.mm(hidden, w.T, out=z)
        else:
            z.copy_(torch.mm(hidden, w.T))
        if softcap:
            z.div_(softcap).tanh_()
            slope = 1 - z * z
            z.mul_(softcap)
        if temperature != 1.0:
            z.div_(temperature)
        m_new = torch.maximum(m, z.amax(1, keepdim=True))
        rescale = torch.exp(m - m_new)
        torch.sub(z, m_new, out=p).exp_()
        m = m_new
        total = total * rescale + p.sum(1, keepdim=True)
        total_z = total_z * rescale + torch.mul(p, z, out=pz_buffer[:, :cols]).sum(1, keepdim=True)
        if softcap:
            p.mul_(slope)
        w32 = w.float()
        expect = expect * rescale + torch.mm(p, w32)
        if entropy_grad:
            expect_z = expect_z * rescale + torch.mm(p.mul_(z), w32)
    mean_z = total_z / total
    expect = expect / total
    expect_z = expect_z / total - mean_z * expect if entropy_grad else None
    return (m + torch.log(total)).squeeze(1), mean_z.squeeze(1), expect, expect_z


class _FrozenHeadLogprobs(torch.autograd.Function):
    """log π(y_t) and H_t with the gradient to the hidden states only (W frozen):
    ∂log π(y_t)/∂h_t = (c_y W_y − E_t)/T and ∂H_t/∂h_t = −E_z,t/T, both kept from the forward pass."""

    @staticmethod
    def forward(ctx, hidden, weight, ids, settings):  # noqa: ANN001, ANN205
        temperature, softcap, entropy_grad = settings
        target_w = weight[ids].float()
        target = (hidden.float() * target_w).sum(1)  # h·W_y
        if softcap:
            capped = torch.tanh(target / softcap)
            target, target_w = softcap * capped, target_w * (1 - capped * capped).unsqueeze(1)
        blocks = [_frozen_head_block(hidden[s : s + FUSED_ROWS], weight, temperature=temperature, softcap=softcap,
                                     entropy_grad=entropy_grad) for s in range(0, hidden.shape[0], FUSED_ROWS)]
        lse, mean_z, expect = (torch.cat([b[i] for b in blocks]) for i in range(3))
        expect_z = torch.cat([b[3] for b in blocks]) if entropy_grad else None
        ctx.save_for_backward(target_w - expect, expect_z)
        ctx.temperature, ctx.dtype = temperature, hidden.dtype
        return target / temperature - lse, lse - mean_z

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):  # noqa: ANN001, ANN205
        logp_slope, expect_z = ctx.saved_tensors
        grad = grad_logp.unsqueeze(1) * logp_slope
        if expect_z is not None and grad_entropy is not None:
            grad = grad - grad_entropy.unsqueeze(1) * expect_z
        return (grad / ctx.temperature).to(ctx.dtype), None, None, None


def frozen_head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *, temperature: float = 1.0,
                         softcap: float | None = None, entropy_grad: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(log π(y_t), H_t) for N hidden states (N, d) through a frozen LM head W (V, d), as `token_logprobs_and_entropy`
    defines them, fused: per block of tokens and vocabulary entries, z = hWᵀ, an online logsumexp, and the
    p-weighted sum of W's rows E_t = Σ_v p_v W_v that the gradient needs — two matrix products per token (three
    with `entropy_grad`), where computing logits, then recomputing them for the backward pass, then
    multiplying the logits' gradient by W takes three, plus a dozen passes over N × V logits in memory.
    Gradients reach `hidden` only. `entropy_grad=False`: H_t is returned detached."""
    if weight.requires_grad and torch.is_grad_enabled():
        raise ValueError(
            "frozen_head_logprobs: the LM head weight requires grad (full fine-tuning); use token_logprobs_and_entropy")
    logp, entropy = _FrozenHeadLogprobs.apply(hidden, weight.detach(), ids, (temperature, softcap, entropy_grad))
    return logp, entropy if entropy_grad else entropy.detach()


def logprobs_from_head_mean(hidden: torch.Tensor, weight: torch.Tensor, ids: torch.Tensor, *, logprobs: torch.Tensor,
                            head_mean: torch.Tensor, temperature: float | torch.Tensor = 1.0) -> torch.Tensor:
    """log π(y_t) through a frozen LM head W (no softcap) from what the sampler kept when it drew y_t from the same
    policy: its log-prob and the expected head row E_t = Σ_v π_v W_v (`choice.HeadMoments`). No pass over the
    vocabulary:

        log π(y_t) = logprobs_t + (h_t − sg(h_t)) · (W_{y_t} − E_t) / T

    Its value is `logprobs`; its gradient with respect to h_t is (W_{y_t} − E_t)/T, the exact gradient of
    log softmax(h_t Wᵀ/T)_{y_t} — so long as h_t is the hidden state the sampler saw (the same weights, no dropout),
    up to float summation order. Shapes: hidden (…, d), ids/logprobs (…), head_mean (…, d)."""
    rows = torch.nn.functional.embedding(ids, weight.detach()).float()
    return logprobs + ((hidden.float() - hidden.float().detach()) * (rows - head_mean)).sum(-1) / temperature


LOGIT_CHUNK_ELEMENTS = 2**27
"""Logits computed at once: 2²⁷ fp32 values = 512 MiB (the tiny model's 106-token vocabulary fits whole
batches; Gemma's 262k vocabulary gets 2 rows of 256 tokens per chunk)."""


def logit_chunk_rows(tokens_per_row: int, vocab: int, budget: int = LOGIT_CHUNK_ELEMENTS) -> int:
    """Rows per chunk so that one chunk's logits stay within `budget` elements (at least 1 row)."""
    return max(1, budget // max(1, tokens_per_row * vocab))


def logit_chunks(shape: tuple[int, int] | torch.Size, vocab: int, *, chunk_rows: int | None = None,
                 xla: bool = False) -> tuple[list[tuple[slice, slice]], int]:
    """How `token_logprobs_and_entropy` cuts a (B, T) batch so that one chunk's logits stay within
    `LOGIT_CHUNK_ELEMENTS` (or `chunk_rows` rows' worth): (index of each chunk, the dimension they join along).
    Off XLA by rows. On XLA by positions, every chunk holding the whole batch: under SPMD the batch is split over
    the devices, and a chunk of its rows makes XLA's SPMD partitioner stop the process (a failed check, torch_xla
    2.8 and 2.9); the budget then counts one device's share of the rows."""
    rows, positions = shape
    if not xla:
        chunk_rows = chunk_rows or logit_chunk_rows(positions, vocab, budget=LOGIT_CHUNK_ELEMENTS)
        return [(slice(s, s + chunk_rows), slice(None)) for s in range(0, rows, chunk_rows)], 0
    rows_per_device = -(-rows // data_parallel_size())
    if chunk_rows:  # the logits of `chunk_rows` whole rows on each device
        columns = chunk_rows * positions // rows_per_device
    else:
        columns = LOGIT_CHUNK_ELEMENTS // (rows_per_device * vocab)
    columns = min(positions, max(1, columns))
    return [(slice(None), slice(s, s + columns)) for s in range(0, positions, columns)], 1



@dataclasses.dataclass(frozen=True)
class ForwardOptions:
    """Which forward `completion_logprobs` runs to reach the completion positions' hidden states. Each gives the same
    values and gradients up to float summation order (and bf16 rounding with `product_dtype`)."""

    group_size: int = 1
    """G > 1: rows g·G … g·G + G − 1 share one prompt (as the trainer lays them out), run once for the group."""
    padding_free: bool = False
    """The real tokens only (`packed_logprobs`; Gemma on cpu/cuda)."""
    product_dtype: torch.dtype | None = None
    """Padding-free only: the dtype of the frozen base weights' products (`decoder.packed_completion_hidden`)."""


def completion_logprobs(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                        prompt_len: int, temperature: float = 1.0, *, forward: ForwardOptions = ForwardOptions(),
                        head: HeadOptions = HeadOptions(),
                        sampled: SampledHead | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token log π(y_t | prompt, y_<t) and entropy, each (B, N), for the completion part of `input_ids`
    (B, P + N). `sampled`: what the sampler kept of the head when it drew these tokens with this model's current
    weights — the head is then not applied at all (`logprobs_from_head_mean`; the entropy comes back as sampled,
    detached). `head`: how the LM head is applied otherwise (`token_logprobs_and_entropy`).

    One forward of the decoder, hidden states sliced to the N positions that predict completion tokens, then
    the LM head applied chunk by chunk. `forward` picks the forward:

    - `padding_free` (Gemma on cpu/cuda): `packed_logprobs` — the real tokens only.
    - `group_size` G > 1: `_shared_prompt_hidden` runs each prompt once and repeats its keys and values for its G
      completions — B/G·P + B·N positions instead of B·(P + N). Gradients flow back through the repeat.
    - otherwise, or under gradient checkpointing (HF drops the cache inside its layers): the plain forward; with
      weights sharded over processes, the model's own (`sharding.last_hidden_state`).
    """
    hf = base_model(model)
    checkpointing = hf.training and _checkpointing(hf)
    sharded = sharding.is_sharded(hf)  # weights sharded over processes: the model's own forward gathers each layer
    if (forward.padding_free and decoder.supports(hf) and host_syncs_are_cheap(input_ids.device) and not checkpointing
            and not sharded):
        return packed_logprobs(hf, input_ids, attention_mask, prompt_len, temperature=temperature, forward=forward,
                               head=head, sampled=sampled)
    if sharded:
        hidden = sharding.last_hidden_state(hf, input_ids, attention_mask, position_ids_from_mask(attention_mask))
        hidden = hidden[:, prompt_len - 1 : -1, :]
    elif forward.group_size > 1 and not checkpointing:
        hidden = _shared_prompt_hidden(hf, input_ids, attention_mask, prompt_len, forward.group_size)
    else:
        # use_cache=False also avoids Gemma 3's sliding-window cache, which crashes on XLA
        hidden = hf.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
        ).last_hidden_state[:, prompt_len - 1 : -1, :]
    if sampled is not None:
        return logprobs_from_head_mean(hidden, hf.lm_head.weight, input_ids[:, prompt_len:], logprobs=sampled.logprobs,
                                       head_mean=sampled.head_mean, temperature=temperature), sampled.entropy
    return token_logprobs_and_entropy(hidden, hf.lm_head.weight, input_ids[:, prompt_len:], temperature,
                                      softcap=decoder.final_softcap(hf), options=head)


def packed_logprobs(hf: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int, *,
                    temperature: float, forward: ForwardOptions, head: HeadOptions = HeadOptions(),
                    sampled: SampledHead | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`completion_logprobs` on the real tokens only: `decoder.packed_completion_hidden` computes no left padding,
    no padding after the stop tokens and each group's prompt once, and the LM head runs on the real completion
    tokens only; log-probs and entropies at padding are 0. The completion masks must be 1 up to the stop token
    and 0 after it, as `sample` makes them."""
    targets = input_ids[:, prompt_len:]
    check_grouped(input_ids[:, :prompt_len], forward.group_size)
    hidden, index = decoder.packed_completion_hidden(hf, input_ids, attention_mask, prompt_len, forward.group_size,
                                                     product_dtype=forward.product_dtype)

    def unpacked(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(targets.numel()).index_copy(0, index, x.reshape(-1)[: index.numel()]).view_as(targets)

    if sampled is not None:
        logp = logprobs_from_head_mean(
            hidden, hf.lm_head.weight, targets.reshape(-1)[index], logprobs=sampled.logprobs.reshape(-1)[index],
            head_mean=sampled.head_mean.reshape(-1, hidden.shape[1])[index], temperature=temperature)
        return unpacked(logp), sampled.entropy
    width = targets.shape[1]  # LM-head chunks of `width` real tokens, sized as for the padded forward
    rows = -(-index.numel() // width)
    hidden = torch.cat([hidden, hidden.new_zeros(rows * width - index.numel(), hidden.shape[1])]).view(rows, width, -1)
    flat_targets = targets.reshape(-1)[index]
    flat_targets = torch.cat([flat_targets, flat_targets.new_zeros(rows * width - index.numel())]).view(rows, width)
    logp, entropy = token_logprobs_and_entropy(hidden, hf.lm_head.weight, flat_targets, temperature,
                                               softcap=decoder.final_softcap(hf), options=head)
    return unpacked(logp), unpacked(entropy)


def _checkpointing(hf: torch.nn.Module) -> bool:
    return any(getattr(layer, "gradient_checkpointing", False) for layer in hf.model.layers)


def _shared_prompt_hidden(hf: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prompt_len: int,
                          group_size: int) -> torch.Tensor:
    """Final hidden states at the N positions that predict completion tokens, running each group's prompt once."""
    total = input_ids.shape[1]
    check_grouped(input_ids[:, :prompt_len], group_size)
    prompt_ids, prompt_mask = input_ids[::group_size, :prompt_len], attention_mask[::group_size, :prompt_len]
    positions = position_ids_from_mask(prompt_mask)
    # A plain (full-length) cache on every layer: sliding-window layers still get their window from the
    # attention mask, and nothing is cropped between the two calls.
    cache = DynamicCache()
    prompt_out = hf.model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=positions,
                          past_key_values=cache, use_cache=True)
    if cache.get_seq_length() != prompt_len:  # a layer refused the cache: sharing would drop the prompt
        raise RuntimeError(
            f"{type(hf).__name__} did not fill the KV cache ({cache.get_seq_length()} of {prompt_len} positions); "
            "run with GRPOConfig.share_prompt_forward=False"
        )
    last_prompt = prompt_out.last_hidden_state[:, -1:, :].repeat_interleave(group_size, 0)
    if total - prompt_len == 1:  # one completion token: the prompt's last position predicts it
        return last_prompt
    cache.batch_repeat_interleave(group_size)
    completion_out = hf.model(
        input_ids=input_ids[:, prompt_len:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids_from_mask(attention_mask)[:, prompt_len:-1],
        past_key_values=cache,
        use_cache=True,
        cache_position=torch.arange(prompt_len, total - 1, device=input_ids.device),
    )
    return torch.cat([last_prompt, completion_out.last_hidden_state], dim=1)


@dataclasses.dataclass(frozen=True)
class ProductPlan:
    """How a GRPO step computes its log-probs on this device (`plan_products` decides it once per trainer)."""

    reuse_sampler_head: bool
    """The update's first forward takes the LM head's log-partition from the sampler's head moments
    (`logprobs_from_head_mean`) instead of a second pass over the vocabulary."""
    bf16_products: bool
    """The frozen weights' products run in bf16 where the CPU has them natively (`products.product_dtype`), in the
    rollout and the update; else fp32."""

    @property
    def rollout_product_dtype(self) -> torch.dtype | None:
        """`SamplerSettings.product_dtype`: None = the device's choice (bf16 on a CPU with native bf16 products), else
        fp32."""
        return None if self.bf16_products else torch.float32

    def update_product_dtype(self, model: torch.nn.Module) -> torch.dtype | None:
        """`ForwardOptions.product_dtype` for the update's forwards (None = the weights' own dtype)."""
        return product_dtype(base_model(model).get_input_embeddings().weight) if self.bf16_products else None


def plan_products(model: torch.nn.Module, *, reuse_sampler_head: bool, cpu_bf16: bool, entropy_coef: float,
                  compares_logprobs: bool) -> ProductPlan:
    """`GRPOConfig.reuse_sampler_head` applies where the update's forward would see the hidden states the sampler
    saw (no dropout) through a frozen, large, uncapped LM head on the CPU, and no gradient flows through the entropy
    (`entropy_coef` 0). `GRPOConfig.cpu_bf16` applies unless the update compares the sampler's log-probs with ones
    it computes itself (`compares_logprobs`: a reference pass, or μ > 1) while the head is reused: there fp32 keeps
    a ratio or KL of the same policy exactly 1 or 0 instead of bf16 rounding noise."""
    hf = base_model(model)
    head = hf.get_output_embeddings()
    reuse = bool(
        reuse_sampler_head and entropy_coef == 0 and next(model.parameters()).device.type == "cpu"
        and head is not None and not head.weight.requires_grad and head.weight.shape[0] >= 32768
        and not decoder.final_softcap(hf) and not getattr(hf.config, "attention_dropout", 0.0)
        and not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules()))
    return ProductPlan(reuse_sampler_head=reuse, bf16_products=cpu_bf16 and not (compares_logprobs and reuse))
