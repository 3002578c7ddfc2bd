import pytest
import torch

from grpo_kit.algo import advantages as A


def test_group_zscore_matches_hand_computation():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 2.0, 2.0, 2.0, 2.0])
    adv = A.group_zscore(r, 4)
    mean, std = 0.25, torch.tensor([1.0, 0.0, 0.0, 0.0]).std().item()  # ddof=1: 0.5
    expected = (torch.tensor([1.0, 0, 0, 0]) - mean) / (std + A.EPS)
    assert torch.allclose(adv[:4], expected, atol=1e-6)
    assert torch.equal(adv[4:], torch.zeros(4))  # zero-variance group: exactly 0, not NaN


def test_zero_std_fraction_and_mask():
    r = torch.tensor([0.1, 0.1, 0.1, 0.1, 1.0, 0.0, 0.0, 0.0])
    assert A.zero_std_fraction(r, 4).item() == 0.5
    assert A.zero_std_mask(r, 4).tolist() == [True] * 4 + [False] * 4
    assert not torch.isnan(A.group_zscore(r, 4)).any()


def test_centered_mad_batch():
    r = torch.tensor([3.0, 1.0, 1.0, 1.0, 0.0, 1.0, 2.0, 3.0])
    assert torch.allclose(A.group_centered(r, 4), torch.tensor([1.5, -0.5, -0.5, -0.5, -1.5, -0.5, 0.5, 1.5]))
    mad = A.group_mad(r, 4)
    # group 1: median 1, MAD 0 -> scale falls back to std (1.0); group 2: median 1.5, MAD 1 -> 1.4826
    assert torch.allclose(mad[:4], torch.tensor([2.0, 0, 0, 0]) / (1.0 + A.EPS), atol=1e-5)
    assert torch.allclose(mad[4:], torch.tensor([-1.5, -0.5, 0.5, 1.5]) / (1.4826 + A.EPS), atol=1e-5)
    centered = A.group_centered(r, 4)
    assert torch.allclose(A.batch_normalized(r, 4), centered / (centered.std() + A.EPS))


def test_tau_and_clipping_modes():
    adv = torch.tensor([-8.0, -1.0, 0.5, 9.0])
    assert A.clip_advantages(adv, "symmetric", 5.0).tolist() == [-5.0, -1.0, 0.5, 5.0]
    assert A.clip_advantages(adv, "asymmetric", 5.0, 2.0).tolist() == [-2.0, -1.0, 0.5, 5.0]
    assert torch.allclose(A.clip_advantages(adv, "tanh", 5.0), 5.0 * torch.tanh(adv / 5.0))
    r = torch.tensor([1.0, 0.0, 0.0, 0.0])
    assert torch.allclose(A.compute_advantages(r, 4, tau=2.0), A.group_zscore(r, 4) / 2.0)
    with pytest.raises(ValueError, match="tau"):
        A.compute_advantages(r, 4, tau=0.0)
    with pytest.raises(ValueError, match="clip mode"):
        A.clip_advantages(adv, "soft")


def test_winsorize():
    r = torch.arange(101, dtype=torch.float32)
    w = A.winsorize(r, 0.1)
    assert w.min().item() == 10.0 and w.max().item() == 90.0
    assert torch.equal(A.winsorize(r, 0.0), r)


def test_bad_group_size_is_named():
    with pytest.raises(ValueError, match="group_size=3"):
        A.group_zscore(torch.zeros(8), 3)


def test_outcome_gated_rewards_drop_shaped_terms_where_the_outcome_is_constant():
    """Two groups of 3: all wrong (shaped scores differ), and mixed. The all-wrong group's totals become equal, at
    its mean (no advantage from the shaped noise); the mixed group keeps the plain weighted sum. NaN counts as 0."""
    correct = [0.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    digits = [0.2, 0.9, float("nan"), 1.0, 0.5, 0.0]
    fmt = [1.0, 0.0, 1.0, 1.0, 1.0, 0.0]
    per_function, weights = torch.tensor([correct, digits, fmt]), torch.tensor([1.0, 0.3, 0.2])
    gated = A.outcome_gated_rewards(per_function, weights, outcome=0, group_size=3)
    plain = (torch.nan_to_num(per_function) * weights.unsqueeze(1)).sum(0)
    assert torch.allclose(gated[3:], plain[3:])
    assert torch.allclose(gated[:3], plain[:3].mean().expand(3))
    assert A.group_zscore(gated, 3)[:3].eq(0).all() and A.group_zscore(plain, 3)[:3].abs().max() > 0.5
    # the outcome's own row is never averaged away: a group that varies only in it keeps its spread
    assert torch.allclose(A.outcome_gated_rewards(per_function, weights, outcome=1, group_size=3)[3:], plain[3:])
