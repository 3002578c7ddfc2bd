"""Static PNG plots of a run (the demo's reward curve, KL, advantage histograms, accuracy bars).

Reads metrics rows only; matplotlib's Agg backend, so it works headless.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .metrics import series  # noqa: E402


def _smooth(values: list[float], window: int = 5) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    if len(v) < window:
        return v
    kernel = np.ones(window) / window
    padded = np.concatenate([np.full(window - 1, v[0]), v])
    return np.convolve(padded, kernel, mode="valid")


def plot_rewards(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Reward mean ± std per step, per-function means, and sampled accuracy."""
    fig, ax = plt.subplots(figsize=(7, 4))
    steps, mean = series(rows, "reward_mean")
    _, std = series(rows, "reward_std")
    ax.plot(steps, mean, color="C0", alpha=0.35, label="reward (per step)")
    ax.plot(steps, _smooth(mean), color="C0", label="reward (5-step mean)")
    ax.fill_between(steps, np.array(mean) - np.array(std), np.array(mean) + np.array(std), color="C0", alpha=0.1)
    for i, key in enumerate(sorted(k for k in (rows[0] if rows else {}) if k.startswith("rewards/") and k.endswith("/mean"))):
        s, v = series(rows, key)
        ax.plot(s, _smooth(v), color=f"C{i + 2}", linestyle="--", label=key.split("/")[1])
    s, acc = series(rows, "accuracy")
    if acc:
        ax.plot(s, _smooth(acc), color="C1", label="sampled accuracy")
    ax.set_xlabel("GRPO step")
    ax.set_title("Reward during GRPO")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_kl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """KL to the reference policy and entropy per step."""
    fig, ax = plt.subplots(figsize=(7, 3.5))
    s, kl = series(rows, "kl")
    ax.plot(s, kl, color="C3", label="KL(π ‖ π_ref)")
    s, ent = series(rows, "entropy")
    ax.plot(s, ent, color="C4", label="entropy / token")
    ax.set_xlabel("GRPO step")
    ax.set_title("KL to the reference and policy entropy")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_advantage_histograms(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Advantage histograms over time (one column per step) and the latest histogram."""
    hist_rows = [r for r in rows if r.get("advantage_hist")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.8), gridspec_kw={"width_ratios": [3, 1.3]})
    if hist_rows:
        edges = np.asarray(hist_rows[-1]["advantage_hist_edges"])
        image = np.array([r["advantage_hist"] for r in hist_rows], dtype=float).T
        ax1.imshow(image, aspect="auto", origin="lower", cmap="viridis",
                   extent=[hist_rows[0]["step"] - 0.5, hist_rows[-1]["step"] + 0.5, edges[0], edges[-1]])
        centers = (edges[:-1] + edges[1:]) / 2
        ax2.barh(centers, hist_rows[-1]["advantage_hist"], height=edges[1] - edges[0], color="C0")
    ax1.set_xlabel("GRPO step")
    ax1.set_ylabel("advantage")
    ax1.set_title("Advantage histogram over time (bright = many completions)")
    ax2.set_title(f"step {hist_rows[-1]['step'] if hist_rows else '-'}")
    ax2.set_xlabel("completions")
    return _save(fig, path)


def plot_accuracy(summary: dict[str, Any], path: str | Path) -> Path:
    """Held-out greedy accuracy before training, after SFT and after GRPO."""
    labels = ["random init", "after SFT", "after GRPO"]
    values = [summary["baseline_accuracy"], summary["sft_accuracy"], summary["grpo_accuracy"]]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    bars = ax.bar(labels, [100 * v for v in values], color=["C7", "C0", "C2"])
    for bar, v in zip(bars, values, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, 100 * v + 1, f"{100 * v:.1f}%", ha="center")
    ax.set_ylim(0, 105)
    ax.set_ylabel("held-out greedy accuracy (%)")
    ax.set_title("Accuracy before and after")
    return _save(fig, path)


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
