"""Plot panels drawn from metrics rows: the live dashboard's figure and the saved PNGs of a run draw the same ones.

Each `draw_*` function draws one panel on a matplotlib Axes from metrics rows alone. Figures are built with
`matplotlib.figure.Figure`, never pyplot, so nothing here changes a notebook's plotting backend, and saving
works headless.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from ..train.metrics import series
from .stages import Stage

SMOOTH_WINDOW = 5
"""Steps in the running mean drawn over noisy per-step series in the saved plots."""


def smooth(values: list[float], window: int = SMOOTH_WINDOW) -> np.ndarray:
    """Running mean over the last `window` values (the first value repeated before the start)."""
    v = np.asarray(values, dtype=float)
    if len(v) < window:
        return v
    padded = np.concatenate([np.full(window - 1, v[0]), v])
    return np.convolve(padded, np.ones(window) / window, mode="valid")


def reward_function_keys(rows: list[dict[str, Any]]) -> list[str]:
    """The per-function reward means logged in the latest row (`rewards/<name>/mean`)."""
    return sorted(k for k in (rows[-1] if rows else {}) if k.startswith("rewards/") and k.endswith("/mean"))


def logged_metric_keys(rows: list[dict[str, Any]]) -> list[str]:
    """What the rewards logged with `log_metric` in the latest row (`logged/<name>`)."""
    return sorted(k for k in (rows[-1] if rows else {}) if k.startswith("logged/"))


def draw_series(
    ax: Any, rows: list[dict[str, Any]], keys: tuple[str, ...] | list[str], *, smoothed: bool = False
) -> None:
    """One line per metric key against the step (memory metrics in GiB); a legend when there are several."""
    for key in keys:
        steps, values = series(rows, key)
        if key.startswith("memory_"):
            values = [v / 2**30 for v in values]
        if steps:
            label = key.removeprefix("rewards/").removesuffix("/mean").removeprefix("memory_")
            ax.plot(steps, smooth(values) if smoothed else values, marker="." if len(steps) < 30 else None, label=label,
                    linestyle="--" if smoothed and key.startswith("rewards/") else "-")
    if len(keys) > 1 and ax.lines:
        ax.legend(fontsize=7)


def draw_reward(ax: Any, rows: list[dict[str, Any]], *, smoothed: bool = False) -> None:
    """The total reward per step with a ± std band (and its running mean when `smoothed`)."""
    steps, mean = series(rows, "reward_mean")
    _, std = series(rows, "reward_std")
    ax.plot(steps, mean, color="C0", alpha=0.35 if smoothed else 1.0, marker="." if len(steps) < 30 else None,
            label="reward (per step)")
    if smoothed:
        ax.plot(steps, smooth(mean), color="C0", label=f"reward ({SMOOTH_WINDOW}-step mean)")
    if steps and len(std) == len(mean):
        ax.fill_between(steps, np.subtract(mean, std), np.add(mean, std), color="C0", alpha=0.15)


def draw_advantage_histogram(ax: Any, rows: list[dict[str, Any]]) -> None:
    """The latest step's advantage histogram (the spike at 0 is the zero-std groups)."""
    hists = [r for r in rows if r.get("advantage_hist")]
    if hists:
        edges = np.asarray(hists[-1]["advantage_hist_edges"])
        ax.bar(edges[:-1], hists[-1]["advantage_hist"], width=np.diff(edges), align="edge")
        ax.set_title(f"advantages, step {hists[-1]['step']}\n(the spike at 0 = zero-std groups)", fontsize=9)


def draw_advantage_heatmap(ax: Any, rows: list[dict[str, Any]]) -> None:
    """Advantage histograms over the steps, one column per step, log counts."""
    hists = [r for r in rows if r.get("advantage_hist")]
    if hists:
        edges = np.asarray(hists[-1]["advantage_hist_edges"])
        counts = np.asarray([r["advantage_hist"] for r in hists], dtype=float)
        ax.imshow(np.log1p(counts.T), aspect="auto", origin="lower", cmap="viridis",
                  extent=(hists[0]["step"] - 0.5, hists[-1]["step"] + 0.5, edges[0], edges[-1]))
        ax.set_title("advantage histogram over steps (log counts)", fontsize=9)


def draw_accuracy_bars(ax: Any, summary: dict[str, Any]) -> None:
    """Held-out greedy accuracy of the base model, after SFT, after GRPO and (when run) after the SFT control."""
    stages = [("base", "base model", "C7"), ("sft", "after SFT", "C0"), ("grpo", "after GRPO", "C2"),
              ("control", "SFT control\n(same time)", "C1")]
    shown = [(label, summary[f"{key}_accuracy"], color) for key, label, color in stages if f"{key}_accuracy" in summary]
    bars = ax.bar([s[0] for s in shown], [100 * s[1] for s in shown], color=[s[2] for s in shown])
    for bar, (_, v, _) in zip(bars, shown, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, 100 * v + 1, f"{100 * v:.1f}%", ha="center")
    ax.set_ylim(0, 105)
    ax.set_ylabel("held-out greedy accuracy (%)")
    ax.set_title("Accuracy before and after")


def plot_rewards(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Reward mean ± std per step, per-function means and sampled accuracy, smoothed."""
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.subplots()
    draw_reward(ax, rows, smoothed=True)
    draw_series(ax, rows, [*reward_function_keys(rows), "accuracy"], smoothed=True)
    ax.set_xlabel("GRPO step")
    ax.set_title("Reward during GRPO")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_kl(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """KL to the reference policy and entropy per token, per step."""
    fig = Figure(figsize=(7, 3.5), layout="constrained")
    ax = fig.subplots()
    draw_series(ax, rows, ("kl", "entropy"))
    ax.set_xlabel("GRPO step")
    ax.set_title("KL to the reference and policy entropy (per token)")
    ax.grid(alpha=0.3)
    return save_figure(fig, path)


def plot_advantage_histograms(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Advantage histograms over time and the latest one."""
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    heat_ax, hist_ax = fig.subplots(1, 2, gridspec_kw={"width_ratios": [3, 1.3]})
    draw_advantage_heatmap(heat_ax, rows)
    draw_advantage_histogram(hist_ax, rows)
    heat_ax.set_xlabel("GRPO step")
    heat_ax.set_ylabel("advantage")
    return save_figure(fig, path)


def plot_accuracy(summary: dict[str, Any], path: str | Path) -> Path:
    """Held-out greedy accuracy before training, after SFT and after GRPO."""
    fig = Figure(figsize=(5, 3.5), layout="constrained")
    draw_accuracy_bars(fig.subplots(), summary)
    return save_figure(fig, path)


def plot_sharpening(summary: dict[str, Any], path: str | Path) -> Path:
    """One arc's summary (`arc.Arc.summary`): per stage after SFT (SFT, GRPO, the control) the held-out greedy
    accuracy beside pass@k, where the arc measured it (`RunConfig.eval_pass_k`). GRPO that raises greedy accuracy
    while pass@k stays put has sharpened what the SFT model could already sample."""
    stages = [s for s in Stage.trained() if f"{s}_accuracy" in summary]
    ks = [int(key.split("@")[1]) for key in summary if key.startswith("sft_pass@")]
    k = max(ks) if ks and max(ks) > 1 else None  # pass@1 is sampled accuracy, not "any of k"
    measures = [("accuracy", "greedy accuracy")] + ([(f"pass@{k}", f"pass@{k} (any of {k} samples)")] if k else [])
    fig = Figure(figsize=(6, 3.2), layout="constrained")
    ax = fig.subplots()
    width = 0.8 / len(measures)
    for j, (key, label) in enumerate(measures):
        x = np.arange(len(stages)) + (j - (len(measures) - 1) / 2) * width
        ax.bar(x, [100 * summary.get(f"{s}_{key}", np.nan) for s in stages], width, label=label, color=f"C{j}")
    ax.set_xticks(range(len(stages)), [s.label for s in stages])
    ax.set_ylabel("held-out problems (%)")
    ax.set_title("greedy accuracy moves; does pass@k?" if k else "greedy accuracy (no pass@k measured)")
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def save_figure(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return path
