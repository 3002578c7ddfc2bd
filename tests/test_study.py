"""The study's arithmetic (paired differences, their bootstrap interval, the summary) and one small cell end to end."""

import json
from pathlib import Path

import numpy as np
import pytest

from grpo_kit.engine.device import describe_machine
from grpo_kit.eval.evaluation import paired_difference
from grpo_kit.train.config import PRESETS, load_run_config
from tools.__main__ import main
from tools.study import (
    REGIMES,
    REPORT_BEGIN,
    REPORT_END,
    SUMMARY_BEGIN,
    SUMMARY_END,
    cell_config,
    machine_text,
    reading,
    regime_text,
    render_markdown,
    render_summary,
    report_markers,
    run_study,
    summarize,
    write_report,
)

ROOT = Path(__file__).resolve().parents[1]


def test_the_paired_difference_counts_fixed_and_broken_problems_and_its_interval_covers_the_truth():
    first = [[True, False, False, True], [False, False, True, True]]
    second = [[True, True, False, False], [True, True, True, True]]
    d = paired_difference(first, second)
    assert d["mean"] == pytest.approx(100 * (3 - 1) / 8) and (d["fixed"], d["broken"], d["paired_problems"]) == (3, 1,
                                                                                                                 8)
    assert d["low"] < d["mean"] < d["high"]
    assert paired_difference(first, second) == d  # seeded
    sure = paired_difference([[False] * 50], [[True] * 50])
    assert sure["mean"] == sure["low"] == sure["high"] == 100.0

    # coverage: two models whose true accuracies differ by 10 points, 3 seeds × 200 paired problems
    rng = np.random.default_rng(5)
    covered = 0
    for trial in range(40):
        base = [rng.random(200) < 0.3 for _ in range(3)]
        better = [b | (rng.random(200) < 0.1 / 0.7) for b in base]  # fixes ≈ 10 % of problems, breaks none
        d = paired_difference(base, better, samples=2000, seed=trial)
        truth = 100 * np.mean([(b & ~a).mean() for a, b in zip(base, better, strict=True)])
        covered += d["low"] <= truth <= d["high"]
        assert d["low"] > 0
    assert covered >= 36


def _write_cell(root, regime, seed, correct, *, finished=True):
    phases = {"base_eval": {"accuracy": 0.0, "format_rate": 0.0, "correct": [False] * 4}}
    for stage, right in correct.items():
        if finished or stage == "sft":
            phases[f"{stage}_eval"] = {"accuracy": sum(right) / len(right), "format_rate": 1.0, "correct": right,
                                       "pass@1": 0.5, "maj@4": 0.25, "pass@4": 0.75, "correct_counts": [1, 2, 3, 4]}
            phases[stage] = {"steps": 7, "seconds": 1.0}
    path = root / regime / f"seed{seed}"
    path.mkdir(parents=True)
    (path / "progress.json").write_text(json.dumps({"settings": {}, "plan": {}, "phases": phases}))


def test_the_summary_pools_finished_seeds_and_leaves_unfinished_ones_out(tmp_path):
    t, f = True, False
    _write_cell(
        tmp_path, "scarce", 0, {"sft": [f, f, f, f], "grpo": [t, t, f, f], "control": [t, f, f, f], "rft": [t, t, t, f]}
    )
    _write_cell(
        tmp_path, "scarce", 1, {"sft": [f, t, f, f], "grpo": [t, t, t, f], "control": [f, t, f, f], "rft": [f, f, f, f]}
    )
    _write_cell(tmp_path, "scarce", 2, {"sft": [t, t, t, t], "grpo": [], "control": [], "rft": []}, finished=False)
    summary = summarize(tmp_path, regimes=["scarce", "beyond"], seeds=[0, 1, 2])
    scarce = summary["regimes"]["scarce"]
    assert scarce["seeds"] == [0, 1] and scarce["paired_problems"] == 8
    assert scarce["grpo_minus_sft_control"]["mean"] == pytest.approx(100 * 3 / 8)  # 5 right vs 2 of 8
    assert scarce["grpo_minus_rft"]["mean"] == pytest.approx(100 * 2 / 8)
    assert scarce["stages"]["grpo"] == {"accuracy": 62.5, "format_rate": 100.0, "pass@1": 50.0, "maj@4": 25.0,
                                        "pass@4": 75.0}
    assert [c["finished"] for c in scarce["cells"]] == [True, True, False] and scarce["cells"][2][
        "sft_accuracy"] == 100.0
    assert summary["regimes"]["beyond"]["seeds"] == [] and "grpo_minus_sft_control" not in summary["regimes"]["beyond"]
    assert summary["primary_metric"].startswith("greedy accuracy")


def test_the_reading_names_a_winner_only_where_the_whole_interval_is_on_its_side():
    assert reading({"mean": 6.0, "low": 0.5, "high": 11.5}) == "GRPO ahead"
    assert reading({"mean": -4.0, "low": -8.0, "high": -0.5}) == "more SFT ahead"
    assert reading({"mean": 0.5, "low": 0.0, "high": 1.5}) == "no winner shown"  # an interval that touches 0 holds it
    assert reading({"mean": -1.0, "low": -5.0, "high": 0.0}) == "no winner shown"
    assert reading(None) == "–"  # no seed finished


def test_the_report_table_goes_between_the_markers_and_nowhere_else(tmp_path):
    t, f = True, False
    _write_cell(
        tmp_path, "scarce", 0, {"sft": [f, f, f, f], "grpo": [t, t, f, f], "control": [t, f, f, f], "rft": [t, t, t, f]}
    )
    summary = summarize(tmp_path, regimes=["scarce", "beyond"], seeds=[0])
    d = summary["regimes"]["scarce"]["grpo_minus_sft_control"]
    assert summary["regimes"]["scarce"]["cells"][0].get("machine") is None  # a cell that did not record its machine
    machine = {"cpu_model": "AMD EPYC 9B14", "cpu_count": 2, "cpu_amx": False, "cpu_capability": "AVX512",
               "cpu_bf16_products": True, "torch": "2.9.0"}
    summary["regimes"]["scarce"]["cells"][0]["machine"] = machine_text(machine)
    doc = tmp_path / "capstone.md"
    doc.write_text(f"# Title\n\nMine.\n\n{REPORT_BEGIN}\nold table\n{REPORT_END}\n\nAlso mine.\n")
    write_report(summary, doc)
    text = doc.read_text()
    assert (
        text.startswith("# Title\n\nMine.\n\n")
        and text.endswith(f"{REPORT_END}\n\nAlso mine.\n")
        and "old table" not in text
    )
    readme = tmp_path / "README.md"  # the one-line-per-regime summary, between its own markers
    readme.write_text(f"Intro.\n{SUMMARY_BEGIN}\nold\n{SUMMARY_END}\nMore.\n")
    write_report(summary, readme)
    assert readme.read_text() == (
        f"Intro.\n{SUMMARY_BEGIN}\n"
        "| regime | seeds | SFT | GRPO | more SFT | RFT | GRPO − more SFT [95 % interval] | reading |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"| scarce | 1 of 1 | 0.0 % | 50.0 % | 25.0 % | 75.0 % | +25.0 [{d['low']:+.1f}, {d['high']:+.1f}] | "
        f"{reading(d)} |\n"
        f"| beyond | 0 of 1 | – | – | – | – | – | – |\n{SUMMARY_END}\nMore.\n")
    assert "| GRPO | 50.0 % | 50.0 % | 25.0 % | 75.0 % | 100.0 % |" in text
    assert ("Cells ran on: AMD EPYC 9B14, 2 cores, no AMX (AVX512, bf16 weight products, torch 2.9.0) (scarce 0)."
            in text)
    assert "| GRPO − more SFT | +25.0 | [" in text and "Seeds finished: 1 (0); 4 paired problems" in text
    assert (
        "**beyond** — worked solutions of 2-step problems only; GRPO prompts and test set 3-step. Seeds finished: 0;"
        in text
    )
    write_report(summary, doc)
    assert doc.read_text() == text  # writing again changes nothing
    notebook = tmp_path / "08.ipynb"  # in a notebook: the markdown cell holding the markers, as nbformat writes it
    cells = [{"cell_type": "code", "id": "a", "metadata": {}, "execution_count": None, "outputs": [],
              "source": [f"# {SUMMARY_BEGIN}\n", f"# {SUMMARY_END}"]},
             {"cell_type": "markdown", "id": "b", "metadata": {}, "source": ["## Study\n", f"{SUMMARY_BEGIN}\n",
                                                                             f"{SUMMARY_END}\n", "After."]}]
    notebook.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, indent=1))
    write_report(summary, notebook)
    written = json.loads(notebook.read_text())["cells"]
    assert written[0] == cells[0]  # code cells are the author's
    assert "".join(written[1]["source"]) == f"## Study\n{SUMMARY_BEGIN}\n{render_summary(summary)}{SUMMARY_END}\nAfter."
    plain = tmp_path / "plain.md"
    plain.write_text("no markers\n")
    with pytest.raises(ValueError, match="no markers for the study in docs/study.json"):
        write_report(summary, plain)
    assert plain.read_text() == "no markers\n"


def test_one_page_shows_two_studies_each_between_the_markers_naming_its_summary(tmp_path, capsys):
    t, f = True, False
    _write_cell(tmp_path / "a", "scarce", 0, {"sft": [f, f], "grpo": [t, t], "control": [t, f], "rft": [f, f]})
    _write_cell(tmp_path / "b", "scarce", 0, {"sft": [f, f], "grpo": [f, f], "control": [t, t], "rft": [t, f]})
    published = summarize(tmp_path / "a", regimes=["scarce"], seeds=[0])
    replication = summarize(tmp_path / "b", regimes=["scarce"], seeds=[0, 1, 2])
    (tmp_path / "replication.json").write_text(json.dumps(replication))
    mine = tmp_path / "runs" / "mine"
    (table_begin, table_end), (line_begin, line_end) = report_markers("docs/study.json").values()
    (again_begin, again_end), (again_line, again_line_end) = report_markers(
        (tmp_path / "replication.json").as_posix()).values()
    (mine_begin, mine_end), _ = report_markers((mine / "summary.json").as_posix()).values()
    page = tmp_path / "page.md"
    page.write_text(f"A\n{table_begin}\n{table_end}\nB\n{line_begin}\n{line_end}\nC\n{again_begin}\nold\n"
                    f"{again_end}\nD\n{again_line}\n{again_line_end}\nE\n{mine_begin}\n{mine_end}\n")
    write_report(published, page)
    assert main(["study", "--from-json", str(tmp_path / "replication.json"), "--report", str(page)]) == 0
    capsys.readouterr()
    assert page.read_text() == (
        f"A\n{table_begin}\n{render_markdown(published)}{table_end}\nB\n{line_begin}\n{render_summary(published)}"
        f"{line_end}\nC\n{again_begin}\n{render_markdown(replication)}{again_end}\nD\n{again_line}\n"
        f"{render_summary(replication)}{again_line_end}\nE\n{mine_begin}\n{mine_end}\n")
    assert "| scarce | 1 of 3 |" in render_summary(replication)  # a replication still under way says so
    write_report(replication, page, source=(tmp_path / "replication.json").as_posix())
    assert page.read_text().count(render_summary(replication)) == 1  # each table written once, where its markers are
    # A study written from its run directory fills only the markers naming that directory's summary.json.
    _write_cell(tmp_path / "c", "scarce", 0, {"sft": [t, f], "grpo": [t, t], "control": [f, f], "rft": [t, t]})
    records = tmp_path / "records"
    records.mkdir()
    (records / "scarce-seed0.json").write_text((tmp_path / "c" / "scarce" / "seed0" / "progress.json").read_text())
    before = page.read_text()
    assert main(["study", "--output-dir", str(mine), "--record-dir", str(records), "--regimes", "scarce", "--seeds",
                 "1", "--summary-only", "--report", str(page)]) == 0
    capsys.readouterr()
    mine_table = render_markdown(summarize(tmp_path / "none", regimes=["scarce"], seeds=[0], record_dir=records))
    assert "| GRPO | 100.0 % |" in mine_table
    assert page.read_text() == before.replace(f"{mine_begin}\n{mine_end}", f"{mine_begin}\n{mine_table}{mine_end}")


def test_each_cell_is_the_preset_with_its_regime_and_seed(monkeypatch):
    cfg = cell_config("cpu-gemma-270m", "beyond", 2, "runs/x")
    assert cfg.task.operations == (3,) and cfg.task.demonstration_operations == (2,) and cfg.task.seed == 1234 + 2
    assert cfg.model.seed == cfg.sft.seed == cfg.grpo.seed == 2  # the LoRA adapters' initialisation too
    assert cfg.control and cfg.rft_control and cfg.eval_pass_k == 4
    assert cfg.grpo.gate_shaped_rewards and cfg.grpo.difficulty_targeting and cfg.grpo.learning_rate == 2e-5
    # RFT at SFT's rate, as every recorded cell trained it (the arc's own default is GRPO's)
    assert cfg.rft_learning_rate == cfg.sft.learning_rate == 2e-4
    at_grpos = cell_config("cpu-gemma-270m", "scarce", 0, "x", overrides={"rft_learning_rate": 2e-5})
    assert at_grpos.rft_learning_rate == 2e-5
    assert cfg.task.num_demonstrations == 200  # the regime's own, not the preset's
    scarce = cell_config("cpu-gemma-270m", "scarce", 0, "runs/x").task
    assert scarce.num_demonstrations == 32
    assert cell_config("cpu-gemma-270m", "plentiful", 0, "runs/x").task.num_demonstrations == 200
    # the capstone preset runs the scarce regime's task, where the study found GRPO ahead of more SFT
    assert load_run_config("cpu-gemma-270m").task == scarce
    # the same work in every cell, whatever else the machine does: steps fixed, no time budget
    assert cfg.time_budget_minutes is None and (cfg.sft.steps, cfg.grpo.steps, cfg.control_steps, cfg.rft_steps) == (
        160, 84, 217, 107)
    # nor with the preset's time split, which a cell does not use: a cell started before the split changed continues
    for split in (0.2, 0.45):
        monkeypatch.setitem(PRESETS, "cpu-gemma-270m", {**PRESETS["cpu-gemma-270m"], "sft_fraction": split})
        assert cell_config("cpu-gemma-270m", "beyond", 2, "runs/x") == cfg and cfg.sft_fraction == 0.3
    assert set(REGIMES) == {"plentiful", "scarce", "beyond"}
    # each regime's words take its number of worked solutions from its settings, the one place that sets it
    assert regime_text("scarce").startswith("32 worked solutions") and regime_text("plentiful").startswith("200 ")
    monkeypatch.setitem(REGIMES, "scarce", {"task": {"num_demonstrations": 48}})
    assert regime_text("scarce").startswith("48 worked solutions")
    with pytest.raises(ValueError, match="unknown regime 'easy'"):
        cell_config("cpu-gemma-270m", "easy", 0, "runs/x")


TINY = {"time_budget_minutes": None, "eval_batch_size": 16, "eval_pass_k": 2, "control_steps": 3, "rft_steps": 2,
        "task": {"kind": "word_problems", "num_test": 8},
        "sft": {"steps": 6, "batch_size": 8, "max_length": 512},
        "grpo": {"steps": 2, "max_new_tokens": 16, "prompts_per_step": 2, "group_size": 4, "micro_batch_size": 8,
                 "prompt_bucket": 64}}


def test_a_small_study_runs_every_phase_writes_its_summary_and_continues_without_retraining(tmp_path, capsys):
    out, records = tmp_path / "study", tmp_path / "cells"
    summary = run_study(out, preset="cpu-tiny-quick", regimes=("beyond",), seeds=(0,), overrides=TINY, progress=False,
                        record_dir=records)
    beyond = summary["regimes"]["beyond"]
    assert beyond["seeds"] == [0] and beyond["paired_problems"] == 8
    cell = beyond["cells"][0]
    assert (cell["sft_steps"], cell["grpo_steps"], cell["control_steps"], cell["rft_steps"]) == (6, 2, 3, 2)  # fixed
    assert cell["sft_probe"]["prompts"] == 64 and 0 <= cell["sft_probe"]["pass@8"] <= 1
    for key in ("grpo_minus_sft_control", "grpo_minus_rft", "grpo_minus_sft"):
        assert set(beyond[key]) >= {"mean", "low", "high", "paired_problems"}
    assert summary["machine"]["cpu_count"] >= 1 and "cpu_bf16_products" in summary["machine"]
    assert json.loads((out / "summary.json").read_text())["regimes"]["beyond"]["seeds"] == [0]
    assert (out / "study.png").read_bytes()[:4] == b"\x89PNG"
    progress = (out / "beyond" / "seed0" / "progress.json").read_text()
    kept = json.loads((records / "beyond-seed0.json").read_text())  # the cell just run, kept with its machine
    assert kept.pop("machine") == describe_machine() and kept == json.loads(progress)
    summary["regimes"]["beyond"]["cells"][0].pop("machine")
    (records / "beyond-seed0.json").unlink()  # as before records were kept: the finished cell is recorded again
    again = run_study(out, preset="cpu-tiny-quick", regimes=("beyond",), seeds=(0,), overrides=TINY, progress=False,
                      record_dir=records)
    assert (out / "beyond" / "seed0" / "progress.json").read_text() == progress  # every phase was recorded: none ran
    kept = json.loads((records / "beyond-seed0.json").read_text())
    assert kept.pop("machine") == describe_machine() and kept == json.loads(progress)  # the finished cell, its machine
    assert again["regimes"]["beyond"]["cells"][0].pop("machine") == machine_text(describe_machine())
    assert again["regimes"] == summary["regimes"]
    elsewhere = run_study(tmp_path / "other", preset="cpu-tiny-quick", regimes=("beyond",), seeds=(0,),
                          overrides=TINY, progress=False, record_dir=records)
    assert elsewhere["regimes"]["beyond"]["cells"][0].pop("machine") == machine_text(describe_machine())
    assert elsewhere["regimes"] == summary["regimes"]  # another machine: the recorded cell is read, not run
    assert not (tmp_path / "other" / "beyond").exists()
    assert main(["study", "--output-dir", str(out), "--regimes", "beyond", "--seeds", "1", "--summary-only"]) == 0
    assert json.loads(capsys.readouterr().out)["beyond"]["seeds"] == [0]
    assert main(["study", "--output-dir", str(out), "--regimes", "easy", "--summary-only"]) == 2
    assert "--regimes easy: one of plentiful, scarce, beyond" in capsys.readouterr().err


def test_a_recorded_cells_rft_runs_again_at_grpos_rate_from_the_same_sft_model(tmp_path, capsys):
    """`devtools.rft_rate` on a small recorded cell: SFT trained again gives the recorded SFT model's answers (the
    same machine), RFT trains the cell's fixed steps at GRPO's rate, not the recorded SFT's, and is paired with the
    recorded stages; running again continues the arc (nothing retrains). A record without the RFT control is refused
    with its name."""
    from tools import rft_rate

    records = tmp_path / "cells"
    run_study(tmp_path / "study", preset="cpu-tiny-quick", regimes=("scarce",), seeds=(0,), overrides=TINY,
              progress=False, record_dir=records)
    record = json.loads((records / "scarce-seed0.json").read_text())
    out, result_path = tmp_path / "again", tmp_path / "docs" / "scarce-seed0.json"
    args = [str(records / "scarce-seed0.json"), "--output-dir", str(out), "--result", str(result_path), "--quiet"]
    assert rft_rate.main(args) == 0
    result = json.loads(result_path.read_text())
    grpo_rate, sft_rate = record["settings"]["grpo"]["learning_rate"], record["settings"]["sft"]["learning_rate"]
    assert grpo_rate != sft_rate and record["settings"]["rft_learning_rate"] == sft_rate
    assert result["rft_learning_rate"] == grpo_rate and result["recorded_rft_learning_rate"] == sft_rate
    assert json.loads((out / "progress.json").read_text())["settings"]["rft_learning_rate"] == grpo_rate
    assert result["sft_answers_as_recorded"] == 1.0
    assert result["sft_accuracy"] == result["recorded"]["sft"]
    assert result["rft_steps"] == 2 and set(result["recorded"]) == {"sft", "grpo", "control", "rft"}
    for stage, difference in result["rft_minus"].items():
        assert difference["paired_problems"] == 8
        assert difference["mean"] == pytest.approx(result["rft_accuracy"] - result["recorded"][stage], abs=0.01)
    progress = (out / "progress.json").read_text()
    assert rft_rate.main(args) == 0 and (out / "progress.json").read_text() == progress  # continued: none ran
    assert {k: v for k, v in json.loads(result_path.read_text()).items() if k != "machine"} == {
        k: v for k, v in result.items() if k != "machine"}
    without = tmp_path / "without.json"
    without.write_text(json.dumps({**record, "settings": {**record["settings"], "rft_control": False}}))
    with pytest.raises(ValueError, match=r"without.json: not a study cell with a fixed-step RFT control"):
        rft_rate.main([str(without), "--output-dir", str(tmp_path / "x"), "--result", str(tmp_path / "x.json")])


@pytest.mark.parametrize(("source", "records", "shown_on"), [
    ("docs/study.json", "docs/study_cells", ("README.md", "notebook 08", "docs/capstone.md")),
    ("docs/study_seeded.json", "docs/study_cells_seeded", ("docs/capstone.md",)),
])
def test_the_published_study_is_the_committed_cells(tmp_path, source, records, shown_on):
    """Each published summary (the study's, and its seeded replication's) summarises exactly the cells recorded in
    its record directory, and the pages show it as `python -m tools study --report` writes it: no published number comes
    from anywhere else."""
    published = json.loads((ROOT / source).read_text())
    again = summarize(tmp_path, regimes=list(published["regimes"]), seeds=published["planned_seeds"],
                      record_dir=ROOT / records)
    assert again["regimes"] == published["regimes"]
    notebook = json.loads((ROOT / "notebooks" / "08_gemma_gsm8k.ipynb").read_text())
    pages = {"README.md": (ROOT / "README.md").read_text(), "docs/capstone.md": (ROOT / "docs/capstone.md").read_text(),
             "docs/study/README.md": (ROOT / "docs/study/README.md").read_text(),
             "notebook 08": "".join(line for c in notebook["cells"] if c["cell_type"] == "markdown"
                                    for line in c["source"])}
    markers = report_markers(source)
    shows = [(page, *markers["summary"], render_summary) for page in shown_on]
    for page, begin, end, render in [*shows, ("docs/study/README.md", *markers["table"], render_markdown)]:
        assert begin in pages[page] and end in pages[page], f"{page}: no markers for {source}"
        shown = pages[page].split(begin, 1)[1].split(end, 1)[0]
        assert shown == "\n" + render(published), f"{page}: run `python -m tools study --from-json {source} --report`"


def test_the_study_numbers_the_pages_quote_in_words_are_the_published_ones():
    """Notebook 08 and docs/capstone.md quote pass@4 before and after GRPO and the seeded replication's GRPO − more SFT
    in their prose: the numbers are docs/study.json's and docs/study_seeded.json's."""
    published = json.loads((ROOT / "docs/study.json").read_text())["regimes"]
    seeded = json.loads((ROOT / "docs/study_seeded.json").read_text())["regimes"]["scarce"]["grpo_minus_sft_control"]
    notebook = json.loads((ROOT / "notebooks" / "08_gemma_gsm8k.ipynb").read_text())
    pages = {"notebook 08": "".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown"),
             "docs/capstone.md": (ROOT / "docs/capstone.md").read_text()}
    quoted = [f"{published[r]['stages']['sft']['pass@4']:.1f} → {published[r]['stages']['grpo']['pass@4']:.1f} %"
              for r in ("plentiful", "scarce")]
    quoted.append(f"{seeded['mean']:+.1f} [{seeded['low']:+.1f}, {seeded['high']:+.1f}]")
    for page, text in pages.items():
        text = text.replace("−", "-")
        for number in quoted:
            assert number in text, f"{page} does not quote {number!r} (docs/study*.json)"


def test_the_capstone_page_is_a_users_page_and_the_record_is_linked():
    page = (ROOT / "docs/capstone.md").read_text()
    assert len(page.encode()) <= 12_000, len(page.encode())
    assert "](study/README.md)" in page and (ROOT / "docs/study/README.md").exists()
