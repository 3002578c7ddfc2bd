"""The frozen harness and the leaderboard: score files, the results card, ranking, and refusals across splits."""

import copy
import json

import pytest

from grpo_kit.cli import main
from grpo_kit.eval.scoring import SCORE_SETTINGS, leaderboard, ranked_rows, read_score, wilson_interval


def test_the_wilson_interval_stays_inside_0_to_100_and_narrows_with_n():
    assert wilson_interval(0, 10) == (0.0, 27.75)
    assert wilson_interval(10, 10) == (72.25, 100.0)
    low, high = wilson_interval(50, 200)
    assert low < 25 < high and high - low < 13
    low2, high2 = wilson_interval(500, 2000)
    assert high2 - low2 < (high - low) / 2 + 1


def _score(model, right, *, split="abc123", settings=None):
    n = len(right)
    return {"model": model, "task": "t.jsonl", "split_hash": split, "n": n, "accuracy": 100 * sum(right) / n,
            "accuracy_interval": list(wilson_interval(sum(right), n)), "format_rate": 100.0, "pass@1": 50.0,
            "maj@4": 40.0, "pass@4": 60.0, "settings": settings or dict(SCORE_SETTINGS.__dict__),
            "items": [{"correct": r} for r in right]}


def _write(tmp_path, name, score):
    path = tmp_path / name / "score.json"
    path.parent.mkdir()
    path.write_text(json.dumps(score))
    return path


def test_the_leaderboard_ranks_by_accuracy_with_paired_intervals_and_refuses_mixed_splits(tmp_path):
    a = _write(tmp_path, "a", _score("sft-only", [True] * 30 + [False] * 70))
    b = _write(tmp_path, "b", _score("grpo", [True] * 45 + [False] * 55))
    table = leaderboard([a, b.parent])  # a directory holding score.json reads the same
    rows = [line for line in table.splitlines() if line.startswith("| 1") or line.startswith("| 2")]
    assert rows[0].startswith("| 1 | grpo | 45.0 %") and rows[1].startswith("| 2 | sft-only | 30.0 %")
    assert "| -15.0 (" in rows[1] and rows[0].split("|")[4].strip() == "–"
    other = _write(tmp_path, "c", _score("elsewhere", [True] * 100, split="ffff00"))
    with pytest.raises(ValueError, match=r"was scored on another held-out split .*\(hash ffff00 vs abc123\)"):
        leaderboard([a, other])
    settings = dict(SCORE_SETTINGS.__dict__, max_new_tokens=64)
    shorter = _write(tmp_path, "d", _score("short", [True] * 100, settings=settings))
    with pytest.raises(ValueError, match="other harness settings .*max_new_tokens 64 vs 256"):
        leaderboard([a, shorter])
    told = _write(tmp_path, "f", {**_score("told", [True] * 100), "instruction": "Answer in French."})
    with pytest.raises(ValueError, match="instruction 'Answer in French.' vs None"):
        leaderboard([a, told])
    (tmp_path / "e").mkdir()
    (tmp_path / "e" / "score.json").write_text('{"model": "x"}')
    with pytest.raises(ValueError, match="not a grpo-kit score file"):
        read_score(tmp_path / "e")


def test_the_leaderboard_ranks_by_another_column_when_asked():
    scores = [{**_score("greedy-best", [True] * 60 + [False] * 40), "maj@4": 50.0, "path": "a"},
              {**_score("vote-best", [True] * 50 + [False] * 50), "maj@4": 70.0, "path": "b"}]
    _, by_accuracy = ranked_rows(scores)
    _, by_vote = ranked_rows(scores, by="maj@k")
    assert [r[1] for r in by_accuracy] == ["greedy-best", "vote-best"] and [r[1] for r in by_vote] == ["vote-best",
                                                                                                       "greedy-best"]
    assert by_vote[1][3].startswith("+10.0")  # the paired difference is always in greedy accuracy, from #1
    with pytest.raises(ValueError, match="rank by 'speed': one of accuracy, maj@k"):
        ranked_rows(scores, by="speed")


def test_the_leaderboard_widget_ranks_a_folder_refreshes_and_lists_what_it_cannot_rank(tmp_path):
    """`LeaderboardView`: the entries under a folder ranked as in the Markdown table; an entry scored later appears
    on refresh; a file from another split is listed with the reason instead of ranked; picking an entry shows its
    card; ranking by maj@k reorders the rows."""
    from grpo_kit.eval.scoring import LeaderboardView

    entries = tmp_path / "entries"
    entries.mkdir()
    view = LeaderboardView(entries)
    assert "No score file under" in view.table.value and view.entry.options == ()
    _write(entries, "sft", {**_score("sft-only", [True] * 30 + [False] * 70), "maj@4": 55.0})
    assert "sft-only" not in view.table.value
    view.refresh_button.click()
    assert "<td>sft-only</td>" in view.table.value and "No results card beside" in view.card.value
    grpo = _write(entries, "grpo", _score("grpo", [True] * 45 + [False] * 55))
    grpo.with_name("RESULTS.md").write_text("# Results: grpo (the file)")
    _write(entries, "other", _score("elsewhere", [True] * 100, split="ffff00"))
    view.refresh()
    table = view.table.value
    assert table.index("<td>grpo</td>") < table.index("<td>sft-only</td>") and "<td>elsewhere</td>" not in table
    assert "Not ranked:" in table and "another held-out split" in table
    view.rank_by.value = "maj@k"
    assert view.table.value.index("<td>sft-only</td>") < view.table.value.index("<td>grpo</td>")
    view.entry.value = str(grpo)
    assert "(the file)" in view.card.value


def test_scoring_a_model_writes_the_score_and_the_card_and_the_leaderboard_reads_them(tmp_path, capsys, monkeypatch):
    import grpo_kit.eval.scoring as scoring

    monkeypatch.setattr(scoring, "SCORE_SETTINGS", scoring.ScoreSettings(max_new_tokens=16, k=2))
    monkeypatch.setattr(scoring.score_model, "__kwdefaults__", {**scoring.score_model.__kwdefaults__,
                                                                  "settings": scoring.SCORE_SETTINGS})
    data = tmp_path / "mine.jsonl"
    data.write_text(
        "".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n" for i in range(20)))
    common = ["--task", str(data), "--prompt-column", "question", "--num-test", "6", "--quiet"]
    assert (
        main(["score", *common, "--model", "tiny-gemma", "--output-dir", str(tmp_path / "s1"), "--name", "base"]) == 0)
    printed = json.loads(capsys.readouterr().out.split("\nWrote")[0])
    score = json.loads((tmp_path / "s1" / "score.json").read_text())
    assert printed["accuracy"] == score["accuracy"] and score["n"] == 6 and len(score["items"]) == 6
    assert score["model"] == "base" and len(score["split_hash"]) == 64 and score["settings"]["k"] == 2
    assert {"pass@1", "maj@2", "pass@2", "format_rate", "accuracy_interval", "seconds", "kit_version"} <= set(score)
    card = (tmp_path / "s1" / "RESULTS.md").read_text()
    assert card.startswith("# Results: base") and "greedy accuracy" in card and score["split_hash"][:12] in card
    assert (
        main(["score", *common, "--model", "tiny-gemma", "--output-dir", str(tmp_path / "s2"), "--name", "again"]) == 0)
    capsys.readouterr()
    assert (
        main(["leaderboard", str(tmp_path / "s1"), str(tmp_path / "s2"), "--output", str(tmp_path / "board.md")]) == 0)
    assert "| base |" in (tmp_path / "board.md").read_text() and "| again |" in capsys.readouterr().out
    assert (
        main(["score", *common[:-3], "--num-test", "5", "--model", "tiny-gemma", "--output-dir", str(tmp_path / "s3")])
        == 0
    )
    capsys.readouterr()
    assert main(["leaderboard", str(tmp_path / "s1"), str(tmp_path / "s3")]) == 2
    assert "another held-out split" in capsys.readouterr().err
    before = copy.deepcopy(score)
    (tmp_path / "mine.txt").write_text("x")
    assert (
        main(
            ["score", "--task", str(tmp_path / "mine.txt"), "--model", "tiny-gemma", "--output-dir",
             str(tmp_path / "s1")]
        )
        == 2
    )
    assert json.loads((tmp_path / "s1" / "score.json").read_text()) == before  # a refused run leaves the score alone


def test_an_arc_directory_is_scored_at_the_stage_asked(tmp_path, capsys, monkeypatch):
    import dataclasses

    import grpo_kit.eval.scoring as scoring
    from grpo_kit.course.arc import Arc
    from grpo_kit.train.config import load_run_config

    monkeypatch.setattr(
        scoring.score_model, "__kwdefaults__",
        {**scoring.score_model.__kwdefaults__, "settings": scoring.ScoreSettings(max_new_tokens=16, k=2)})
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i),
                                        "solution": f"{i} + {i} = {2 * i}"}) + "\n" for i in range(30)))
    cfg = load_run_config("cpu-tiny-quick")
    cfg = dataclasses.replace(cfg, output_dir=str(tmp_path / "arc"), task=dataclasses.replace(
        cfg.task, kind="file", source=str(data), prompt_column="question", solution_column="solution", num_test=6),
        sft=dataclasses.replace(cfg.sft, steps=3, batch_size=4), grpo=dataclasses.replace(cfg.grpo, steps=1))
    arc = Arc(cfg, "cpu", progress=False)
    arc.run()
    sft_accuracy = arc.done("sft_eval")["accuracy"]
    del arc
    common = ["score", "--task", str(data), "--prompt-column", "question", "--num-test", "6", "--quiet", "--model",
              str(tmp_path / "arc")]
    assert main([*common, "--stage", "sft", "--output-dir", str(tmp_path / "s-sft")]) == 0
    capsys.readouterr()
    score = json.loads((tmp_path / "s-sft" / "score.json").read_text())
    assert score["training"]["stage"] == "sft" and score["training"]["sft steps"] == 3 and "after sft" in score["model"]
    assert score["n"] == 6 and 0 <= score["accuracy"] <= 100 and sft_accuracy is not None
    assert main([*common, "--output-dir", str(tmp_path / "s-grpo")]) == 0  # the GRPO stage by default
    assert json.loads((tmp_path / "s-grpo" / "score.json").read_text())["training"]["grpo steps"] == 1


def test_an_arcs_final_checkpoint_is_scored_and_exported_whole_and_an_unfinished_one_is_refused(tmp_path, capsys):
    """A LoRA arc's grpo/final holds an adapter over the merged SFT model: loaded on the base model alone it would be
    another model. Given as --model or --checkpoint it goes through the arc, and its export reloads to the arc's
    own GRPO model."""
    import dataclasses

    import torch
    from transformers import AutoModelForCausalLM

    from grpo_kit.course.arc import Arc
    from grpo_kit.train.config import load_run_config

    cfg = load_run_config("cpu-tiny-quick")
    cfg = dataclasses.replace(cfg, output_dir=str(tmp_path / "arc"), task=dataclasses.replace(cfg.task, num_test=6),
                              model=dataclasses.replace(cfg.model, lora=True, lora_r=4),
                              sft=dataclasses.replace(cfg.sft, steps=3, batch_size=4, learning_rate=5e-3),
                              grpo=dataclasses.replace(cfg.grpo, steps=1, learning_rate=5e-3))
    arc = Arc(cfg, "cpu", progress=False)
    arc.evaluate("base")
    arc.sft()
    arc.grpo()
    ids = torch.tensor([[2, 10, 11, 12, 13]])
    with torch.no_grad():
        expected = arc.model(input_ids=ids).logits
    del arc
    final = tmp_path / "arc" / "grpo" / "final"
    assert main(["export", "--checkpoint", str(final), "--out", str(tmp_path / "export"), "--quiet"]) == 0
    capsys.readouterr()
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", attn_implementation="eager")
    with torch.no_grad():
        assert (exported(input_ids=ids).logits - expected).abs().max() < 1e-4
    (tmp_path / "arc" / "grpo" / "checkpoint").mkdir()
    assert (
        main(["export", "--checkpoint", str(tmp_path / "arc" / "grpo" / "checkpoint"), "--out", str(tmp_path / "e2")])
        == 2
    )
    assert "is an unfinished phase of the arc" in capsys.readouterr().err
    # copied out of its arc, the adapter is still refused over the bare model (it says where the arc keeps it)
    import shutil

    moved = shutil.copytree(final, tmp_path / "moved")
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                            for i in range(9)))
    for command in (["export", "--checkpoint", str(moved), "--out", str(tmp_path / "e3")],
                    ["eval", "--checkpoint", str(moved), "--preset", "cpu-tiny-quick"],
                    ["score", "--task", str(data), "--model", str(moved)]):
        assert main([*command, "--quiet"]) == 2
        assert f"is a LoRA adapter that the arc in {(tmp_path / 'arc').resolve()} trained over its SFT model" in (
            capsys.readouterr().err), command
    assert not (tmp_path / "e3").exists()
