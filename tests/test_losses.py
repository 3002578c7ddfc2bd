import math

import pytest
import torch

from grpo_kit.algo import losses as L
from grpo_kit.engine import logprobs as LP


def test_token_logprobs_match_log_softmax_and_chunking():
    torch.manual_seed(0)
    hidden, weight = torch.randn(5, 7, 16), torch.randn(50, 16)
    ids = torch.randint(0, 50, (5, 7))
    logp, ent = LP.token_logprobs_and_entropy(hidden, weight, ids, temperature=0.7,
                                              options=LP.HeadOptions(chunk_rows=2))
    logits = (hidden @ weight.T) / 0.7
    ref = torch.log_softmax(logits, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    p = torch.softmax(logits, -1)
    assert torch.allclose(logp, ref, atol=1e-5)
    assert torch.allclose(ent, -(p * torch.log_softmax(logits, -1)).sum(-1), atol=1e-4)
    no_ent_logp, no_ent = LP.token_logprobs_and_entropy(
        hidden, weight, ids, temperature=0.7, options=LP.HeadOptions(chunk_rows=2, with_entropy=False)
    )
    assert torch.equal(no_ent_logp, logp) and torch.equal(no_ent, torch.zeros_like(logp))
    capped, _ = LP.token_logprobs_and_entropy(hidden, weight, ids, softcap=3.0)
    z = 3.0 * torch.tanh((hidden @ weight.T) / 3.0)
    assert torch.allclose(capped, torch.log_softmax(z, -1).gather(-1, ids.unsqueeze(-1)).squeeze(-1), atol=1e-5)


def test_recompute_gives_same_gradients():
    torch.manual_seed(0)
    hidden, weight = torch.randn(4, 3, 8, requires_grad=True), torch.randn(20, 8)
    ids = torch.randint(0, 20, (4, 3))
    grads = []
    for recompute in (False, True):
        hidden.grad = None
        options = LP.HeadOptions(chunk_rows=3, recompute=recompute)
        LP.token_logprobs_and_entropy(hidden, weight, ids, options=options)[0].sum().backward()
        grads.append(hidden.grad.clone())
    assert torch.allclose(grads[0], grads[1])


@pytest.mark.parametrize("softcap", [None, 5.0])
def test_the_fused_frozen_head_equals_the_plain_log_softmax_with_its_gradients(softcap):
    """Several row and vocabulary blocks (300 tokens, 40,000 entries): log-probs, entropies and the gradient to the
    hidden states through both, against log_softmax in float64."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 100, 32, requires_grad=True)
    weight, ids = torch.randn(40_000, 32) * 0.3, torch.randint(0, 40_000, (3, 100))
    g_logp, g_ent = torch.randn(3, 100), torch.randn(3, 100)
    results = []
    for fused in (True, False):
        hidden.grad = None
        h, w = (hidden, weight) if fused else (hidden.double(), weight.double())
        logp, ent = LP.token_logprobs_and_entropy(h, w, ids, temperature=0.7, softcap=softcap,
                                                  options=LP.HeadOptions(fused=fused))
        ((logp * g_logp).sum() + (ent * g_ent).sum()).backward()
        results.append((logp.detach().float(), ent.detach().float(), hidden.grad.clone()))
    for got, want in zip(*results, strict=True):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-4), (got - want).abs().max()
    assert results[0][2].abs().max() > 0.1  # gradients that mean something


def _backward_ops(t: torch.Tensor, depth: int = 3) -> set[str]:
    names, frontier = set(), [t.grad_fn]
    for _ in range(depth):
        frontier = [f for f in frontier if f is not None]
        names |= {type(f).__name__ for f in frontier}
        frontier = [n for f in frontier for n, _ in f.next_functions]
    return names


def test_the_fused_head_skips_the_entropy_gradient_when_told_and_is_picked_only_for_a_frozen_large_head():
    hidden, weight, ids = (torch.randn(2, 5, 8, requires_grad=True), torch.randn(40_000, 8),
                           torch.randint(0, 40_000, (2, 5)))
    logp, ent = LP.token_logprobs_and_entropy(hidden, weight, ids, options=LP.HeadOptions(entropy_grad=False))
    assert "_FrozenHeadLogprobsBackward" in _backward_ops(logp) and ent.grad_fn is None
    logp.sum().backward()
    trainable = torch.randn(40_000, 8, requires_grad=True)
    assert "_FrozenHeadLogprobsBackward" not in _backward_ops(
        LP.token_logprobs_and_entropy(hidden, trainable, ids)[0], depth=8
    )
    with pytest.raises(ValueError, match="LM head weight requires grad"):
        LP.frozen_head_logprobs(hidden.view(-1, 8), trainable, ids.view(-1))


def test_kl_estimators_by_hand():
    logp, ref = torch.tensor([-1.0]), torch.tensor([-2.0])
    assert L.kl_estimate(logp, ref, "k1").item() == pytest.approx(1.0)
    assert L.kl_estimate(logp, ref, "k3").item() == pytest.approx(math.exp(-1) + 1 - 1)
    assert L.kl_estimate(ref, ref, "k3").item() == 0.0


def _batch():
    logp = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -0.7, -9.0]])
    old = torch.tensor([[-1.5, -1.5, -0.5], [-0.3, -0.3, -9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    return logp, old, mask, adv


def _hand_per_token(logp, old, adv, eps_low, eps_high):
    ratio = torch.exp(logp - old)
    a = adv.unsqueeze(1)
    return -torch.min(ratio * a, ratio.clamp(1 - eps_low, 1 + eps_high) * a), ratio


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dapo", "dr_grpo"])
def test_ppo_clip_aggregations(loss_type):
    logp, old, mask, adv = _batch()
    per, _ = _hand_per_token(logp, old, adv, 0.2, 0.28)
    if loss_type == "grpo":
        expected = ((per * mask).sum(1) / mask.sum(1)).mean()
    elif loss_type in ("bnpo", "dapo"):
        expected = (per * mask).sum() / mask.sum()
    else:
        expected = (per * mask).sum() / (2 * 3)
    loss, stats = L.policy_loss(logp, old, adv, mask, L.LossSpec(epsilon=0.2, epsilon_high=0.28, loss_type=loss_type))
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    # row 0 (A > 0): ratio exp(0.5) = 1.65 > 1.28 is clipped high; exp(−0.5) = 0.61 is not (A > 0 only clips up)
    # row 1 (A < 0): ratio exp(−0.4) = 0.67 < 0.8 is clipped low; the masked third token never counts
    assert stats["clip_low"].item() == pytest.approx(1 / 5)
    assert stats["clip_high"].item() == pytest.approx(1 / 5)


def test_micro_batches_add_up_to_full_batch():
    logp, old, mask, adv = _batch()
    for loss_type in ("grpo", "dapo", "dr_grpo", "bnpo"):
        full, _ = L.policy_loss(logp, old, adv, mask, L.LossSpec(loss_type=loss_type))
        parts = sum(
            L.policy_loss(logp[i : i + 1], old[i : i + 1], adv[i : i + 1], mask[i : i + 1],
                          L.LossSpec(loss_type=loss_type), totals=L.StepTotals(2, mask.sum()))[0]
            for i in range(2)
        )
        if loss_type != "bnpo":  # bnpo is a local (per micro-batch) token mean by definition
            assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_cispo_and_gspo():
    logp, old, mask, adv = _batch()
    logp = logp.clone().requires_grad_(True)
    loss, _ = L.policy_loss(logp, old, adv, mask, L.LossSpec(loss_type="cispo", epsilon_high=0.1),
                            totals=L.StepTotals(2, mask.sum()))
    ratio = torch.exp(logp.detach() - old)
    expected = (-(ratio.clamp(max=1.1)) * adv.unsqueeze(1) * logp.detach() * mask).sum() / mask.sum()
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)
    loss.backward()
    assert torch.allclose(logp.grad, -(ratio.clamp(max=1.1)) * adv.unsqueeze(1) * mask / mask.sum())
    seq_loss, _ = L.policy_loss(logp.detach(), old, adv, mask,
                                L.LossSpec(importance_sampling_level="sequence", epsilon=10.0))
    seq_ratio = torch.exp(((logp.detach() - old) * mask).sum(1) / mask.sum(1))
    assert seq_loss.item() == pytest.approx((-(seq_ratio * adv)).mean().item(), abs=1e-6)


def test_beta_kl_and_entropy_terms():
    logp, old, mask, adv = _batch()
    ref = logp - 0.5
    ent = torch.full_like(logp, 2.0)
    base, _ = L.policy_loss(logp, old, adv, mask, L.LossSpec(loss_type="dapo"))
    with_terms, stats = L.policy_loss(logp, old, adv, mask, L.LossSpec(loss_type="dapo", beta=0.1, entropy_coef=0.01),
                                      ref_logp=ref, entropy=ent)
    k3 = math.exp(-0.5) + 0.5 - 1
    assert stats["kl"].item() == pytest.approx(k3, abs=1e-6)
    assert with_terms.item() == pytest.approx(base.item() + 0.1 * k3 - 0.01 * 2.0, abs=1e-6)


def test_loss_near_zero_at_ratio_one_but_gradient_is_not():
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    adv = torch.tensor([1.5])
    loss, _ = L.policy_loss(logp, logp.detach(), adv, torch.ones(1, 2))
    assert loss.item() == pytest.approx(-1.5)  # −mean(A); with zero-mean group advantages this is ≈ 0
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.75, -0.75]]))


def test_adaptive_beta_moves_toward_target():
    assert L.adaptive_beta(0.1, kl=1.0, target_kl=0.1) == pytest.approx(0.1 * 1.02)
    assert L.adaptive_beta(0.1, kl=0.0, target_kl=0.1) == pytest.approx(0.1 * 0.98)
    assert L.adaptive_beta(0.0, kl=1.0, target_kl=0.1) > 0
    with pytest.raises(ValueError, match="loss_type='ppo': must be one of grpo, bnpo, dapo, dr_grpo, cispo"):
        L.LossSpec(loss_type="ppo")


def test_a_loss_declares_whether_rows_with_zero_advantage_can_be_left_out():
    """The update leaves zero-advantage groups out only where the loss says that changes nothing: no KL or entropy
    term, and a normaliser over the whole batch (every registered loss but bnpo's micro-batch token mean)."""
    assert {name for name in L.LOSSES if L.LossSpec(loss_type=name).rows_with_zero_terms_can_be_left_out} == {
        "grpo", "dapo", "dr_grpo", "cispo"}
    assert not L.LossSpec(beta=0.04).rows_with_zero_terms_can_be_left_out
    assert not L.LossSpec(beta=torch.tensor(0.0)).rows_with_zero_terms_can_be_left_out  # in the graph, even at 0
    assert not L.LossSpec(entropy_coef=0.01).rows_with_zero_terms_can_be_left_out
    logp, old, mask, adv = _batch()
    adv = torch.tensor([0.7, 0.0])  # row 1's terms are exactly 0
    for name in ("grpo", "dapo", "dr_grpo", "cispo"):
        spec, totals = L.LossSpec(loss_type=name), L.StepTotals(2, mask.sum())
        full, _ = L.policy_loss(logp, old, adv, mask, spec, totals=totals)
        alone, _ = L.policy_loss(logp[:1], old[:1], adv[:1], mask[:1], spec, totals=totals)
        assert alone.item() == pytest.approx(full.item(), abs=1e-7), name
