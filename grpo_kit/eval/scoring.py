"""The frozen evaluation harness and the leaderboard: every entry scored the same way on the same held-out rows.

    grpo-kit score --task data/example_task.jsonl --model runs/mine/export-grpo --output-dir runs/mine/score
    grpo-kit leaderboard runs/*/score/score.json

`score_model` decodes each held-out problem greedily (the primary score, accuracy) and `SCORE_SETTINGS.k` times at
`SCORE_SETTINGS.temperature` (sampled pass@1, maj@k, pass@k), always with `SCORE_SETTINGS`, and writes `score.json`
(the scores with a 95 % interval, every item, the split's hash, the model, the settings, seconds, the kit's version)
and a results card `RESULTS.md`. `leaderboard` ranks score files and refuses to rank files from different splits or
settings: their numbers would not be comparable. `LeaderboardView` is the same table as a notebook widget over a
folder of entries.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from ..data.tasks import DataTask
from ..train.rundir import claim
from ..validation import above, at_least, ruled, validate, within
from .evaluation import Batching, evaluate, paired_difference, sampled_scores

SCORE_FILES = ("score.json", "RESULTS.md")
"""What `score_model` writes in its output directory."""


@dataclasses.dataclass(frozen=True)
class ScoreSettings:
    """The harness's decoding, the same for every entry (a leaderboard compares only scores made with equal ones)."""

    max_new_tokens: int = ruled(256, at_least(1))
    """Completion length: long enough for a worked solution and its answer."""
    k: int = ruled(4, at_least(1))
    """Samples per problem for pass@1, maj@k and pass@k."""
    temperature: float = ruled(0.8, above(0.0))
    """Sampling temperature of those k samples."""
    seed: int = ruled(0, within(0, 2**32 - 1))
    """Seed of the samples."""
    prompt_bucket: int = ruled(32, at_least(1))
    """Prompt length bucket (does not change any token, only padding)."""
    batch_size: int = ruled(64, at_least(1))
    """Problems decoded together (does not change any token)."""

    def __post_init__(self) -> None:
        validate(self)


SCORE_SETTINGS = ScoreSettings()


def wilson_interval(correct: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson score interval of an accuracy correct/n, in points: (p + z²/2n ± z·√(p(1−p)/n + z²/4n²)) / (1 +
    z²/n).
    It stays inside [0, 100] and is sensible at 0 % and 100 %, where p ± 1.96·SE is not."""
    if n == 0:
        return 0.0, 0.0
    p = correct / n
    center = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return round(100 * max(0.0, center - half), 2), round(100 * min(1.0, center + half), 2)


def kit_version() -> str:
    try:
        return importlib.metadata.version("grpo_kit")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def score_model(model: torch.nn.Module, tokenizer: Any, task: DataTask, output_dir: str | Path, *, model_name: str,
                settings: ScoreSettings = SCORE_SETTINGS, training: dict[str, Any] | None = None,
                overwrite: bool = False) -> dict[str, Any]:
    """Score `model` on `task.test_set()` with `settings`; write `output_dir/score.json` and `RESULTS.md`; return the
    score, which names the task by its source (`task.name`). `training` (what was trained and how, e.g. an arc's
    summary) goes into the card."""
    from ..engine.device import describe_machine

    run_dir = claim(output_dir, "score", overwrite=overwrite)
    for name in SCORE_FILES:
        run_dir.add(name)
    test = task.test_set()
    t0 = time.perf_counter()
    batching = Batching(size=settings.batch_size, prompt_bucket=settings.prompt_bucket)
    greedy = evaluate(model, tokenizer, test, max_new_tokens=settings.max_new_tokens, batching=batching,
                      samples=len(test))
    sampled = sampled_scores(model, tokenizer, test, k=settings.k, max_new_tokens=settings.max_new_tokens,
                             temperature=settings.temperature, batching=batching, seed=settings.seed)
    n, right = greedy["n"], sum(greedy["correct"])
    score = {
        "model": model_name, "task": task.name, "split_hash": task.split_hash,
        "instruction": task.system_prompt, "n": n,
        "accuracy": round(100 * greedy["accuracy"], 2), "accuracy_interval": wilson_interval(right, n),
        "format_rate": round(100 * greedy["format_rate"], 2),
        **{m: round(100 * sampled[m], 2) for m in ("pass@1", f"maj@{settings.k}", f"pass@{settings.k}")},
        "settings": dataclasses.asdict(settings), "seconds": round(time.perf_counter() - t0, 1),
        "kit_version": kit_version(), "machine": describe_machine(), "training": training or {},
        "items": [{**s, "samples_right": c} for s, c in zip(greedy["samples"], sampled["correct_counts"], strict=True)],
    }
    out = Path(output_dir)
    (out / "score.json").write_text(json.dumps(score, indent=2, default=str))
    (out / "RESULTS.md").write_text(results_card(score))
    return score


def results_card(score: dict[str, Any]) -> str:
    """The results card (`RESULTS.md`): the model, the task and split, the scores with their interval, how it was
    trained where known, the harness's settings, and a few scored examples."""
    s, k = score["settings"], score["settings"]["k"]
    low, high = score["accuracy_interval"]
    lines = [f"# Results: {score['model']}", "",
             f"Task: `{score['task']}`, {score['n']} held-out problems (split hash `{str(score['split_hash'])[:12]}`), "
             f"scored by grpo_kit {score['kit_version']}'s frozen harness in {score['seconds']:.0f} s.", "",
             "| score | value |", "|---|---|",
             f"| greedy accuracy | **{score['accuracy']:.1f} %** (95 % interval {low:.1f}–{high:.1f}) |",
             f"| format rate | {score['format_rate']:.1f} % |",
             f"| sampled pass@1 (mean of {k}) | {score['pass@1']:.1f} % |",
             f"| maj@{k} | {score[f'maj@{k}']:.1f} % |", f"| pass@{k} | {score[f'pass@{k}']:.1f} % |", "",
             f"Decoding: greedy, then {k} samples at temperature {s['temperature']} (seed {s['seed']}), "
             f"{s['max_new_tokens']} new tokens at most.", ""]
    if score.get("training"):
        lines += ["## How it was trained", ""]
        lines += [f"- {key}: {value}" for key, value in score["training"].items()]
        lines.append("")
    lines += ["## Examples", ""]
    for item in score["items"][:3]:
        mark = "right" if item["correct"] else "wrong"
        lines += [f"**{item['prompt'][:200]}** (answer {item['answer']}; {mark})", "", "```",
                  item["completion"][:500], "```", ""]
    return "\n".join(lines)


def read_score(path: str | Path) -> dict[str, Any]:
    """A score file, or a one-line error naming it."""
    path = Path(path)
    if path.is_dir():
        path = path / "score.json"
    try:
        score = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not a readable score file ({e})") from None
    missing = [key for key in ("model", "split_hash", "accuracy", "settings", "items") if key not in score]
    if missing:
        raise ValueError(f"{path}: not a grpo-kit score file (no {', '.join(missing)})")
    score["path"] = str(path)
    return score


RANK_BY = {"accuracy": "greedy accuracy", "maj@k": "maj@k", "pass@1": "sampled pass@1", "pass@k": "pass@k",
           "format_rate": "format"}
"""What a leaderboard can rank by (then by greedy accuracy, then by name): greedy accuracy, the primary score, unless
asked otherwise."""


def _refusal(score: dict[str, Any], first: dict[str, Any]) -> str | None:
    """Why `score` cannot be ranked beside `first` (another split, other harness settings), or None."""
    if score["split_hash"] != first["split_hash"]:
        return (
            f"{score['path']} was scored on another held-out split than {first['path']} (hash "
            f"{str(score['split_hash'])[:12]} vs {str(first['split_hash'])[:12]}): score both with the same --task, "
            "--num-test and --seed"
        )
    if score["settings"] != first["settings"] or score.get("instruction") != first.get("instruction"):
        mine, theirs = ({**s["settings"], "instruction": s.get("instruction")} for s in (score, first))
        changed = ", ".join(f"{k} {mine[k]!r} vs {theirs[k]!r}" for k in mine if mine[k] != theirs.get(k))
        return (
            f"{score['path']} was scored with other harness settings than {first['path']} ({changed}): their numbers "
            "are not comparable"
        )
    return None


def _comparable(scores: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """The scores that can be ranked beside the first one, and why each other one cannot (`_refusal`)."""
    kept: list[dict[str, Any]] = []
    refused: list[str] = []
    for score in scores:
        reason = _refusal(score, kept[0]) if kept else None
        if reason:
            refused.append(reason)
        else:
            kept.append(score)
    return kept, refused


def _check_rank_by(by: str) -> None:
    if by not in RANK_BY:
        raise ValueError(f"rank by {by!r}: one of {', '.join(RANK_BY)}")


def _metric(score: dict[str, Any], by: str) -> float:
    return score[by.replace("@k", f"@{score['settings']['k']}")]


def ranked_rows(scores: Sequence[dict[str, Any]], *, by: str = "accuracy") -> tuple[list[str], list[list[str]]]:
    """The leaderboard of comparable `scores` (`read_score`'s), ranked by `by` (a RANK_BY key): its header and one
    row of cells per entry, #1 first, each with its paired difference from #1 in greedy accuracy."""
    _check_rank_by(by)
    k = scores[0]["settings"]["k"]
    order = sorted(scores, key=lambda s: (-_metric(s, by), -s["accuracy"], s["model"]))
    header = ["rank", "model", "greedy accuracy (95 % interval)", "vs #1, paired (95 % interval)", f"maj@{k}",
              "sampled pass@1", f"pass@{k}", "format", "n"]
    leader = [item["correct"] for item in order[0]["items"]]
    rows = []
    for rank, s in enumerate(order, start=1):
        low, high = s["accuracy_interval"]
        versus = "–"
        if rank > 1:
            d = paired_difference([leader], [[item["correct"] for item in s["items"]]])
            versus = f"{d['mean']:+.1f} ({d['low']:+.1f} to {d['high']:+.1f})"
        rows.append([str(rank), s["model"], f"{s['accuracy']:.1f} % ({low:.1f}–{high:.1f})", versus,
                     f"{s[f'maj@{k}']:.1f} %", f"{s['pass@1']:.1f} %", f"{s[f'pass@{k}']:.1f} %",
                     f"{s['format_rate']:.1f} %", str(s["n"])])
    return header, rows


def leaderboard(paths: Sequence[str | Path], *, by: str = "accuracy") -> str:
    """A Markdown table ranking score files by `by` (RANK_BY; greedy accuracy unless asked). Refuses files scored on
    different held-out splits or with different harness settings, naming the two."""
    scores, refused = _comparable([read_score(p) for p in paths])
    if refused:
        raise ValueError(refused[0])
    if not scores:
        raise ValueError("leaderboard: give at least one score file")
    header, rows = ranked_rows(scores, by=by)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(row) + " |" for row in rows)]) + "\n"


class LeaderboardView:
    """The leaderboard as a notebook widget: every `score.json` under `folder` (and any files given), ranked.

    A menu picks what to rank by, **refresh** reads the folder again (entries scored since appear), and picking an
    entry shows its results card. A file scored on another split or with other settings than the first is listed
    under the table with the reason, not ranked. `display(view.widget)`, or end a cell with the view."""

    def __init__(
        self, folder: str | Path | None = None, files: Sequence[str | Path] = (), *, by: str = "accuracy"
    ) -> None:
        import ipywidgets as widgets

        _check_rank_by(by)
        self.folder, self.files = (Path(folder) if folder is not None else None), [Path(f) for f in files]
        self.scores: list[dict[str, Any]] = []
        self.refused: list[str] = []
        self.rank_by = widgets.Dropdown(options=[(label, key) for key, label in RANK_BY.items()], value=by,
                                        description="rank by")
        self.refresh_button = widgets.Button(description="refresh")
        self.entry = widgets.Dropdown(options=[], description="entry")
        self.table, self.card = widgets.HTML(), widgets.HTML()
        self.rank_by.observe(lambda _: self.show(), names="value")
        self.entry.observe(lambda _: self.show_card(), names="value")
        self.refresh_button.on_click(lambda _: self.refresh())
        self.widget = widgets.VBox(
            [widgets.HBox([self.rank_by, self.refresh_button]), self.table, self.entry, self.card])
        self.refresh()

    def paths(self) -> list[Path]:
        """The score files shown: those given, then every `score.json` under the folder, each once."""
        found = sorted(self.folder.rglob("score.json")) if self.folder is not None and self.folder.is_dir() else []
        return list(dict.fromkeys([*self.files, *found]))

    def refresh(self) -> None:
        """Read the score files again and show them ranked."""
        readable, unreadable = [], []
        for path in self.paths():
            try:
                readable.append(read_score(path))
            except ValueError as e:
                unreadable.append(str(e))
        self.scores, refused = _comparable(readable)
        self.refused = unreadable + refused
        chosen = self.entry.value
        self.entry.options = [(s["model"], s["path"]) for s in self.scores]
        paths = [s["path"] for s in self.scores]
        self.entry.value = chosen if chosen in paths else (paths[0] if paths else None)
        self.show()

    def show(self) -> None:
        """Render the table for the chosen ranking, and the refused files under it."""
        import html

        if not self.scores:
            where = f"under {self.folder}" if self.folder is not None else "given"
            self.table.value = f"<p>No score file {where} yet: score an entry with <code>gk.score_model</code>.</p>"
        else:
            header, rows = ranked_rows(self.scores, by=self.rank_by.value)
            cells = "".join(f"<th>{html.escape(h)}</th>" for h in header)
            body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
            self.table.value = f"<table><tr>{cells}</tr>{body}</table>"
        if self.refused:
            self.table.value += (
                "<p>Not ranked:</p><ul>" + "".join(f"<li>{html.escape(r)}</li>" for r in self.refused) + "</ul>")
        self.show_card()

    def show_card(self) -> None:
        """The chosen entry's results card (its RESULTS.md beside the score file)."""
        import html

        score = next((s for s in self.scores if s["path"] == self.entry.value), None)
        if score is None:
            self.card.value = ""
            return
        card = Path(score["path"]).with_name("RESULTS.md")
        text = card.read_text() if card.exists() else f"No results card beside {score['path']}."
        self.card.value = f"<pre style='white-space: pre-wrap'>{html.escape(text)}</pre>"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)
