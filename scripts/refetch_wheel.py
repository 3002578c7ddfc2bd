"""Install the wheel whose download broke in a failed `pip install`, fetched afresh past any cache on the way:
`python scripts/refetch_wheel.py PIP_LOG`, run with the venv's python after `pip install --log PIP_LOG` failed.

A registry connection that breaks every download of one file at the same byte (pip's `incomplete-download`,
with its resumes answered by the whole file again) is not mended by trying again: a cache between here and the
registry holds the file cut short. This asks for the same URL with a query string, which such a cache has not
seen, checks the file against the sha256 the index publishes, and installs it without its dependencies; the
next `pip install` finds it installed. Exit status 0 when it installed a wheel, 1 when the log names no broken
download or the file could not be had whole."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

BROKEN_URL = re.compile(r"URL: (?P<url>\S+?\.whl)(?:#sha256=(?P<sha256>[0-9a-f]{64}))?\s*$", re.MULTILINE)
SIMPLE_JSON = "application/vnd.pypi.simple.v1+json"


def broken_download(log: str) -> tuple[str, str | None] | None:
    """The URL of the last wheel pip could not download whole in `log`, and its sha256 where pip gave one."""
    if "incomplete-download" not in log:
        return None
    found = list(BROKEN_URL.finditer(log))
    return (found[-1]["url"], found[-1]["sha256"]) if found else None


def published_sha256(index_url: str, filename: str) -> str:
    """The sha256 that the index's JSON simple API (PEP 691) gives for `filename`."""
    project = re.sub(r"[-_.]+", "-", filename.split("-")[0]).lower()
    request = urllib.request.Request(f"{index_url.rstrip('/')}/{project}/", headers={"Accept": SIMPLE_JSON})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == filename:
            return entry["hashes"]["sha256"]
    raise LookupError(f"{filename} is not among the files {index_url} lists for {project}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the log of the failed install (pip install --log LOG)")
    parser.add_argument("--index-url", default=os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple"),
                        help="the index the wheel came from (PIP_INDEX_URL, else PyPI)")
    parser.add_argument("--tries", type=int, default=3, help="fresh downloads to try, each with its own query")
    args = parser.parse_args()
    found = broken_download(args.log.read_text(errors="replace")) if args.log.exists() else None
    if found is None:
        print(f"refetch_wheel: {args.log} names no broken download: nothing to refetch")
        sys.exit(1)
    url, sha256 = found
    filename = url.rsplit("/", 1)[-1]
    sha256 = sha256 or published_sha256(args.index_url, filename)
    project = filename.split("-")[0]
    for attempt in range(1, args.tries + 1):
        # The query string makes the URL one no cache on the way holds; pip checks the file against the sha256.
        requirement = f"{project} @ {url}?refetch={attempt}#sha256={sha256}"
        print(f"refetch_wheel: fetching {filename} afresh (try {attempt} of {args.tries})")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", requirement])
        if done.returncode == 0:
            print(f"refetch_wheel: {filename} installed")
            return
    sys.exit(1)


if __name__ == "__main__":
    main()
