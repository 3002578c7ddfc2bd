"""Bad task files, as an entrant makes them, through `grpo-kit score --task FILE`: each ends with exit 2 and one line
naming the file (and the line or column) and what is allowed, no traceback, and no output directory. Good files of
every format read to the same rows."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_kit.cli import main
from grpo_kit.data.datafiles import read_rows

GOOD_ROWS = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(12)]


def _jsonl(rows: list) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


GOOD_LINES = _jsonl(GOOD_ROWS)
BAD_FILES: dict[str, tuple[str, bytes | str, str]] = {
    # name: (file name, its bytes, what the one line must say after the file's path)
    "jsonl, a malformed line": ("a.jsonl", GOOD_LINES[:200] + '{"prompt": "2 + 2", "answer": 4,,}\n' + GOOD_LINES,
                                r" line \d+, column \d+: not valid JSON"),
    "jsonl, a list on a line": ("b.jsonl", _jsonl(GOOD_ROWS[:2]) + "[1, 2]\n", " line 3: a JSON list, not a row"),
    "jsonl, a bare string": ("c.jsonl", '"What is 2 + 2?"\n', " line 1: a JSON string, not a row"),
    "jsonl, not UTF-8": ("d.jsonl", GOOD_LINES.encode() + '{"prompt": "caf\u00e9", "answer": "1"}\n'.encode("latin-1"),
                         r" line 13: not UTF-8 text \(byte 0xe9 at offset \d+\)"),
    "csv, not UTF-8": ("e.csv", "prompt,answer\nna\u00efve,1\n".encode("cp1252"), " line 2: not UTF-8 text"),
    "jsonl, empty": ("f.jsonl", b"", ": no rows: the file is empty"),
    "json, only blanks": ("g.json", "  \n\n", ": no rows: the file is empty"),
    "csv, empty": ("h.csv", b"", ": no rows: the file is empty"),
    "csv, a header and no rows": ("i.csv", "prompt,answer\n", ": no rows: the file is empty"),
    "json, an object, not a list": ("j.json", json.dumps({"prompt": "2 + 2", "answer": 4}),
                                    ": a JSON object, not a list of rows"),
    "json, a list of numbers": ("k.json", "[1, 2, 3]", " row 0: a JSON number, not a row"),
    "json, a string": ("l.json", '"hello"', ": a JSON str, not a list of rows"),
    "json, a trailing comma": ("m.json", '[{"prompt": "2 + 2", "answer": 4},]', r" line 1, column \d+: not valid JSON"),
    "json, cut short": ("n.json", json.dumps(GOOD_ROWS, indent=1)[:-40], r" line \d+, column \d+: not valid JSON"),
    "csv without a header": ("o.csv", "2 + 3,5\n4 + 4,8\n" * 8,
                             r": no column 'prompt' for the prompt \(columns read from the CSV's first row: "
                             r"2 \+ 3, 5\)"),
    "csv, an unnamed column": ("p.csv", "prompt,\n2 + 2,4\n", " line 1: the header row must name every column once"),
    "csv, a column named twice": ("q.csv", "prompt,prompt\n2 + 2,4\n", " line 1: the header row must name every"),
    "csv, a row with an extra field": ("r.csv", "prompt,answer\n2 + 2,4\n1,000 + 1,1001\n",
                                       " line 3: 3 fields, but the header names 2 columns"),
    "an unsupported suffix": ("s.txt", GOOD_LINES, r": cannot read a \.txt file; use one of \.jsonl, \.json, \.csv"),
    "parquet, not parquet": ("t.parquet", GOOD_LINES, ": not a Parquet file pyarrow can open"),
    "parquet, empty": ("u.parquet", b"", ": not a Parquet file pyarrow can open"),
    "jsonl, a null prompt": ("v.jsonl", _jsonl([{"prompt": None, "answer": "1"}, *GOOD_ROWS]),
                             " row 0, column 'prompt'"),
    "jsonl, no answer column": ("w.jsonl", _jsonl([{"prompt": r["prompt"], "truth": r["answer"]} for r in GOOD_ROWS]),
                                ": no column 'answer' for the answer"),
}


def _score(args: list[str], capsys) -> tuple[int, list[str]]:
    code = main(["score", *args])
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("case", BAD_FILES, ids=list(BAD_FILES))
def test_a_bad_task_file_is_refused_in_one_line_naming_it(tmp_path, capsys, case):
    import re

    name, content, says = BAD_FILES[case]
    path = tmp_path / name
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "score"
    code, lines = _score(["--task", str(path), "--model", "tiny-gemma", "--num-test", "4", "--output-dir", str(out)],
                         capsys)
    assert code == 2 and len(lines) == 1, lines
    assert re.match(rf"grpo-kit score: error: {re.escape(str(path))}{says}", lines[0]), lines[0]
    assert not out.exists()  # nothing written
    assert path.read_bytes() == (content if isinstance(content, bytes) else content.encode())  # nothing lost


@pytest.mark.parametrize("num_test, says", [
    ("-3", "num_test=-3: the held-out rows, a whole number of at least 1"),
    ("0", "num_test=0: the held-out rows"),
    ("12", "12 rows, but num_test=12 are held out: nothing is left to train on"),
    ("500", "12 rows, but num_test=500 are held out"),
])
def test_num_test_below_one_or_above_the_rows_is_refused(tmp_path, capsys, num_test, says):
    path = tmp_path / "task.jsonl"
    path.write_text(GOOD_LINES)
    out = tmp_path / "score"
    code, lines = _score(["--task", str(path), "--model", "tiny-gemma", "--num-test", num_test, "--output-dir",
                          str(out)], capsys)
    assert code == 2 and len(lines) == 1 and f"{path}: {says}" in lines[0], lines
    assert not out.exists()


def test_a_seed_outside_what_a_split_takes_is_refused(tmp_path, capsys):
    path = tmp_path / "task.jsonl"
    path.write_text(GOOD_LINES)
    code, lines = _score(["--task", str(path), "--model", "tiny-gemma", "--num-test", "4", "--seed", "-1",
                          "--output-dir", str(tmp_path / "score")], capsys)
    assert code == 2 and lines == [f"grpo-kit score: error: {path}: seed=-1: the split's seed, a whole number from 0 "
                                   "to 2**32 - 1"]


def test_the_score_settings_refuse_counts_below_one():
    from grpo_kit.eval.scoring import ScoreSettings
    from grpo_kit.validation import ConfigError

    for field, value in (("k", 0), ("max_new_tokens", -1), ("batch_size", 0), ("temperature", 0.0), ("seed", -5)):
        with pytest.raises(ConfigError, match=rf"^ScoreSettings\.{field}="):
            ScoreSettings(**{field: value})


def test_a_hub_id_that_does_not_resolve_offline_is_one_line_from_the_command_line(tmp_path):
    """In its own process, as an entrant runs it: no traceback, exit 2, the id named, what is allowed."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "grpo_kit.cli", "score", "--task", "no-such-user/no-such-dataset",
                           "--model", "tiny-gemma", "--output-dir", str(tmp_path / "s")], capture_output=True,
                          text=True, env=env, timeout=300, cwd=tmp_path)
    lines = [line for line in done.stderr.strip().splitlines() if not line.startswith("WARNING")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert lines[-1].startswith("grpo-kit score: error: no-such-user/no-such-dataset: not a data file here and not a "
                                "dataset that can be loaded"), done.stderr
    assert "give a path ending in .jsonl, .json, .csv, .parquet" in lines[-1] and not (tmp_path / "s").exists()


def test_every_format_reads_the_same_rows(tmp_path):
    """JSONL, JSON (a list, or JSON Lines under .json), CSV (with a byte-order mark) and Parquet: the same rows, each
    value as written."""
    (tmp_path / "t.jsonl").write_text(GOOD_LINES + "\n\n")
    (tmp_path / "t.json").write_text(json.dumps(GOOD_ROWS))
    (tmp_path / "lines.json").write_text(GOOD_LINES)
    (tmp_path / "t.csv").write_text("\ufeffprompt,answer\n" + "".join(f'"{r["prompt"]}",{r["answer"]}\n'
                                                                         for r in GOOD_ROWS))
    _parquet(tmp_path / "t.parquet", GOOD_ROWS)
    for name in ("t.jsonl", "t.json", "lines.json", "t.csv", "t.parquet"):
        assert read_rows(tmp_path / name) == GOOD_ROWS, name
