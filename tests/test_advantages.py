import pytest
import torch

from grpo_kit import advantages as A


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
