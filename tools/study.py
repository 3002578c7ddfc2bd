"""The study: where does GRPO beat more SFT, on a real Gemma, by more than the noise?

Three regimes of the generated word problems, each run with several seeds. A cell (regime, seed) is one arc
(`demo.Arc`): the base model → SFT on the regime's worked solutions → GRPO, and from the same SFT model two controls
that train for as long as GRPO did: SFT continued on the same solutions, and rejection-sampling fine-tuning (RFT: SFT
on the model's own right answers to GRPO's prompts). Each model is scored on the cell's 200 held-out problems.

    plentiful  200 worked solutions of 2- and 3-step problems; tested on 2- and 3-step ones
    scarce     32 worked solutions (enough to learn the format); GRPO and RFT learn from answer-only problems (the
               `cpu-gemma-270m` preset's task)
    beyond     worked solutions of 2-step problems only; GRPO's prompts and the test set are 3-step problems

Fixed before running: the primary metric is greedy accuracy on the held-out problems; the comparison that decides is
GRPO − continued SFT, paired problem by problem, its 95 % interval from a bootstrap over problems within each seed
(`paired_difference`). Also reported per stage: sampled pass@1 (mean of k samples at GRPO's temperature), maj@k,
pass@k and the format rate. A seed changes the problems (task seed), the LoRA adapters' initialisation, the SFT
batch order and GRPO's samples.

`run_study` runs the cells one after another (seed 0 of every regime first) in `output_dir/<regime>/seed<n>/` (an
interrupted study continues where it stopped: each arc resumes) and writes `summary.json` and `study.png`; `grpo-kit
study` is its command line. A cell takes 76 minutes alone on a 2-core Xeon with AMX and 155 on one without (SFT 24, GRPO
30, the SFT control 26, RFT 33, five evaluations 42): the whole study takes a day or more. With a `record_dir`
each finished cell's record (its progress.json, a few kB) is also kept there, and a cell recorded there is not run
again, so a study spread over several machines or sessions continues from the committed records (`make study` keeps
them in docs/study_cells/).
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from grpo_kit.course.arc import Arc
from grpo_kit.course.plots import save_figure
from grpo_kit.course.stages import Stage
from grpo_kit.engine.device import describe_machine
from grpo_kit.eval.evaluation import Batching, paired_difference, sampled_scores
from grpo_kit.train.checkpoint import write_whole
from grpo_kit.train.config import GRPO_RECIPE, RunConfig, apply_overrides, load_run_config
from grpo_kit.train.rundir import claim

REGIMES: dict[str, dict[str, Any]] = {
    "plentiful": {"task": {"num_demonstrations": 200}},
    "scarce": {"task": {"num_demonstrations": 32}},
    "beyond": {"task": {"num_demonstrations": 200, "operations": [3], "demonstration_operations": [2]}},
}
"""Each regime's settings over the preset's (see the module docstring); each names its number of worked solutions,
so that a cell does not change with the preset's."""
REGIME_TEXT = {
    "plentiful": "{demonstrations} worked solutions of the test's kind (2- and 3-step problems)",
    "scarce": "{demonstrations} worked solutions; GRPO and RFT learn from answer-only problems",
    "beyond": "worked solutions of 2-step problems only; GRPO prompts and test set 3-step",
}
"""Each regime in words for the study's table (`regime_text` fills in its number of worked solutions)."""

STUDY_SETTINGS: dict[str, Any] = {
    "control": True,
    "rft_control": True,
    "eval_pass_k": 4,
    "eval_batch_size": 200,
    "time_budget_minutes": None,
    "sft_fraction": 0.3,
    "sft": {"steps": 160},
    "control_steps": 217,
    "rft_steps": 107,
    "grpo": {"steps": 84, **GRPO_RECIPE},
}
"""Every cell's arc: both controls, k = 4 samples per held-out problem, and each phase's steps fixed, so that every
cell does the same work and a busy machine slows a cell without changing what it compares. The counts come from the
first cell (plentiful, seed 0), run on a 60-minute budget on the idle 2-core Xeon: SFT a quarter of the training time,
160 steps at 4.2 s; GRPO 84 steps in 918 s; the SFT control 217 steps, 918 s at SFT's median step; RFT 107 steps,
918 s at its first steps' pace. `sft_fraction` splits only a time budget, so it changes nothing here; it is named
so that a cell's settings stay those its record was made with when the preset's split changes (a cell continues only
with the settings it started with). GRPO's recipe (`config.GRPO_RECIPE`, which every real-Gemma preset runs), from the
literature, fixed before the first cell ran: shaped rewards count only where the outcome varies (verl-recipe
PR #125), prompts drawn by their template's pass rate p in proportion to p(1 − p) (arXiv 2504.03380), and groups
whose advantages are all zero left out of the update (the same result, less work)."""
COMPARISONS = {"grpo_minus_sft_control": ("control", "grpo"), "grpo_minus_rft": ("rft", "grpo"),
               "grpo_minus_sft": ("sft", "grpo"), "rft_minus_sft_control": ("control", "rft")}
"""The paired differences reported per regime: name → (first stage, second stage), second minus first."""
COMPARISON_LABELS = {"grpo_minus_sft_control": "GRPO − more SFT", "grpo_minus_rft": "GRPO − RFT",
                     "grpo_minus_sft": "GRPO − SFT"}
"""The differences the study's plot shows, as it labels them."""
STAGES = Stage.trained()
"""The stages each cell trains and evaluates."""
PROBE_PROMPTS, PROBE_K = 64, 8
"""The `beyond` regime's check that GRPO has a signal at all: the SFT model's pass@8 on 64 of GRPO's prompts."""


def regime_text(regime: str) -> str:
    """`REGIME_TEXT` of `regime` with the number of worked solutions its settings in `REGIMES` give."""
    return REGIME_TEXT[regime].format(demonstrations=REGIMES[regime]["task"]["num_demonstrations"])


def cell_config(preset: str, regime: str, seed: int, output_dir: str | Path, *,
                overrides: dict[str, Any] | None = None) -> RunConfig:
    """The arc of one cell: `preset` with the regime's settings, STUDY_SETTINGS, then `overrides`; `seed` moves the
    task's seed (other problems), the LoRA adapters' initialisation, SFT's batch order and GRPO's samples. RFT trains
    at SFT's learning rate unless `overrides` say otherwise, as every recorded cell did (the arc's default is GRPO's
    rate: `RunConfig.rft_learning_rate`)."""
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}: one of {', '.join(REGIMES)}")
    cfg = apply_overrides(load_run_config(preset), {**REGIMES[regime], **STUDY_SETTINGS}, f"study.{regime}")
    cfg = apply_overrides(cfg, overrides or {}, "study")
    return dataclasses.replace(
        cfg, output_dir=str(output_dir), task=dataclasses.replace(cfg.task, seed=cfg.task.seed + seed),
        model=dataclasses.replace(cfg.model, seed=seed), sft=dataclasses.replace(cfg.sft, seed=seed),
        grpo=dataclasses.replace(cfg.grpo, seed=seed), rft_learning_rate=cfg.rft_learning_rate or cfg.sft.learning_rate)


def run_cell(cfg: RunConfig, regime: str, *, progress: bool = True) -> dict[str, Any]:
    """One cell's arc (continuing it where it stopped); returns its progress record. In `beyond` the SFT model's
    pass@8 on GRPO's prompts is measured before GRPO starts (phase `sft_probe`). A finished cell is left as it is."""
    progress_file = Path(cfg.output_dir) / "progress.json"
    recorded = json.loads(progress_file.read_text()) if progress_file.exists() else None
    if recorded and _cell_row({"seed": None, **recorded})["finished"]:
        return recorded
    arc = Arc(cfg, progress=progress)
    if regime == "beyond" and not arc.done("sft_probe"):
        arc.evaluate("base")
        arc.sft()
        arc.evaluate("sft")
        arc.hold("sft")
        t0 = time.perf_counter()
        stream = arc.task.prompt_stream(seed=99)  # not GRPO's own stream (seed 0): the same kind of problem
        probe = [next(stream) for _ in range(PROBE_PROMPTS)]
        scores = sampled_scores(arc.model, arc.tokenizer,
                                {"prompt": [r["prompt"] for r in probe], "answer": [r["answer"] for r in probe]},
                                k=PROBE_K, max_new_tokens=cfg.grpo.max_new_tokens, temperature=cfg.grpo.temperature,
                                batching=Batching(size=cfg.eval_batch_size, prompt_bucket=cfg.grpo.prompt_bucket),
                                seed=cfg.grpo.seed)
        arc.finish("sft_probe", {f"pass@{PROBE_K}": scores[f"pass@{PROBE_K}"], "pass@1": scores["pass@1"],
                                  "prompts": PROBE_PROMPTS, "seconds": time.perf_counter() - t0})
    arc.run()
    return json.loads(progress_file.read_text())  # the cell's record, as a finished cell returns it above


def rft_at_grpos_rate(record_path: str | Path, output_dir: str | Path, *, progress: bool = True) -> dict[str, Any]:
    """A recorded cell's RFT control again at GRPO's learning rate (`RunConfig.rft_learning_rate`; the recorded
    cells trained RFT at SFT's, ten times higher): the cell's settings from its record, SFT trained again, then RFT
    for the cell's fixed steps, each evaluated as the cell was. The new SFT model is checked against the record's
    (`sft_answers_as_recorded`: the share of held-out problems it gets right or wrong as the recorded one did; 1.0 on
    the machine and kernels that recorded the cell), and RFT is paired problem by problem with the recorded SFT,
    GRPO and SFT control (`rft_minus`, in points). The arc is in `output_dir` (running again continues it)."""
    record = json.loads(Path(record_path).read_text())
    settings = record["settings"]
    cfg = apply_overrides(RunConfig(), settings, str(record_path))
    if not (cfg.rft_control and cfg.rft_steps):
        raise ValueError(f"{record_path}: not a study cell with a fixed-step RFT control (rft_control, rft_steps)")
    cfg = dataclasses.replace(cfg, output_dir=str(output_dir), rft_learning_rate=cfg.grpo.learning_rate)
    arc = Arc(cfg, progress=progress)
    arc.sft()
    sft = arc.evaluate("sft")
    rft_phase = arc.rft()
    rft = arc.evaluate("rft")
    phases = record["phases"]
    recorded_sft = phases["sft_eval"]["correct"]
    return {
        "record": Path(record_path).as_posix(), "rft_learning_rate": cfg.rft_learning_rate,
        "recorded_rft_learning_rate": settings["rft_learning_rate"],
        "sft_accuracy": _points(sft["accuracy"]), "rft_accuracy": _points(rft["accuracy"]),
        "rft_steps": rft_phase["steps"], "rft_accepted": rft_phase["accepted"],
        "sft_answers_as_recorded": sum(a == b for a, b in zip(sft["correct"], recorded_sft, strict=True))
        / len(recorded_sft),
        "recorded": {stage: _points(phases[f"{stage}_eval"]["accuracy"]) for stage in STAGES},
        "rft_minus": {stage: paired_difference([phases[f"{stage}_eval"]["correct"]], [rft["correct"]])
                      for stage in STAGES},
        "machine": describe_machine(),
    }


def _is_metric(name: str) -> bool:
    return name in ("accuracy", "format_rate") or name.startswith(("maj@", "pass@"))


def _points(share: float | None) -> float | None:
    """A share (0.235) in points of percent (23.5), as the summary reports every metric."""
    return None if share is None else round(100 * share, 2)


def _record_path(record_dir: str | Path, regime: str, seed: int) -> Path:
    return Path(record_dir) / f"{regime}-seed{seed}.json"


def _cell_records(out: Path, regime: str, seeds: Sequence[int],
                  record_dir: str | Path | None = None) -> list[dict[str, Any]]:
    """The cells on disk: each seed's record in `record_dir` (it names the machine), else its progress.json in
    `out`."""
    records = []
    for seed in seeds:
        path = out / regime / f"seed{seed}" / "progress.json"
        if record_dir is not None and _record_path(record_dir, regime, seed).exists():
            path = _record_path(record_dir, regime, seed)
        if path.exists():
            records.append({"seed": seed, **json.loads(path.read_text())})
    return records


def _keep_record(record_dir: str | Path, regime: str, seed: int, record: dict[str, Any]) -> None:
    """A finished cell's progress record into `record_dir`, written whole or not at all, with the machine that ran it
    (`device.describe_machine`: the cells of one study may come from several)."""
    record = {**record, "machine": describe_machine()}
    path = _record_path(record_dir, regime, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(record, indent=1))


def _cell_row(cell: dict[str, Any]) -> dict[str, Any]:
    """One cell's line in the summary: whether every stage was evaluated, each phase's steps, the `beyond` regime's
    probe, and every stage's metrics in points."""
    phases = cell["phases"]
    row: dict[str, Any] = {"seed": cell["seed"], "finished": all(f"{s}_eval" in phases for s in STAGES)}
    if "machine" in cell:
        row["machine"] = machine_text(cell["machine"])
    row.update({f"{s}_steps": phases[s]["steps"] for s in STAGES if s in phases})
    if "sft_probe" in phases:
        row["sft_probe"] = phases["sft_probe"]
    for stage in ("base", *STAGES):
        for metric, value in phases.get(f"{stage}_eval", {}).items():
            if _is_metric(metric):
                row[f"{stage}_{metric}"] = _points(value)
    return row


def machine_text(machine: dict[str, Any]) -> str:
    """A machine from `device.describe_machine` in words: CPU model and cores, AMX or not, torch's kernel level, the
    weight products' dtype and torch's version (what moves a cell's times, and within float noise its numbers)."""
    amx = {True: ", AMX", False: ", no AMX"}.get(machine.get("cpu_amx"), "")
    products = "bf16 weight products" if machine.get("cpu_bf16_products") else "fp32"
    return (f"{machine.get('cpu_model', machine.get('processor'))}, {machine.get('cpu_count')} cores{amx} "
            f"({machine.get('cpu_capability')}, {products}, torch {machine.get('torch')})")


def summarize(output_dir: str | Path, *, regimes: Sequence[str], seeds: Sequence[int],
              machine: dict[str, Any] | None = None, record_dir: str | Path | None = None) -> dict[str, Any]:
    """`summary.json` from the cells on disk (in `output_dir`, else recorded in `record_dir`): per regime and stage
    each metric's mean over the finished seeds (and per cell), and the comparisons of COMPARISONS over the finished
    seeds' problems; every metric in points (%)."""
    out = Path(output_dir)
    summary: dict[str, Any] = {"primary_metric": "greedy accuracy on the held-out problems",
                               "settings": STUDY_SETTINGS, "machine": machine or {}, "planned_seeds": list(seeds),
                               "regimes": {}}
    for regime in regimes:
        cells = _cell_records(out, regime, seeds, record_dir)
        result: dict[str, Any] = {"text": regime_text(regime), "seeds": [], "stages": {}, "cells": []}
        for cell in cells:
            row = _cell_row(cell)
            if row["finished"]:
                result["seeds"].append(cell["seed"])
            result["cells"].append(row)
        done = [c for c in cells if c["seed"] in result["seeds"]]
        for stage in ("base", *STAGES):
            stage_metrics: dict[str, Any] = {}
            evals = [c["phases"][f"{stage}_eval"] for c in done if f"{stage}_eval" in c["phases"]]
            for metric in sorted({m for e in evals for m in e if _is_metric(m)}):
                values = [e[metric] for e in evals if isinstance(e.get(metric), (int, float))]
                if values:
                    stage_metrics[metric] = _points(float(np.mean(values)))
            result["stages"][stage] = stage_metrics
        for name, (a, b) in COMPARISONS.items():
            if done:
                result[name] = paired_difference([c["phases"][f"{a}_eval"]["correct"] for c in done],
                                                 [c["phases"][f"{b}_eval"]["correct"] for c in done])
        result["paired_problems"] = sum(len(c["phases"]["grpo_eval"]["correct"]) for c in done)
        summary["regimes"][regime] = result
    return summary


def run_study(output_dir: str | Path = "runs/study", *, preset: str = "cpu-gemma-270m",
              regimes: Sequence[str] = tuple(REGIMES), seeds: Sequence[int] = (0, 1, 2), minutes: float | None = None,
              overrides: dict[str, Any] | None = None, progress: bool = True,
              record_dir: str | Path | None = None) -> dict[str, Any]:
    """Every (regime, seed) cell in turn (seed by seed), skipping those already finished, then `summary.json` and
    `study.png` in `output_dir`. `minutes`: size each cell's phases by a time budget of that many minutes instead of
    the fixed steps (a quick look on another machine; its cells are not comparable with the fixed-step ones).
    `record_dir`: keep each finished cell's record there as `<regime>-seed<n>.json`, and skip the cells recorded
    there (the summary reads them)."""
    out = Path(output_dir)
    run_dir = claim(out, "study")
    for name in ("summary.json", "study.png", *regimes):
        run_dir.add(name)
    by_time = {"time_budget_minutes": minutes, "control_steps": None, "rft_steps": None} if minutes else {}
    changes = {**(overrides or {}), **by_time}
    for seed in seeds:  # seed by seed: after the first three cells every regime has a result
        for regime in regimes:
            cfg = cell_config(preset, regime, seed, out / regime / f"seed{seed}", overrides=changes)
            recorded = record_dir is not None and _record_path(record_dir, regime, seed).exists()
            if progress:
                note = f" (recorded in {record_dir})" if recorded else ""
                print(f"[study {time.strftime('%H:%M:%S')}] {regime}, seed {seed}{note}", flush=True)
            if recorded:
                continue
            record = run_cell(cfg, regime, progress=progress)
            if record_dir is not None and _cell_row({"seed": seed, **record})["finished"]:
                _keep_record(record_dir, regime, seed, record)
    summary = summarize(out, regimes=regimes, seeds=seeds, machine=describe_machine(), record_dir=record_dir)
    summary["preset"], summary["overrides"] = preset, changes
    save_summary(summary, out, run_dir=run_dir)
    return summary


def save_summary(summary: dict[str, Any], output_dir: str | Path, *, run_dir: Any = None) -> Path:
    """`summary.json` and its plot `study.png` in `output_dir` (a study's directory: `rundir.claim`ed unless the
    caller holds it as `run_dir`). Returns the path of summary.json."""
    out = Path(output_dir)
    run_dir = run_dir or claim(out, "study")
    for name in ("summary.json", "study.png"):
        run_dir.add(name)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_study(summary, out / "study.png")
    return out / "summary.json"


PUBLISHED = "docs/study.json"
"""The published study's summary (`make study`), which README.md, docs/capstone.md and notebook 08 show."""


def report_markers(source: str = PUBLISHED) -> dict[str, tuple[str, str]]:
    """The markers in a Markdown file between which `write_report` puts the study summarised in `source` (the path
    of its summary.json as the command line names it): "table", the full table (`render_markdown`), and "summary",
    a line per regime (`render_summary`: the README's). Each pair names its source, so that one page can show two
    studies (the published one and a replication), each between its own markers."""
    return {"table": (f"<!-- study table: generated from {source} by `python -m tools study --report` -->",
                      "<!-- end of study table -->"),
            "summary": (f"<!-- study summary: generated from {source} by `python -m tools study --report` -->",
                        "<!-- end of study summary -->")}


(REPORT_BEGIN, REPORT_END), (SUMMARY_BEGIN, SUMMARY_END) = report_markers().values()
"""The published study's markers: its full table, and its line per regime."""


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f} %"


def reading(difference: dict[str, Any] | None) -> str:
    """What a paired difference GRPO − more SFT shows: "GRPO ahead" where its whole 95 % interval lies above 0, "more
    SFT ahead" where it lies below, "no winner shown" where it holds 0 (and "–" where no seed has finished)."""
    if not difference:
        return "–"
    if difference["low"] > 0:
        return "GRPO ahead"
    return "more SFT ahead" if difference["high"] < 0 else "no winner shown"


def render_summary(summary: dict[str, Any]) -> str:
    """The study in one table, a line per regime: seeds finished, each stage's greedy accuracy (mean over the finished
    seeds), the deciding comparison, GRPO − more SFT, with its 95 % interval, and what it shows (`reading`)."""
    planned = len(summary.get("planned_seeds", [])) or None
    lines = ["| regime | seeds | SFT | GRPO | more SFT | RFT | GRPO − more SFT [95 % interval] | reading |",
             "|---|---|---|---|---|---|---|---|"]
    for regime, result in summary["regimes"].items():
        accuracy = [result["stages"].get(stage, {}).get("accuracy") for stage in STAGES]
        d = result.get("grpo_minus_sft_control")
        decided = f"{d['mean']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]" if d else "–"
        seeds = f"{len(result['seeds'])}" + (f" of {planned}" if planned else "")
        lines.append(f"| {regime} | {seeds} | " + " | ".join(map(_percent, accuracy))
                     + f" | {decided} | {reading(d)} |")
    return "\n".join(lines) + "\n"


def render_markdown(summary: dict[str, Any]) -> str:
    """The study as Markdown: per regime the greedy accuracy (primary), sampled pass@1, maj@k, pass@k and format rate
    of each stage (means over the finished seeds), then GRPO against each control, paired, with the 95 % interval."""
    lines = []
    ran_on: dict[str, list[str]] = {}
    for regime, result in summary["regimes"].items():
        for row in result["cells"]:
            ran_on.setdefault(row.get("machine", "a machine it did not record"), []).append(f"{regime} {row['seed']}")
    if ran_on:
        lines += ["Cells ran on: " + "; ".join(f"{m} ({', '.join(cells)})" for m, cells in ran_on.items()) + ".", ""]
    elif summary.get("machine"):
        lines += [f"Machine: {machine_text(summary['machine'])}.", ""]
    for regime, result in summary["regimes"].items():
        seeds = result["seeds"]
        lines += [
            f"**{regime}** — {result['text']}. Seeds finished: {len(seeds)}"
            f"{' (' + ', '.join(map(str, seeds)) + ')' if seeds else ''}; {result['paired_problems']} paired problems.",
            "",
        ]
        if not seeds:
            continue
        k = next((m.split("@")[1] for m in result["stages"].get("grpo", {}) if m.startswith("maj@")), "k")
        lines += [f"| stage | greedy accuracy | sampled pass@1 | maj@{k} | pass@{k} | format |",
                  "|---|---|---|---|---|---|"]
        for stage, label in (("sft", "after SFT"), ("grpo", "GRPO"), ("control", "more SFT (control)"),
                             ("rft", "RFT (control)")):
            m = result["stages"].get(stage, {})
            cells = [m.get(x) for x in ("accuracy", "pass@1", f"maj@{k}", f"pass@{k}", "format_rate")]
            lines.append(f"| {label} | " + " | ".join(map(_percent, cells)) + " |")
        lines += ["", "| paired difference (greedy) | mean | 95 % interval | fixed / broken |", "|---|---|---|---|"]
        for name, label in (("grpo_minus_sft_control", "GRPO − more SFT"), ("grpo_minus_rft", "GRPO − RFT"),
                            ("grpo_minus_sft", "GRPO − SFT"), ("rft_minus_sft_control", "RFT − more SFT")):
            if d := result.get(name):
                lines.append(
                    f"| {label} | {d['mean']:+.1f} | [{d['low']:+.1f}, {d['high']:+.1f}] | {d['fixed']} / "
                    f"{d['broken']} |"
                )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def _filled(text: str, summary: dict[str, Any], source: str) -> str | None:
    """`text` with the study written between each pair of `source`'s markers it holds (None when it holds none)."""
    markers = report_markers(source)
    pairs = [(*markers["table"], render_markdown), (*markers["summary"], render_summary)]
    present = [(begin, end, render) for begin, end, render in pairs if begin in text and end in text]
    for begin, end, render in present:
        head, rest = text.split(begin, 1)
        text = f"{head}{begin}\n{render(summary)}{end}{rest.split(end, 1)[1]}"
    return text if present else None


def write_report(summary: dict[str, Any], path: str | Path, *, source: str = PUBLISHED) -> Path:
    """Put `render_markdown(summary)` and `render_summary(summary)` between `report_markers(source)` (the full table,
    and a line per regime) in the Markdown file `path` (or in the markdown cells of the notebook `path`, .ipynb),
    which must hold at least one pair of them; the rest of the file, other studies' tables included, is the
    author's."""
    path = Path(path)
    markers = report_markers(source)
    missing = ValueError(f"{path}: no markers for the study in {source} ({markers['table'][0]} … "
                         f"{markers['table'][1]}, or {markers['summary'][0]} … {markers['summary'][1]}) to write "
                         "between")
    if path.suffix != ".ipynb":
        text = _filled(path.read_text(), summary, source)
        if text is None:
            raise missing
        path.write_text(text)
        return path
    notebook, filled = json.loads(path.read_text()), 0
    for cell in notebook["cells"]:
        cell_text = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "markdown" and (text := _filled(cell_text, summary, source)) is not None:
            cell["source"], filled = text.splitlines(keepends=True), filled + 1
    if not filled:
        raise missing
    path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")  # as nbformat writes it
    return path


def plot_study(summary: dict[str, Any], path: str | Path) -> Path:
    """The study (`study.summarize`): per regime each stage's greedy accuracy (bars: the mean over seeds; dots: each
    seed), and the paired differences with their 95 % intervals."""
    regimes = list(summary["regimes"])
    fig = Figure(figsize=(10, 3.8), layout="constrained")
    bars, diffs = fig.subplots(1, 2)
    width = 0.8 / len(STAGES)
    for j, stage in enumerate(STAGES):
        label = stage.label
        x = np.arange(len(regimes)) + (j - (len(STAGES) - 1) / 2) * width
        means = [summary["regimes"][r]["stages"].get(stage, {}).get("accuracy", np.nan) for r in regimes]
        bars.bar(x, means, width, label=label, color=f"C{j}")
        for xi, r in zip(x, regimes, strict=True):
            seeds = [c[f"{stage}_accuracy"] for c in summary["regimes"][r]["cells"] if c["finished"]]
            bars.plot([xi] * len(seeds), seeds, "k.", markersize=3)
    bars.set_xticks(range(len(regimes)), regimes)
    bars.set_ylabel("greedy accuracy (%)")
    bars.set_title("held-out accuracy per stage")
    bars.legend(fontsize=7)
    for j, (key, label) in enumerate(COMPARISON_LABELS.items()):
        for i, r in enumerate(regimes):
            d = summary["regimes"][r].get(key)
            if d:
                y = i + (j - 1) * 0.25
                diffs.errorbar(d["mean"], y, xerr=[[d["mean"] - d["low"]], [d["high"] - d["mean"]]], fmt="o",
                               color=f"C{j}", capsize=3, label=label if i == 0 else None)
    diffs.axvline(0, color="grey", linewidth=0.8)
    diffs.set_yticks(range(len(regimes)), regimes)
    diffs.set_xlabel("paired difference, points (95 % interval)")
    diffs.set_title("GRPO against each control")
    if diffs.lines:
        diffs.legend(fontsize=7)
    return save_figure(fig, path)
