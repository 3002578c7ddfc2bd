import dataclasses
import itertools
import json

import pytest
import torch

from grpo_kit.data.rewards import (
    DEFAULT_REWARDS,
    DEFAULT_WEIGHTS,
    arithmetic_steps_reward,
    compute_rewards,
    correctness_reward,
    strict_format_reward,
)
from grpo_kit.eval.evaluation import evaluate
from grpo_kit.train.checkpoint import load_checkpoint, save_checkpoint
from grpo_kit.train.config import GRPOConfig, SFTConfig
from grpo_kit.train.controls import Controls
from grpo_kit.train.grpo import GRPOTrainer
from grpo_kit.train.metrics import read_jsonl
from grpo_kit.train.sft import SFTTrainer, collate, encode_demonstrations
from grpo_kit.validation import ConfigError

SMALL = dict(prompts_per_step=4, group_size=4, max_new_tokens=24, micro_batch_size=8, warmup_steps=1)


def test_sft_collate_masks_only_the_completion(tiny, task):
    _, tok = tiny
    rows = task.demonstrations().select(range(3))
    examples = encode_demonstrations(tok, rows, max_length=128)
    batch = collate(examples, tok.pad_token_id, 32)
    assert batch["input_ids"].shape[1] % 32 == 0
    for row, (ids, plen) in enumerate(examples):
        target = batch["target_mask"][row]
        assert int(target.sum()) == len(ids) - plen  # completion tokens + <end_of_turn>
        predicted = batch["input_ids"][row, 1:][target.bool()]
        assert tok.decode(predicted) == rows[row]["completion"] + "<end_of_turn>"
    with pytest.raises(ValueError, match="row 0: .* exceed max_length=10"):
        encode_demonstrations(tok, rows, max_length=10)


def test_sft_learns_the_format(tiny, task, tmp_path):
    model, tok = tiny
    trainer = SFTTrainer(model, tok, task.demonstrations(),
                         SFTConfig(steps=60, batch_size=16, output_dir=str(tmp_path)))
    rows = trainer.train(progress=False)
    assert rows[-1]["loss"] < 0.5 * rows[0]["loss"]
    result = evaluate(model, tok, task.test_set(), max_new_tokens=32)
    assert result["format_rate"] > 0.8
    assert (tmp_path / "sft_metrics.jsonl").exists()


def test_grpo_step_metrics_and_controls(sft_model, task, tmp_path):
    model, tok = sft_model
    controls = Controls.from_config(GRPOConfig(**SMALL))
    cfg = GRPOConfig(**SMALL, beta=0.04, output_dir=str(tmp_path), reward_weights=DEFAULT_WEIGHTS)
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(), cfg, controls=controls)
    row = trainer.train_step()
    for key in ("reward_mean", "reward_std", "rewards/correctness_reward/mean", "rewards/strict_format_reward/std",
                "accuracy", "advantage_mean", "advantage_hist", "kl", "policy_loss", "clip_low", "clip_high",
                "entropy", "completion_length_mean", "completion_length_max", "truncated_fraction",
                "zero_std_fraction", "grad_norm", "learning_rate", "beta", "step_seconds", "tokens_per_s",
                "completions"):
        assert key in row, key
    assert sum(row["advantage_hist"]) == 16
    phases = ("rollout_seconds", "reward_seconds", "logprob_seconds", "forward_seconds", "backward_seconds",
              "optimizer_seconds")
    assert all(row[k] > 0 for k in phases), {k: row.get(k) for k in phases}
    assert sum(row[k] for k in phases) <= row["step_seconds"]  # disjoint parts of the step
    assert abs(row["policy_loss"]) < 1e-4 + abs(row["kl"]) * 0.04 + 1e-3  # ρ = 1 at μ = 1: loss ≈ β·KL
    controls.update(beta=0.123, learning_rate=5e-4, reward_weights={"strict_format_reward": 0.7})
    row2 = trainer.train_step()
    assert row2["beta"] == 0.123 and row2["learning_rate"] == 5e-4 and row2["controls_version"] == controls.version
    assert row2["reward_weights"]["strict_format_reward"] == 0.7
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_grpo_raises_reward_end_to_end(sft_model, task):
    """A short SFT + GRPO run on the tiny Gemma: mean reward over the last steps beats the first steps.

    Prompts cycle over a fixed pool of 16, so the improvement is measurable in a few steps."""
    model, tok = sft_model
    pool = list(itertools.islice(task.prompt_stream(), 16))
    rewards = (correctness_reward, strict_format_reward, arithmetic_steps_reward)
    weights = {"correctness_reward": 1.0, "strict_format_reward": 0.1, "arithmetic_steps_reward": 0.5}
    cfg = GRPOConfig(prompts_per_step=16, group_size=8, max_new_tokens=32, micro_batch_size=64, learning_rate=1e-4,
                     warmup_steps=3, output_dir=None, reward_weights=weights, log_kl=False, seed=0)
    trainer = GRPOTrainer(model, tok, rewards, pool, cfg)
    rows = trainer.train(steps=20, progress=False)
    first = sum(r["reward_mean"] for r in rows[:4]) / 4
    last = sum(r["reward_mean"] for r in rows[-4:]) / 4
    assert last > first + 0.05, (first, last)


@pytest.mark.parametrize("overrides", [
    dict(num_iterations=2, loss_type="dapo", epsilon_high=0.28),
    dict(loss_type="cispo", epsilon_high=4.0, importance_sampling_level="sequence"),
    dict(loss_type="dr_grpo", advantage="centered", entropy_coef=0.01, mask_truncated_completions=True),
    dict(advantage="mad", advantage_clip="tanh", winsorize_quantile=0.1, target_kl=0.01, beta=0.01, ema_reference=0.1),
])
def test_grpo_variants_run_and_stay_finite(sft_model, task, overrides):
    model, tok = sft_model
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(),
                          GRPOConfig(**SMALL, output_dir=None, **overrides))
    rows = trainer.train(steps=2, progress=False)
    assert all(torch.isfinite(torch.tensor(r["policy_loss"])) for r in rows)
    if overrides.get("num_iterations", 1) > 1:
        # the second pass sees the policy the first one moved: ratios leave 1
        assert rows[-1]["ratio_mean"] != pytest.approx(1.0, abs=1e-6)
        assert 0.0 <= rows[-1]["clip_low"] + rows[-1]["clip_high"] <= 1.0
    if "target_kl" in overrides:
        assert trainer.adaptive_beta is not None and trainer.adaptive_beta != overrides["beta"]


def test_nan_guard_skips_the_update(sft_model, task):
    model, tok = sft_model
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(), GRPOConfig(**SMALL, output_dir=None))
    before = [p.detach().clone() for p in trainer.params]
    hook = trainer.params[0].register_hook(lambda g: g * float("nan"))
    row = trainer.train_step()
    hook.remove()
    assert row["skipped_updates"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, trainer.params, strict=True))


def test_reward_failure_stops_the_run_with_names(sft_model, task):
    model, tok = sft_model

    def flaky_reward(prompts, completions, **_):
        raise KeyError("boom")

    trainer = GRPOTrainer(model, tok, [correctness_reward, flaky_reward], task.prompt_stream(),
                          GRPOConfig(**SMALL, output_dir=None))
    with pytest.raises(Exception, match="'flaky_reward' raised KeyError"):
        trainer.train_step()
    lenient = GRPOTrainer(model, tok, [correctness_reward, flaky_reward], task.prompt_stream(),
                          GRPOConfig(**SMALL, output_dir=None, reward_on_error="zero"))
    assert lenient.train_step()["reward_failures"] == 16
    with pytest.raises(ValueError, match="unknown rewards"):
        GRPOTrainer(model, tok, [correctness_reward], task.prompt_stream(),
                    GRPOConfig(**SMALL, reward_weights={"typo": 1}))


def test_checkpoint_resume_reproduces_the_run(sft_model, task, tmp_path):
    model, tok = sft_model
    start = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = GRPOConfig(**SMALL, output_dir=str(tmp_path / "a"))
    a = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(), cfg)
    a.train(steps=2, progress=False)
    a.save(tmp_path / "ckpt")
    rows_a = a.train(steps=4, progress=False)
    final_a = {k: v.clone() for k, v in model.state_dict().items()}

    model.load_state_dict(start)
    b = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(),
                    dataclasses.replace(cfg, output_dir=str(tmp_path / "a")), resume_metrics=True)
    b.load(tmp_path / "ckpt")
    assert b.step == 2 and [r["step"] for r in b.logger.rows] == [1, 2]
    rows_b = b.train(steps=4, progress=False)
    assert [r["reward_mean"] for r in rows_b[2:]] == [r["reward_mean"] for r in rows_a[2:]]
    for k in final_a:
        assert torch.allclose(final_a[k], model.state_dict()[k], atol=1e-6), k
    state = json.loads((tmp_path / "ckpt" / "state.json").read_text())
    assert state["step"] == 2 and state["kind"] == "grpo"


def test_a_lora_checkpoint_holds_only_the_adapter_and_a_second_save_replaces_the_first(cpu, tmp_path):
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.engine.models import load_model

    model, _ = load_model(ModelConfig(lora=True, lora_r=4), cpu)
    save_checkpoint(tmp_path / "c", model, None, 1)
    from safetensors.torch import load_file

    keys = load_file(str(tmp_path / "c" / "weights.safetensors")).keys()
    assert keys and all("lora" in k for k in keys)
    save_checkpoint(tmp_path / "c", model, None, 2)  # overwrite in place
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    assert load_checkpoint(tmp_path / "c", model)["step"] == 2
    with pytest.raises(FileNotFoundError, match="not a grpo_kit checkpoint"):
        load_checkpoint(tmp_path, model)


def test_sft_skips_a_non_finite_step_and_stops_after_several_in_a_row(tiny, task):
    from grpo_kit.validation import TrainingDiverged

    model, tok = tiny
    trainer = SFTTrainer(model, tok, task.demonstrations(),
                         SFTConfig(steps=20, batch_size=4, output_dir=None, max_skipped_steps=3))
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    hook = params[0].register_hook(lambda g: g * float("nan"))
    row = trainer.train_step()
    assert row["skipped_updates"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, params, strict=True)), "a NaN step changed the weights"
    trainer.train_step()
    with pytest.raises(TrainingDiverged,
                       match=r"3 steps in a row had a non-finite loss or gradient .* SFTConfig.max_skipped_steps"):
        trainer.train_step()
    hook.remove()
    assert trainer.train_step()["skipped_updates"] == 0.0  # a finite step trains again


def test_grpo_stops_after_several_skipped_steps_in_a_row(sft_model, task):
    from grpo_kit.validation import TrainingDiverged

    model, tok = sft_model
    trainer = GRPOTrainer(model, tok, DEFAULT_REWARDS, task.prompt_stream(),
                          GRPOConfig(**SMALL, output_dir=None, max_skipped_steps=2))
    hook = trainer.params[0].register_hook(lambda g: g * float("nan"))
    try:
        assert trainer.train_step()["skipped_updates"] == 1.0
        with pytest.raises(TrainingDiverged, match="2 steps in a row"):
            trainer.train_step()
    finally:
        hook.remove()


def test_numpy_and_tensor_scalar_rewards_are_accepted():
    import numpy as np

    def numpy_reward(prompts, completions, **_):
        return [np.float32(0.5), np.float64(1.0)]

    def tensor_reward(prompts, completions, **_):
        return [torch.tensor(2.0), torch.tensor([3.0])]

    result = compute_rewards([numpy_reward, tensor_reward], ["p", "p"], ["a", "b"])
    assert result.total.tolist() == [2.5, 4.0]
    with pytest.raises(Exception, match="returned"):
        compute_rewards([lambda prompts, completions, **_: [torch.ones(2), 1.0]], ["p", "p"], ["a", "b"])


def test_the_hub_token_stays_out_of_reprs_and_saved_settings():
    from grpo_kit.engine.model_config import ModelConfig
    from grpo_kit.train.config import RunConfig

    cfg = RunConfig(model=ModelConfig(hf_token="hf_SECRET123"))
    assert "hf_SECRET123" not in repr(cfg) and "hf_SECRET123" not in str(cfg.model)


def test_pass_at_k_counts_a_problem_solved_by_any_of_its_k_samples(monkeypatch):
    import grpo_kit.eval.evaluation as evaluation

    dataset = {"prompt": ["p0", "p1", "p2"], "answer": ["3", "4", "5"]}
    scripted = {"p0": ["<answer>9</answer>", "<answer>3</answer>"], "p1": ["<answer>1</answer>", "<answer>2</answer>"],
                "p2": ["<answer>5</answer>", "<answer>5</answer>"]}
    seen = {}

    def fake_generate(model, tokenizer, prompts, **kwargs):
        seen.update(kwargs, prompts=prompts)
        counts: dict[str, int] = {}
        out = []
        for p in prompts:
            out.append(scripted[p][counts.get(p, 0)])
            counts[p] = counts.get(p, 0) + 1
        return out

    monkeypatch.setattr(evaluation, "generate_completions", fake_generate)
    assert evaluation.pass_at_k(None, None, dataset, k=2, temperature=0.7) == pytest.approx(2 / 3)
    assert (seen["prompts"] == ["p0", "p0", "p1", "p1", "p2", "p2"] and seen["greedy"] is False
            and seen["temperature"] == 0.7)
    with pytest.raises(ValueError, match="k=0"):
        evaluation.pass_at_k(None, None, dataset, k=0)


def test_sft_resized_mid_run_follows_the_schedule_of_the_new_length(tiny, task):
    model, tok = tiny
    cfg = SFTConfig(steps=40, batch_size=4, warmup_steps=2, output_dir=None)
    resized = SFTTrainer(model, tok, task.demonstrations(), cfg)
    resized.train(progress=False, steps=3)
    resized.set_steps(10)
    planned = SFTTrainer(model, tok, task.demonstrations(), dataclasses.replace(cfg, steps=10))
    for _ in range(3):
        planned.optimizer.step()
        planned.scheduler.step()
    assert resized.scheduler.get_last_lr() == pytest.approx(planned.scheduler.get_last_lr())
    resized.train(progress=False)
    assert resized.step == 10 and len(resized.step_seconds) == 10
    with pytest.raises(ValueError, match="cannot shorten the run to 5 steps, 10 are done"):
        resized.set_steps(5)


@pytest.mark.parametrize("overrides", [
    dict(loss_type="grpo"), dict(loss_type="dapo", num_iterations=2), dict(loss_type="dr_grpo"), dict(loss_type="bnpo"),
])
def test_groups_with_zero_advantage_are_left_out_of_the_update_with_the_same_result(sft_model, task, overrides):
    """One step with `skip_zero_advantage_groups` on and off from the same weights: a reward that is constant on
    the first prompt's group leaves that group out of the update when on (`trained_fraction` 2/3), and the
    losses, gradient norms and weights after the step are the same. `bnpo` (micro-batch token mean) trains on all."""
    model, tok = sft_model
    start = {k: v.clone() for k, v in model.state_dict().items()}

    def first_prompt_constant(prompts, completions, completion_ids, **kw):  # noqa: ANN001, ANN003
        # The other groups' rewards count along the batch, so their spread never rests on what was sampled (the
        # warmed-up tiny model can sample one completion four times).
        return [1.0 if p == prompts[0] else float(row) for row, p in enumerate(prompts)]

    runs = []
    for skip in (True, False):
        model.load_state_dict(start)
        cfg = GRPOConfig(prompts_per_step=3, group_size=4, micro_batch_size=4, max_new_tokens=12, learning_rate=1e-3,
                         warmup_steps=0, log_kl=False, skip_zero_advantage_groups=skip, output_dir=None,
                         log_completions=0, **overrides)
        trainer = GRPOTrainer(model, tok, [first_prompt_constant], task.prompt_stream(seed=3), cfg)
        row = trainer.train_step()
        runs.append((row, [p.detach().clone() for p in trainer.params]))
    (row_on, params_on), (row_off, params_off) = runs
    assert row_on["zero_std_fraction"] == pytest.approx(1 / 3) and row_off["trained_fraction"] == 1.0
    assert row_on["trained_fraction"] == pytest.approx(1.0 if overrides["loss_type"] == "bnpo" else 2 / 3)
    assert row_on["trained_groups"] == (3 if overrides["loss_type"] == "bnpo" else 2) and row_off["trained_groups"] == 3
    assert row_on["grad_norm"] > 0
    for key in ("policy_loss", "grad_norm"):
        assert row_on[key] == pytest.approx(row_off[key], rel=1e-4, abs=1e-6), key
    for a, b in zip(params_on, params_off, strict=True):
        assert (a - b).norm() <= 1e-5 * b.norm()


@pytest.mark.parametrize("micro_batch_size", [4, 12])
def test_a_step_where_every_group_has_zero_advantage_still_steps_the_optimizer(sft_model, task, micro_batch_size):
    """All rewards equal: one group still runs (every weight gets its zero gradient), so Adam's moments and step
    count move exactly as when the whole batch runs. The step's statistics are means over the rows that ran, also
    when they fill only part of a micro-batch (12 rows a micro-batch, 4 ran): the first pass's ratio is exactly 1."""
    model, tok = sft_model
    start = {k: v.clone() for k, v in model.state_dict().items()}
    runs = []
    for skip in (True, False):
        model.load_state_dict(start)
        cfg = GRPOConfig(prompts_per_step=3, group_size=4, micro_batch_size=micro_batch_size, max_new_tokens=12,
                         warmup_steps=0, log_kl=False, skip_zero_advantage_groups=skip, output_dir=None,
                         log_completions=0)
        trainer = GRPOTrainer(model, tok, [lambda prompts, completions, **kw: [0.5] * len(completions)],
                              task.prompt_stream(seed=3), cfg)
        row = trainer.train_step()
        state = trainer.optimizer.state
        runs.append((row, [int(state[p]["step"]) for p in trainer.params]))
    (row_on, steps_on), (row_off, steps_off) = runs
    assert row_on["trained_fraction"] == pytest.approx(1 / 3) and row_off["trained_fraction"] == 1.0
    assert row_on["grad_norm"] == row_off["grad_norm"] == 0.0
    assert row_on["ratio_mean"] == pytest.approx(1.0) == row_off["ratio_mean"]
    assert row_on["clip_low"] == row_off["clip_low"] == 0.0
    assert steps_on == steps_off == [1] * len(steps_on)


def test_gated_shaped_rewards_give_all_wrong_groups_no_advantage(sft_model, task):
    """`gate_shaped_rewards`: with every answer wrong, a shaped reward that varies gives advantages only when the
    gate is off; the logged reward is the plain weighted sum either way. Without `accuracy_reward` among the rewards
    the trainer refuses the setting, naming it."""
    model, tok = sft_model

    def correctness_reward(prompts, completions, **kw):  # noqa: ANN001, ANN003
        return [0.0] * len(completions)

    def length_reward(prompts, completions, **kw):  # noqa: ANN001, ANN003
        return [len(c[0]["content"]) / 100 for c in completions]

    for gate in (False, True):
        cfg = GRPOConfig(**SMALL, output_dir=None, gate_shaped_rewards=gate)
        trainer = GRPOTrainer(model, tok, [correctness_reward, length_reward], task.prompt_stream(seed=1), cfg)
        row = trainer.train_step()
        assert row["reward_std"] > 0
        assert (row["advantage_std"] == 0) is gate
        assert (row["zero_std_fraction"] == 1.0) is gate  # no group has a signal once the shaped term is gated
    with pytest.raises(ConfigError, match="gate_shaped_rewards needs accuracy_reward"):
        GRPOTrainer(model, tok, [length_reward], task.prompt_stream(),
                    GRPOConfig(**SMALL, output_dir=None, gate_shaped_rewards=True))


def test_dynamic_sampling_refills_the_step_with_groups_whose_rewards_differ(sft_model, task, tmp_path):
    """`dynamic_sampling_rollouts`: a reward that is constant on every other prompt leaves half the groups without
    signal; the step samples more prompts until it has `prompts_per_step` groups that differ (or the cap), trains
    on those only, and counts the prompts it drew, which a resumed run skips. All-equal rewards: the cap, one group."""
    model, tok = sft_model
    constant_on: set = set()

    def half_constant_reward(prompts, completions, **kw):  # noqa: ANN001, ANN003
        # a group's rows are contiguous
        return [1.0 if str(p) in constant_on else i % 4 / 4 for i, p in enumerate(prompts)]

    stream = task.prompt_stream(seed=3)
    firsts = [next(stream) for _ in range(40)]
    constant_on.update(str(r["prompt"]) for r in firsts[::2])
    cfg = GRPOConfig(**SMALL, output_dir=str(tmp_path / "run"), dynamic_sampling_rollouts=3)
    trainer = GRPOTrainer(model, tok, [half_constant_reward], task.prompt_stream(seed=3), cfg)
    trained_rows: list = []
    update = trainer.update
    trainer.update = lambda batch, settings: trained_rows.append(int(batch.counted.sum())) or update(batch, settings)
    row = trainer.train_step()
    assert row["rollouts"] == 2 and trainer.prompts_drawn == 8  # 2 of 4 groups differ per rollout
    assert row["trained_groups"] == 4 and trained_rows == [16]
    assert row["zero_std_fraction"] == 0.5  # over every group sampled
    trainer.save(tmp_path / "run" / "checkpoint")
    resumed = GRPOTrainer(model, tok, [half_constant_reward], task.prompt_stream(seed=3), cfg)
    resumed.load(tmp_path / "run" / "checkpoint")
    assert resumed.prompts_drawn == 8 and next(resumed.prompts) == next(trainer.prompts)

    constant_on.update(str(r["prompt"]) for r in firsts)
    flat = GRPOTrainer(model, tok, [half_constant_reward], task.prompt_stream(seed=3),
                       GRPOConfig(**SMALL, output_dir=None, dynamic_sampling_rollouts=3))
    row = flat.train_step()
    assert row["rollouts"] == 3 and row["trained_groups"] == 1 and flat.prompts_drawn == 12
    with pytest.raises(ConfigError, match="dynamic_sampling_rollouts=0"):
        GRPOTrainer(model, tok, [half_constant_reward], task.prompt_stream(),
                    GRPOConfig(**SMALL, output_dir=None, dynamic_sampling_rollouts=0))
