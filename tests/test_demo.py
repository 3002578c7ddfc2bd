import json

from grpo_kit.cli import main


def test_quick_demo_writes_summary_metrics_and_plots(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--preset", "cpu-tiny-quick", "--output-dir", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for key in ("baseline_accuracy", "sft_accuracy", "grpo_accuracy", "format_rate", "sft_seconds", "grpo_seconds",
                "wall_seconds"):
        assert key in summary, key
    assert summary["grpo_steps"] == 6 and summary["sft_steps"] == 40
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 7))
    for name in ("reward_curve.png", "kl.png", "advantage_histograms.png", "accuracy.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, name
    printed = json.loads(capsys.readouterr().out)
    assert printed["grpo_accuracy"] == summary["grpo_accuracy"]
