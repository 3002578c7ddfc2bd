"""The GRPO trainer: orchestration only. One step is six readable stages:

    1. rollout    sample G completions for each of P prompts (fixed shapes, static KV cache)
    2. reward     score them with every reward function, weighted
    3. advantage  compare each completion with its group
    4. update     μ passes of micro-batched forward/backward, clip, guard, optimizer step
    5. log        one device→host transfer of all metrics, appended to metrics.jsonl
    6. save       checkpoint when asked

Live `Controls` (learning rate, β, temperature, top-p, ε, reward weights, pause/stop/save) are read once
at the start of each step and the values used are recorded in that step's metrics row.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from ..algo.advantages import compute_advantages, outcome_gated_rewards, zero_std_fraction, zero_std_mask
from ..algo.difficulty import DifficultyTargeting
from ..algo.losses import LossSpec, StepTotals, adaptive_beta, policy_loss
from ..data.rewards import RewardFunc, RewardResult, RewardState, compute_rewards, reward_name
from ..data.tasks import check_no_overlap
from ..engine.device import (
    compile_monitor,
    data_parallel_size,
    graph_input,
    host_syncs_are_cheap,
    is_xla,
    manual_seed,
    mark_step,
    memory_stats,
    shard_batch,
)
from ..engine.distributed import broadcast, check_whole_groups, gather
from ..engine.logprobs import plan_products
from ..engine.models import ReferencePolicy, is_lora
from ..engine.sampler import Sampler, SamplerSettings
from ..engine.sampling import (
    Rollout,
    concat_rollouts,
    prompt_tokens,
)
from ..engine.sharding import is_sharded
from ..validation import check_prompt_dataset
from .config import GRPOConfig
from .controls import LIVE_SETTINGS, TOKEN_VARIABLE, Controls, controls_path
from .loop import TrainingLoop
from .metrics import HIST_EDGES, histogram, to_host


class Scored(NamedTuple):
    """`GRPOTrainer.score`'s result: per completion, in the rollout's row order."""

    rewards: RewardResult
    """Every reward function's scores and their weighted total."""
    texts: list[str]
    """The completions decoded."""
    prompts: list
    """Each completion's prompt."""
    lengths: torch.Tensor
    """(B,) completion lengths in tokens."""


def _not_held_out(stream: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """A prompt stream's rows, each refused if it is a held-out question of a data task (`tasks.check_no_overlap`)."""
    for i, row in enumerate(stream):
        if isinstance(row, dict) and "prompt" in row:
            check_no_overlap([row["prompt"]], where="the GRPO prompt stream", start=i)
        yield row


def _cycle(dataset: Any, seed: int) -> Iterator[dict[str, Any]]:
    """Endless shuffled pass over a Dataset or list of rows."""
    gen = torch.Generator().manual_seed(seed)
    while True:
        for i in torch.randperm(len(dataset), generator=gen).tolist():
            yield dataset[i]


class GRPOTrainer(TrainingLoop):
    """GRPO on any causal LM the kit loads (tiny Gemma, Gemma with LoRA), on cpu / cuda / xla. The optimizer,
    checkpoints, skip guard and loop are `loop.TrainingLoop`'s; this class is the algorithm and its orchestration."""

    kind = "grpo"
    metrics_file = "metrics.jsonl"
    resume_settings = ("prompts_per_step", "group_size", "seed")
    """Settings a resumed run must share with its checkpoint (else it would replay other prompts)."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        reward_funcs: Sequence[RewardFunc],
        prompts: Iterable[dict[str, Any]] | Any,
        config: GRPOConfig | None = None,
        controls: Controls | None = None,
        resume_metrics: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        cfg = config or GRPOConfig()
        self.reward_funcs = list(reward_funcs)
        if not self.reward_funcs:
            raise ValueError("GRPOTrainer needs at least one reward function")
        self.reward_names = [reward_name(f) for f in self.reward_funcs]
        cfg.check_run(self.reward_names, lora=is_lora(model),
                      fixed_shapes=not host_syncs_are_cheap(next(model.parameters()).device))
        sized = hasattr(prompts, "__len__") and hasattr(prompts, "__getitem__")
        if sized:  # a stream (an iterator) is checked batch by batch instead
            check_prompt_dataset(prompts, dict(zip(self.reward_names, self.reward_funcs, strict=True)),
                                 prompt_tokens=lambda p: prompt_tokens(tokenizer, p),
                                 max_prompt_tokens=cfg.max_prompt_tokens)
            check_no_overlap((row["prompt"] for row in prompts), where="the GRPO prompts")
        self.prompts = _cycle(prompts, cfg.seed) if sized else _not_held_out(prompts)
        self.difficulty = DifficultyTargeting(cfg.difficulty_key, cfg.seed) if cfg.difficulty_targeting else None
        """With difficulty_targeting: the pass rates per level that decide which drawn prompts a step keeps."""
        self.controls = controls or Controls.from_config(cfg)
        """Rank 0's are the run's under torchrun: read there at each step and broadcast."""
        self._start_loop(model, cfg, resume_metrics=resume_metrics)
        check_whole_groups(cfg.prompts_per_step, self.world.batch_world, setting="GRPOConfig.prompts_per_step")
        needs_reference = cfg.beta > 0 or cfg.log_kl or cfg.target_kl is not None or cfg.ema_reference > 0
        self.reference = ReferencePolicy(model) if needs_reference else None
        self.products = plan_products(model, reuse_sampler_head=cfg.reuse_sampler_head, cpu_bf16=cfg.cpu_bf16,
                                      entropy_coef=cfg.entropy_coef,
                                      compares_logprobs=self.reference is not None or cfg.num_iterations > 1)
        """Whether the update reuses the sampler's LM-head moments, and the products' dtype
        (`logprobs.plan_products`)."""
        self.sampler = Sampler(model, tokenizer, SamplerSettings(
            max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
            prompt_bucket=cfg.prompt_bucket, max_prompt_tokens=cfg.max_prompt_tokens, compiled=cfg.compile_sampler,
            head_moments=self.products.reuse_sampler_head, product_dtype=self.products.rollout_product_dtype,
            padding_free=cfg.padding_free,
            share_prompt_forward=cfg.share_prompt_forward and cfg.micro_batch_size % cfg.group_size == 0,
        ), group_size=cfg.group_size, generator=self.generator,
            share=(self.world.batch_world.rank, self.world.batch_world.size))
        """Rollouts and their log-probs (`engine.sampler`): each prompt is prefilled once for its group; under
        torchrun each process samples its block of the prompts."""
        # each process's own torch RNG (the run's is `generator`); one SPMD program's hosts share theirs
        manual_seed(cfg.seed + self.world.batch_world.rank, self.device)
        self.prompts_drawn = 0
        """Prompts taken from the stream so far (a resumed run skips as many)."""
        self.init_from: str | None = None
        """The checkpoint the weights started from (recorded in saves, so a resumed run rebuilds the same reference)."""
        self.adaptive_beta: float | None = None

    # ---- 1. rollout ---------------------------------------------------------------------------------
    def rollout(self, rows: list[dict[str, Any]], controls: dict[str, Any]) -> Rollout:
        """G completions for each row's prompt, at the temperature and top-p the controls set now; under torchrun,
        of this process's block of the rows (`world.block`)."""
        return self.sampler.generate([r["prompt"] for r in rows], temperature=controls["temperature"],
                                     top_p=controls["top_p"])

    # ---- 2. reward ----------------------------------------------------------------------------------
    def score(self, rows: list[dict[str, Any]], roll: Rollout, controls: dict[str, Any]) -> Scored:
        """The rollout's completions decoded and rewarded (every reward function, weighted by today's controls)."""
        g = self.config.group_size
        texts, ids_list, lengths = roll.decoded(self.tokenizer)
        prompts = [r["prompt"] for r in rows for _ in range(g)]
        columns = {k: [r[k] for r in rows for _ in range(g)] for k in rows[0] if k not in ("prompt", "completion")}
        columns["completion_ids"] = ids_list
        weights = {**(self.config.reward_weights or {}), **controls["reward_weights"]}
        result = compute_rewards(self.reward_funcs, prompts, texts, columns, weights,
                                 on_error=self.config.reward_on_error, timeout=self.config.reward_timeout_seconds,
                                 state=RewardState(global_step=self.step, max_steps=self.config.steps))
        return Scored(result, texts, prompts, lengths)

    # ---- 3. advantage -------------------------------------------------------------------------------
    def advantages(self, rewards: torch.Tensor) -> torch.Tensor:
        cfg = self.config
        return compute_advantages(
            rewards,
            cfg.group_size,
            estimator=cfg.advantage,
            tau=cfg.advantage_tau,
            clip=cfg.advantage_clip,
            clip_high=cfg.advantage_clip_value,
            clip_low=cfg.advantage_clip_low,
            winsorize_quantile=cfg.winsorize_quantile,
        )

    def _advantage_rewards(self, result: RewardResult) -> torch.Tensor:
        """The rewards the advantages are computed from: the total, or with `gate_shaped_rewards` the total whose
        shaped terms count only where the outcome (`accuracy_reward`) varies within the group."""
        cfg = self.config
        if not cfg.gate_shaped_rewards:
            return result.total
        return outcome_gated_rewards(result.per_function, torch.tensor(result.weights),
                                     result.names.index(cfg.accuracy_reward), cfg.group_size)

    # ---- 4. update ----------------------------------------------------------------------------------
    def update(self, batch: GroupBatch, settings: StepSettings) -> dict[str, Any]:
        """μ passes of micro-batches over the rows the loss counts (`batch.counted`), normalised by them: log-probs,
        `policy_loss` under the step's `LossSpec`, backward, the clipped optimizer step. Rows whose terms are exactly
        0 (`_rows_with_signal`) skip the forward and backward; the normalisers keep them."""
        cfg = self.config
        spec = cfg.loss_spec(epsilon=settings.controls["epsilon"], beta=settings.beta_on_device)
        roll, adv, loss_mask, totals = self._rows_to_run(batch, spec)
        n_run = roll.completion_ids.shape[0]
        roll, adv, loss_mask, n_real = self._my_rows(roll, adv, loss_mask)
        adv = shard_batch(adv.to(self.device))
        # the last micro-batch is short when groups were left out of the update (its statistics weigh its rows)
        n_mine = roll.completion_ids.shape[0]
        micro = [slice(s, min(s + cfg.micro_batch_size, n_mine)) for s in range(0, n_mine, cfg.micro_batch_size)]
        products = self.products.update_product_dtype(self.model)  # bf16 on a CPU with native bf16 (`cpu_bf16`)

        def logprobs(model: torch.nn.Module, m: slice, *, sampled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
            return self.sampler.logprobs(roll, m, model=model, temperature=settings.on_device["temperature"],
                                         sampled=sampled, entropy_grad=spec.entropy_in_gradient, product_dtype=products)

        monitor = compile_monitor()
        shapes = {"batch": totals.sequences, "micro_batch": cfg.micro_batch_size,
                  "seq_len": roll.prompt_ids.shape[1] + roll.completion_ids.shape[1]}
        clock = _PhaseClock()
        with torch.no_grad(), monitor.phase("logprob", **shapes):
            old_logp, ref_logp = self._fixed_logprobs(logprobs, micro, with_reference=spec.kl_in_loss)
        clock.lap("logprob_seconds")
        self.model.train()
        sums: dict[str, torch.Tensor | float] = {}
        grad_norms, skipped = [], torch.zeros((), device=self.device)
        for iteration in range(cfg.num_iterations):
            # the first pass runs on the sampling weights: the sampler's head moments stand in for the head
            sampled = iteration == 0 and roll.head_mean is not None
            with monitor.phase("train", **shapes):
                self.optimizer.zero_grad(set_to_none=True)
                loss_total = torch.zeros((), device=self.device)
                for m in micro:
                    logp, entropy = logprobs(self.model, m, sampled=sampled)  # (b, N) each
                    old = old_logp[m] if old_logp is not None else logp.detach()
                    loss, stats = policy_loss(logp, old, adv[m], loss_mask[m], spec, entropy=entropy, totals=totals,
                                              ref_logp=ref_logp[m] if ref_logp is not None else None)
                    clock.lap("forward_seconds")
                    loss.backward()
                    clock.lap("backward_seconds")
                    loss_total = loss_total + loss.detach()
                    share = (min(m.stop, n_real) - min(m.start, n_real)) / n_run / cfg.num_iterations
                    for k, v in stats.items():
                        sums[k] = sums.get(k, 0.0) + v * share
                grad_norm, skipped_now = self._optimizer_step(loss_total)
                skipped = skipped + skipped_now
                mark_step(self.device)
                clock.lap("optimizer_seconds")
            grad_norms.append(grad_norm)
            sums["policy_loss"] = sums.get("policy_loss", 0.0) + loss_total / cfg.num_iterations
        sums = self._summed_over_processes(sums)
        sums["grad_norm"] = torch.stack(grad_norms).mean()
        sums["skipped_updates"] = skipped
        return {**sums, **clock.seconds, "trained_fraction": n_run / totals.sequences,
                "trained_groups": n_run // cfg.group_size}

    def _rows_to_run(self, batch: GroupBatch, spec: LossSpec) -> tuple[Rollout, torch.Tensor, torch.Tensor, StepTotals]:
        """The rows the update's forward and backward run (`_rows_with_signal`), as (rollout, (b,) advantages,
        (b, N') loss mask), and the totals of the rows the loss counts, which normalise it."""
        loss_mask = batch.roll.completion_mask.float()  # (B, N)
        if self.config.mask_truncated_completions:
            loss_mask = loss_mask * (~batch.roll.truncated).float().unsqueeze(1)
        counted = batch.counted
        kept = counted.nonzero().squeeze(1)
        tokens = loss_mask.sum() if bool(counted.all()) else loss_mask[kept.to(loss_mask.device)].sum()
        totals = StepTotals(int(counted.sum()), tokens)
        runs = self._rows_with_signal(batch.advantages, counted, spec)  # (B,) bool, a subset of `counted`
        if bool(runs.all()):
            return batch.roll, batch.advantages, loss_mask, totals
        rows = runs.nonzero().squeeze(1)
        roll = batch.roll.rows(rows).trimmed()
        loss_mask = loss_mask[rows.to(loss_mask.device)][:, : roll.completion_ids.shape[1]]
        return roll, batch.advantages[rows.to(batch.advantages.device)], loss_mask, totals

    def _my_rows(self, roll: Rollout, adv: torch.Tensor,
                 loss_mask: torch.Tensor) -> tuple[Rollout, torch.Tensor, torch.Tensor, int]:
        """This process's block of whole groups of the rows the update runs (all of them in one process), and how many
        of them are real. With sharded weights every process runs as many rows as the largest block (each forward
        gathers every layer from all of them, `engine.sharding`): a shorter block is topped up with copies of the
        first group that weigh nothing (advantage 0, loss mask 0)."""
        if self.world.batch_world.size == 1:
            return roll, adv, loss_mask, roll.completion_ids.shape[0]
        g, size = self.config.group_size, self.world.batch_world.size
        count = roll.completion_ids.shape[0] // g
        groups = self.world.batch_world.block(count)
        index = torch.arange(groups.start * g, groups.stop * g)
        real = index.numel()
        if is_sharded(self.model):
            index = torch.cat([index, torch.arange(g).repeat(-(-count // size) - real // g)])
        adv, loss_mask = adv[index.to(adv.device)], loss_mask[index.to(loss_mask.device)]
        if index.numel() > real:
            adv, loss_mask = adv.clone(), loss_mask.clone()
            adv[real:], loss_mask[real:] = 0, 0
        return roll.rows(index), adv, loss_mask, real

    def _summed_over_processes(self, sums: dict[str, torch.Tensor | float]) -> dict[str, torch.Tensor | float]:
        """The update's statistics and loss, each process's share (weighted by its rows over all rows) summed: the
        whole batch's. A process that ran no rows has none to add."""
        if self.world.batch_world.size == 1:
            return sums
        totals: dict[str, float] = {}
        for part in gather(to_host(sums), self.world.batch_world):
            for key, value in part.items():
                if value is not None:
                    totals[key] = totals.get(key, 0.0) + value
        return totals

    def _rows_with_signal(self, adv: torch.Tensor, counted: torch.Tensor, spec: LossSpec) -> torch.Tensor:
        """(B,) bool: the counted rows the update runs. Where `skip_zero_advantage_groups` applies (cpu/cuda, a loss
        whose zero-advantage rows contribute exactly 0: `LossSpec.rows_with_zero_terms_can_be_left_out`, and no KL to
        measure) a counted group whose A = 0 throughout is left out; at least one counted group is kept, so every
        trainable weight gets its (zero) gradient and the optimizer steps as it would. Elsewhere `counted`."""
        cfg, g = self.config, self.config.group_size
        needs_reference = self.reference is not None and cfg.log_kl
        if not (cfg.skip_zero_advantage_groups and host_syncs_are_cheap(self.device)
                and spec.rows_with_zero_terms_can_be_left_out and not needs_reference):
            return counted
        counted_groups = counted.view(-1, g)[:, 0]  # (P',) groups count whole
        live = (adv.detach().view(-1, g) != 0).any(dim=1).cpu() & counted_groups
        if not bool(live.any()):
            live[int(counted_groups.nonzero()[0])] = True
        return live.repeat_interleave(g)

    def _fixed_logprobs(self, logprobs: Callable[[torch.nn.Module, slice], tuple[torch.Tensor, torch.Tensor]],
                        micro: list[slice], *, with_reference: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Log-probs that stay fixed through the step's updates (no grad): the policy's before the first update
        (μ > 1 only: at μ = 1 old = current, detached) and the reference's (β > 0, or `log_kl`)."""
        cfg = self.config
        old_logp = ref_logp = None
        if cfg.num_iterations > 1:
            self.model.eval()
            old_logp = torch.cat([logprobs(self.model, m)[0] for m in micro])
        if self.reference is not None and (with_reference or cfg.log_kl):
            with self.reference.model() as ref:
                ref.eval()
                ref_logp = torch.cat([logprobs(ref, m)[0] for m in micro])
        if old_logp is not None or ref_logp is not None:
            mark_step(self.device)
        return old_logp, ref_logp

    # ---- one step: the stages ------------------------------------------------------------------------
    def train_step(self) -> dict[str, Any]:
        """One GRPO step (its stages); refused while another loop is training this trainer."""
        with self.exclusive():
            return self._train_step()

    def _train_step(self) -> dict[str, Any]:
        start, compiles_before = time.perf_counter(), compile_monitor().total()
        settings = self._step_settings()
        batch = self.sample_groups(settings)  # 1–3: rollouts, rewards, advantages
        stats = self.update(batch, settings)  # 4
        self.step += 1
        row = self.metrics_row(batch, stats, settings, start=start)  # 5
        self._after_update(row, settings)
        row["step_seconds"] = elapsed = time.perf_counter() - start
        row.update({f"memory_{k}": v for k, v in memory_stats(self.device).items()})
        if is_xla(self.device):
            row.update(self._compile_metrics(compile_monitor().total() - compiles_before))
        self.logger.log(row)
        self._count_step_seconds(elapsed)
        self._count_skipped(row)
        self._save_if_due()  # 6
        return row

    def _step_settings(self) -> StepSettings:
        """The live controls read once at the step's start, the warmed-up learning rate applied, β chosen."""
        cfg = self.config
        controls = broadcast(self.controls.snapshot(), self.world)  # rank 0's, on every process
        learning_rate = controls["learning_rate"] * (
            min(1.0, (self.step + 1) / cfg.warmup_steps) if cfg.warmup_steps > 0 else 1.0)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        adaptive = cfg.target_kl is not None and self.adaptive_beta is not None
        beta = self.adaptive_beta if adaptive else controls["beta"]
        return StepSettings(
            controls=controls, learning_rate=learning_rate, beta=beta,
            on_device={**controls, "temperature": graph_input(controls["temperature"], self.device)},
            beta_on_device=graph_input(beta, self.device))

    def metrics_row(self, batch: GroupBatch, stats: dict[str, torch.Tensor], settings: StepSettings, *,
                    start: float) -> dict[str, Any]:
        """The step's metrics row: the update's device values moved to the host in one transfer, then the rewards,
        advantages, lengths and the settings as applied."""
        controls, result = settings.controls, batch.rewards
        row = {**to_host({k: v for k, v in stats.items() if k != "trained_groups"}),
               "trained_groups": stats["trained_groups"]}  # a count, kept an int
        row.update(self._reward_metrics(result, batch.advantage_rewards, batch.advantages, batch.lengths, batch.roll))
        row.update({f"logged/{name}": sum(values) / len(values)  # the rewards' log_metric, over the step's calls
                    for name, values in result.logged.items()})
        row["rollouts"] = batch.rollouts
        if self.difficulty is not None:
            row["level_pass_rates"] = self.difficulty.pass_rates()
        row.update({name: controls[name] for name in LIVE_SETTINGS})  # a column per live setting; then two as applied
        row.update(
            step=self.step, learning_rate=settings.learning_rate, beta=settings.beta, processes=self.world.size,
            controls_version=controls["version"], reward_weights=dict(zip(result.names, result.weights, strict=True)),
            rollout_seconds=batch.rollout_seconds, reward_seconds=batch.reward_seconds,
            tokens_per_s=float(batch.lengths.sum()) / max(batch.rollout_seconds, 1e-9),
            completions=self._logged_completions(result, batch.advantages, batch.prompts, batch.texts),
        )
        return row

    def _after_update(self, row: dict[str, Any], settings: StepSettings) -> None:
        """What the step's numbers move: the adaptive β (from the step's KL), the EMA reference policy."""
        cfg = self.config
        if cfg.target_kl is not None and row.get("kl") is not None:
            self.adaptive_beta = adaptive_beta(settings.beta, row["kl"], cfg.target_kl)
        if cfg.ema_reference > 0 and self.reference is not None:
            self.reference.ema_update(cfg.ema_reference)

    def _save_if_due(self) -> None:
        requested = self.controls.consume_save_request()
        if self.checkpoint_path is not None and self._save_due(requested=requested):
            self.save(self.checkpoint_path)
        elif requested:
            warnings.warn("save requested, but GRPOConfig.output_dir is None: nothing was saved", stacklevel=2)

    def sample_groups(self, settings: StepSettings) -> GroupBatch:
        """Stages 1–3: `prompts_per_step` prompts sampled, scored and given advantages. With dynamic sampling
        (`dynamic_sampling_rollouts` > 1) more rollouts of `prompts_per_step` new prompts follow while fewer than
        `prompts_per_step` groups have rewards that differ, up to that many rollouts; the loss then counts the first
        `prompts_per_step` such groups (at least one group: the first, if none differs)."""
        cfg, g = self.config, self.config.group_size
        rolls, results, texts, prompts, lengths = [], [], [], [], []
        rollout_seconds = reward_seconds = 0.0
        while True:
            t0 = time.perf_counter()
            rows = [self._next_prompt() for _ in range(cfg.prompts_per_step)]
            self.prompts_drawn += len(rows)
            roll = self.rollout(rows, settings.on_device)  # 1
            t1 = time.perf_counter()
            roll, scored = self._gathered(roll, self.score(rows[self.world.batch_world.block(len(rows))], roll,
                                                           settings.controls))  # 2
            rolls.append(roll)
            results.append(scored.rewards)
            if self.difficulty is not None:
                outcomes = scored.rewards.per_function[scored.rewards.names.index(cfg.accuracy_reward)].tolist()
                self.difficulty.record([self.difficulty.level(r) for r in rows for _ in range(g)], outcomes)
            texts, prompts, lengths = texts + scored.texts, prompts + scored.prompts, lengths + [scored.lengths]
            rollout_seconds, reward_seconds = rollout_seconds + t1 - t0, reward_seconds + time.perf_counter() - t1
            result = _joined_results(results)
            rewards = self._advantage_rewards(result)
            if (
                len(rolls) >= cfg.dynamic_sampling_rollouts
                or int((~zero_std_mask(rewards, g)).sum()) // g >= cfg.prompts_per_step
            ):
                break
        counted = torch.ones(len(rewards), dtype=torch.bool)
        if cfg.dynamic_sampling_rollouts > 1:
            varied_groups = (~zero_std_mask(rewards, g)).view(-1, g)[:, 0].nonzero().squeeze(1)[: cfg.prompts_per_step]
            groups = varied_groups if varied_groups.numel() else torch.zeros(1, dtype=torch.long)
            counted = torch.zeros(len(rewards) // g, dtype=torch.bool).index_fill(0, groups, True).repeat_interleave(g)
        return GroupBatch(roll=concat_rollouts(rolls, self.tokenizer.pad_token_id), rewards=result, texts=texts,
                          prompts=prompts, lengths=torch.cat(lengths), advantage_rewards=rewards,
                          advantages=self.advantages(rewards), counted=counted, rollouts=len(rolls),  # 3
                          rollout_seconds=rollout_seconds, reward_seconds=reward_seconds)

    def _gathered(self, roll: Rollout, scored: Scored) -> tuple[Rollout, Scored]:
        """Every process's block of a rollout and its scores, joined in rank order: the whole batch, as one process
        would have sampled it (one process: as given)."""
        if self.world.batch_world.size == 1:
            return roll, scored
        parts = gather((roll.to(torch.device("cpu")), scored), self.world.batch_world)
        joined = concat_rollouts([r for r, _ in parts], self.tokenizer.pad_token_id).to(self.device)
        return joined, Scored(rewards=_joined_results([s.rewards for _, s in parts]),
                              texts=[t for _, s in parts for t in s.texts],
                              prompts=[p for _, s in parts for p in s.prompts],
                              lengths=torch.cat([s.lengths for _, s in parts]))

    def _next_prompt(self) -> dict[str, Any]:
        """The next prompt row: the stream's next, or with difficulty targeting the next one it keeps."""
        return next(self.prompts) if self.difficulty is None else self.difficulty.next_prompt(self.prompts)

    def _logged_completions(
        self, result: Any, adv: torch.Tensor, prompts: list, texts: list[str]
    ) -> list[dict[str, Any]]:
        """The first `log_completions` completions with their rewards and advantages, for the browser."""
        extra = {column: values for column, values in result.extra.items() if len(values) == len(texts)}
        return [
            {"prompt": p[-1]["content"] if isinstance(p, list) else p, "completion": t,
             "rewards": {nm: _num(result.per_function[j, i]) for j, nm in enumerate(result.names)},
             "reward": float(result.total[i]), "advantage": float(adv[i]),
             **({"extra": {column: values[i] for column, values in extra.items()}} if extra else {})}
            for i, (p, t) in enumerate(zip(prompts, texts, strict=True)) if i < self.config.log_completions
        ]

    def _compile_metrics(self, compiles: int) -> dict[str, Any]:
        """XLA: this step's graph compilations (recompiles once warm-up is over) and the monitor's phase counts."""
        monitor, warmup = compile_monitor(), self.config.compile_warmup_steps
        metrics = {**monitor.metrics(), "xla_compiles_step": compiles, "xla_devices": data_parallel_size(),
                   "xla_recompiles_step": compiles if self.step > warmup else 0}
        if self.step >= warmup:
            monitor.end_warmup()
        return metrics

    def _reward_metrics(self, result: Any, rewards: torch.Tensor, adv: torch.Tensor, lengths: torch.Tensor,
                        roll: Rollout) -> dict[str, Any]:
        g = self.config.group_size
        total = result.total
        out: dict[str, Any] = {
            "reward_mean": float(total.mean()), "reward_std": float(total.std()),
            # of the rewards the advantages come from: with gated shaped rewards an all-wrong group has no signal
            "zero_std_fraction": float(zero_std_fraction(rewards, g)),
            "advantage_mean": float(adv.mean()), "advantage_std": float(adv.std()),
            "advantage_min": float(adv.min()), "advantage_max": float(adv.max()),
            "advantage_hist": histogram(adv), "advantage_hist_edges": HIST_EDGES.tolist(),
            "completion_length_mean": float(lengths.float().mean()), "completion_length_max": int(lengths.max()),
            "truncated_fraction": float(roll.truncated.float().mean().cpu()),
            "reward_failures": sum(result.failures.values()),
        }
        for j, name in enumerate(result.names):
            col = result.per_function[j]
            valid = col[~torch.isnan(col)]
            out[f"rewards/{name}/mean"] = float(valid.mean()) if len(valid) else None
            out[f"rewards/{name}/std"] = float(valid.std()) if len(valid) > 1 else 0.0
        accuracy_reward = self.config.accuracy_reward
        if accuracy_reward in result.names:
            col = result.per_function[result.names.index(accuracy_reward)]
            out["accuracy"] = float((col == 1.0).float().mean())
        return out

    def train(
        self,
        steps: int | None = None,
        progress: bool = True,
        callback: Callable[[GRPOTrainer, dict[str, Any]], None] | None = None,
        poll: Callable[[], None] | None = None,
    ) -> list[dict[str, Any]]:
        """Run until `steps` (default config.steps) total steps, a stop request, or max_seconds.

        `callback(trainer, row)` runs after each step; `poll()` runs before each step and while paused (the
        dashboard's foreground loop processes widget events there). The main process of a run launched with a
        controls token (`controls.TOKEN_VARIABLE`) also follows its output directory's controls file there, so a
        dashboard in another process steers it. Refused while another loop trains."""
        follow = os.environ.get(TOKEN_VARIABLE) and self.config.output_dir and self.world.is_main
        watch = [lambda: self.controls.follow_file(controls_path(self.config.output_dir))] if follow else []
        idle = [*watch, poll] if poll is not None else watch

        def between() -> None:
            for call in idle:
                call()

        def before_step() -> bool:
            between()
            self.controls.wait_while_paused(idle=between if idle else None)
            return not self.controls.snapshot()["stop_requested"]

        return self._run(self.config.steps if steps is None else steps, progress=progress, before_step=before_step,
                         after_step=None if callback is None else lambda row: callback(self, row))

    def _progress_postfix(self, row: dict[str, Any]) -> dict[str, str]:
        return {"reward": f"{row['reward_mean']:.3f}", "acc": f"{row.get('accuracy', float('nan')):.2f}"}

    def save(self, path: str | Path) -> Path:
        """Weights (or adapter), optimizer, RNG states, step, the settings and the starting checkpoint."""
        extra = {"adaptive_beta": self.adaptive_beta, "init_from": self.init_from, "prompts_drawn": self.prompts_drawn,
                 "config": dataclasses.asdict(self.config)}
        if self.difficulty is not None:
            extra["difficulty"] = self.difficulty.state()
        return self._save(path, extra, modules=self._unrecoverable_reference())

    def _unrecoverable_reference(self) -> dict[str, torch.nn.Module]:
        """The reference policy when it cannot be rebuilt from the starting weights (an EMA reference has moved)."""
        moved = self.config.ema_reference > 0 and self.reference is not None and self.reference.frozen is not None
        return {"reference": self.reference.frozen} if moved else {}

    def load(self, path: str | Path) -> None:
        """Resume: weights, optimizer, RNG and step; metrics rows after that step are dropped. Refuses a checkpoint
        whose prompt order settings differ (the resumed run would replay different prompts)."""
        state = self._restore(path, modules=self._unrecoverable_reference())
        self.init_from = state.get("init_from")
        self.adaptive_beta = state.get("adaptive_beta")
        # prompt order continues from the same seed: skip the prompts already used (dynamic sampling draws more)
        self.prompts_drawn = state.get("prompts_drawn", self.step * self.config.prompts_per_step)
        if self.difficulty is not None and "difficulty" in state:  # its filter drew more rows than it kept
            self.difficulty.restore(state["difficulty"], self.prompts)
            return
        for _ in itertools.repeat(None, self.prompts_drawn):
            next(self.prompts)


@dataclasses.dataclass
class StepSettings:
    """The settings one step runs under, read once at its start (`GRPOTrainer._step_settings`)."""

    controls: dict[str, Any]
    """The live controls' snapshot, host values: what the metrics row records."""
    on_device: dict[str, Any]
    """The same, the temperature as a graph input on XLA (`device.graph_input`): what rollouts and log-probs use."""
    learning_rate: float
    """The controls' learning rate times the warm-up factor, as the optimizer applies it."""
    beta: float
    """β as the row records it: the control's, or the adaptive β where `target_kl` is set."""
    beta_on_device: float | torch.Tensor
    """β as the loss takes it (a graph input on XLA)."""


@dataclasses.dataclass
class GroupBatch:
    """What stages 1–3 of a step made (`GRPOTrainer.sample_groups`): every rollout's rows joined. B = P'·G rows,
    P' the prompts sampled (more than `prompts_per_step` with dynamic sampling), G the group size; a group's rows
    are together."""

    roll: Rollout
    """(B, P) prompts, (B, N) completions."""
    rewards: RewardResult
    """(K, B) each reward function's scores, (B,) their weighted total."""
    texts: list[str]
    """B decoded completions."""
    prompts: list
    """B prompts, each repeated for its group."""
    lengths: torch.Tensor
    """(B,) completion lengths in tokens."""
    advantage_rewards: torch.Tensor
    """(B,) the rewards the advantages come from (`GRPOTrainer._advantage_rewards`)."""
    advantages: torch.Tensor
    """(B,) A, one per completion."""
    counted: torch.Tensor
    """(B,) bool, on the host: the rows the loss counts (dynamic sampling's groups; every row otherwise)."""
    rollouts: int
    """Rollouts the step sampled (1 without dynamic sampling)."""
    rollout_seconds: float
    reward_seconds: float


def _joined_results(results: list[RewardResult]) -> RewardResult:
    """Several batches' reward results as one, rows in order."""
    if len(results) == 1:
        return results[0]
    failures: dict[str, int] = {}
    for r in results:
        for name, count in r.failures.items():
            failures[name] = failures.get(name, 0) + count
    logged: dict[str, list[float]] = {}
    extra: dict[str, list] = {}
    for r in results:
        for name, values in r.logged.items():
            logged.setdefault(name, []).extend(values)
        for column, values in r.extra.items():
            extra.setdefault(column, []).extend(values)
    return RewardResult(per_function=torch.cat([r.per_function for r in results], dim=1),
                        total=torch.cat([r.total for r in results]), names=results[0].names, weights=results[0].weights,
                        failures=failures, logged=logged, extra=extra)


class _PhaseClock:
    """Host seconds per phase of the update (`lap(name)` adds the time since the previous lap to `name`). On cpu
    the work runs as it is issued; on cuda and XLA it is queued, so device time lands in the phase that waits
    for it (on XLA: `optimizer_seconds`, which holds the step's `mark_step`)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._last
        self._last = now


def _num(x: torch.Tensor) -> float | None:
    v = float(x)
    return None if math.isnan(v) else v
