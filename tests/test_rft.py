"""Rejection-sampling fine-tuning: what it keeps, that it trains only on what it keeps, and that it resumes."""

import pytest
import torch

import grpo_kit.train.rft as rft
from grpo_kit.train.config import RFTConfig
from grpo_kit.train.rft import RFTTrainer, accepted_completions
from grpo_kit.validation import ConfigError


def test_only_finished_right_and_distinct_completions_are_kept():
    rows = [{"prompt": [{"role": "user", "content": "1+1?"}], "answer": "2"},
            {"prompt": [{"role": "user", "content": "2+2?"}], "answer": "4"}]
    texts = ["<answer>2</answer>", "<answer>2</answer>", "<answer>3</answer>", "<answer>2</answer>",  # prompt 0
             "<answer>4</answer>", "<answer>5</answer>", "<answer>4</answer> ", "<answer>4</answer>"]  # prompt 1
    finished = [True, True, True, False, True, True, True, True]
    right = [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    kept = accepted_completions(rows, texts, finished=finished, right=right, group_size=4)
    # prompt 0: the duplicate and the unfinished one go; prompt 1: the same text as prompt 0's may stay once
    assert [(k["prompt"][0]["content"], k["completion"]) for k in kept] == [
        ("1+1?", "<answer>2</answer>"), ("2+2?", "<answer>4</answer>"), ("2+2?", "<answer>4</answer> ")]


def _stream(task):
    rows = list(task.test_set())
    while True:
        yield from rows


def _right_when(accept):
    """A correctness reward that calls completion i right when `accept(i)`."""
    def reward(prompts, completions, answer=None, **_):
        return [1.0 if accept(i) else 0.0 for i in range(len(completions))]
    return reward


def _params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def test_a_step_trains_on_the_accepted_samples_only_and_nothing_when_none(sft_model, task, monkeypatch):
    model, tok = sft_model
    cfg = RFTConfig(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=40, max_length=128, warmup_steps=0,
                    learning_rate=1e-3, output_dir=None)
    monkeypatch.setattr(rft, "correctness_reward", _right_when(lambda i: False))
    trainer = RFTTrainer(model, tok, _stream(task), cfg)
    before = _params(model)
    row = trainer.train_step()
    assert row["accepted"] == 0 and row["sampled_accuracy"] == 0 and "loss" not in row and row["tokens"] == 0
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # no sample right: no update

    monkeypatch.setattr(rft, "correctness_reward", _right_when(lambda i: i % 2 == 0))  # the first of each pair
    row = trainer.train_step()
    assert row["sampled_accuracy"] == 0.5 and 1 <= row["accepted"] <= 2 and row["loss"] > 0 and row["tokens"] > 0
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert trainer.prompts_drawn == 4 and trainer.step == 2


def test_a_resumed_rft_run_ends_with_the_weights_of_an_uninterrupted_one(tiny, sft_state, task, tmp_path, monkeypatch):
    monkeypatch.setattr(rft, "correctness_reward", _right_when(lambda i: i % 3 == 0))
    model, tok = tiny
    cfg = RFTConfig(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=40, max_length=128, warmup_steps=1,
                    learning_rate=1e-3, log_every=1, output_dir=str(tmp_path / "whole"))
    model.load_state_dict(sft_state)
    RFTTrainer(model, tok, _stream(task), cfg).train(progress=False)
    whole = _params(model)

    model.load_state_dict(sft_state)
    first = RFTTrainer(
        model, tok, _stream(task), cfg.__class__(**{**cfg.__dict__, "output_dir": str(tmp_path / "cut")})
    )
    first.train(progress=False, steps=2)
    first.save(tmp_path / "cut" / "checkpoint")
    del first
    model.load_state_dict(sft_state)  # the new process starts from other weights; the checkpoint puts them back
    resumed = RFTTrainer(model, tok, _stream(task),
                         cfg.__class__(**{**cfg.__dict__, "output_dir": str(tmp_path / "cut")}), resume_metrics=True)
    resumed.load(tmp_path / "cut" / "checkpoint")
    assert resumed.step == 2 and resumed.prompts_drawn == 4
    resumed.train(progress=False)
    for name, p in model.named_parameters():
        assert torch.allclose(p, whole[name], atol=1e-6), name
    rows = resumed.logger.rows
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert sorted(p.name for p in (tmp_path / "cut").glob("*.jsonl")) == ["rft_metrics.jsonl"]  # not SFT's file
    other = RFTTrainer(model, tok, _stream(task), cfg.__class__(**{**cfg.__dict__, "output_dir": str(tmp_path / "cut"),
                                                                    "group_size": 4}), resume_metrics=True)
    with pytest.raises(ConfigError, match="RFTConfig.group_size=4: the checkpoint .* was trained with 2"):
        other.load(tmp_path / "cut" / "checkpoint")


def test_rft_settings_are_validated():
    with pytest.raises(ConfigError, match="RFTConfig.group_size=0: must be ≥ 1"):
        RFTConfig(group_size=0, output_dir=None)
    with pytest.raises(ConfigError, match="RFTConfig.learning_rate=0.0: must be > 0"):
        RFTConfig(learning_rate=0, output_dir=None)


def test_rows_added_for_a_fixed_shape_leave_the_loss_and_its_gradient_unchanged(tiny):
    """On XLA RFT grows its batch of accepted completions to prompts × group rows (`rft.fixed_rows`): one shape every
    step, split evenly over a mesh. The added rows have no target tokens, so loss and gradient are the n rows'."""
    from grpo_kit.data.tasks import ArithmeticTask
    from grpo_kit.train.sft import collate, encode_demonstrations, sft_loss

    model, tokenizer = tiny
    rows = ArithmeticTask(num_demonstrations=3).demonstrations()
    batch = collate(encode_demonstrations(tokenizer, list(rows), 64), tokenizer.pad_token_id, 1)
    grown = rft.fixed_rows(batch, 8)
    assert grown["input_ids"].shape[0] == 8 and int(grown["target_mask"][3:].sum()) == 0
    assert rft.fixed_rows(grown, 8) is grown
    results = []
    for b in (batch, grown):
        model.zero_grad()
        loss, tokens = sft_loss(model, b, completion_only_head=False)  # XLA's path: the padded shape kept
        loss.backward()
        results.append((loss.detach(), tokens, model.lm_head.weight.grad.clone()))
    (loss_n, tokens_n, grad_n), (loss_8, tokens_8, grad_8) = results
    assert tokens_n == tokens_8 and torch.allclose(loss_n, loss_8, atol=1e-6)
    assert torch.allclose(grad_n, grad_8, atol=1e-6)
