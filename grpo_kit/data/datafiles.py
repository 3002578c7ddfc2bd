"""Your task's rows, read from a data file or a Hugging Face dataset, or refused in one line.

    .jsonl    one JSON object per line (blank lines skipped)
    .json     a list of JSON objects (or JSON Lines under a .json name)
    .csv      a header row naming the columns, then one row per line (UTF-8, a byte-order mark allowed)
    .parquet  a table, read with pyarrow
    other     a Hugging Face dataset id, read with `datasets.load_dataset` (its `split`)

Files are text in UTF-8 and are read whole, with the standard library's json and csv modules: a task file is small,
each value stays as written (no column is cast to one type across rows), and a bad file is named with its line and
column rather than ending in a `datasets` traceback. Every refusal is a `DataError` naming the file, where in it, and
what is allowed; nothing is written.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from ..validation import DataError

FILE_FORMATS = (".jsonl", ".json", ".csv", ".parquet")
"""The data files a task reads by suffix; any other source is a Hugging Face dataset id."""


def read_rows(source: str | Path, *, split: str = "train") -> list[dict[str, Any]]:
    """Every row of a data file (by suffix, FILE_FORMATS) or of a Hugging Face dataset's `split`, as dicts."""
    path = Path(source)
    if path.suffix.lower() in FILE_FORMATS:
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no such file" + (" (a directory)" if path.is_dir() else ""))
        rows = read_parquet(path) if path.suffix.lower() == ".parquet" else read_text_rows(path)
        if not rows:
            raise DataError(f"{path}: no rows: the file is empty; a task needs rows of question and answer")
        return rows
    if path.exists():
        raise DataError(f"{path}: cannot read a {path.suffix or 'suffix-less'} file; use one of "
                        f"{', '.join(FILE_FORMATS)}")
    return read_hub(str(source), split=split)


def read_text_rows(path: Path) -> list[dict[str, Any]]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise DataError(f"{path} line {line}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}): save "
                        "the file as UTF-8") from None
    if not text.strip():
        return []
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return read_csv(path, text)
    if suffix == ".json":
        try:
            loaded = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":
                raise DataError(f"{path} line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
            return read_jsonl(path, text)  # JSON Lines under a .json name
        if isinstance(loaded, dict):
            raise DataError(f"{path}: a JSON object, not a list of rows: give [{{\"prompt\": …, \"answer\": …}}, …] "
                            "(or one object per line in a .jsonl file)")
        if not isinstance(loaded, list):
            raise DataError(f"{path}: a JSON {type(loaded).__name__}, not a list of rows (JSON objects)")
        for i, row in enumerate(loaded):
            if not isinstance(row, dict):
                raise DataError(f"{path} row {i}: a JSON {_json_kind(row)}, not a row (a JSON object of columns)")
        return loaded
    return read_jsonl(path, text)


def read_jsonl(path: Path, text: str) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise DataError(f"{path} line {number}, column {e.colno}: not valid JSON ({e.msg}); each line holds one "
                            "JSON object") from None
        if not isinstance(row, dict):
            raise DataError(f"{path} line {number}: a JSON {_json_kind(row)}, not a row (one JSON object a line)")
        rows.append(row)
    return rows


def read_csv(path: Path, text: str) -> list[dict[str, Any]]:
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
        lines = list(reader)
    except csv.Error as e:
        raise DataError(f"{path} line {reader.line_num}: not valid CSV ({e})") from None
    names = [h.strip() for h in header]
    if any(not n for n in names) or len(set(names)) < len(names):
        raise DataError(f"{path} line 1: the header row must name every column once (it reads {header}); the first "
                        "row of a CSV names the columns, e.g. prompt,answer")
    rows = []
    for number, fields in enumerate(lines, start=2):
        if not any(f.strip() for f in fields):
            continue
        if len(fields) != len(names):
            raise DataError(f"{path} line {number}: {len(fields)} fields, but the header names {len(names)} columns "
                            f"({', '.join(names)}); quote a field that holds a comma")
        rows.append(dict(zip(names, fields, strict=True)))
    return rows


def read_parquet(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several kinds for a file it cannot open; one line each
        raise DataError(f"{path}: not a Parquet file pyarrow can open ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:160]})") from None
    return table.to_pylist()


def read_hub(dataset_id: str, *, split: str) -> list[dict[str, Any]]:
    """A hub dataset's split; a one-line DataError where it cannot be had (offline, unknown id, no such split)."""
    from datasets import load_dataset

    try:
        return list(load_dataset(dataset_id, split=split))
    except Exception as e:  # noqa: BLE001 - datasets and huggingface_hub raise many kinds; the user needs one line
        why = (str(e).strip().splitlines() or [""])[0][:200]
        raise DataError(f"{dataset_id}: not a data file here and not a dataset that can be loaded "
                        f"({type(e).__name__}: {why}); give a path ending in {', '.join(FILE_FORMATS)} or a Hugging "
                        "Face dataset id reachable from here") from None


def _json_kind(value: Any) -> str:
    return {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}.get(
        type(value), "null" if value is None else type(value).__name__)
