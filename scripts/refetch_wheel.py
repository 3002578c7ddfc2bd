"""Install the wheel whose download broke in a failed `pip install`, fetched afresh past any cache on the way:
`python scripts/refetch_wheel.py PIP_MESSAGES`, run with the venv's python after a `pip install` failed, on a file
holding what that pip printed to stderr.

A registry connection that breaks every download of one file at the same byte (pip's `incomplete-download`,
with its resumes answered by the whole file again) is not mended by trying again: a cache between here and the
registry holds the file cut short. This asks for the same URL with a query string, which such a cache has not
seen (and for a file of PyPI's, the same path on pypi.org, another host), checks the file against the sha256 the
index publishes, and installs it without its dependencies; the next `pip install` finds it installed. Exit
status 0 when it installed the wheel, 1 when the messages name no broken download or no fresh copy was whole."""

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


def broken_download(messages: str) -> tuple[str, str | None] | None:
    """The URL of the last wheel pip could not download whole, read from what pip printed (`messages`), and its
    sha256 where pip gave one."""
    if "incomplete-download" not in messages:
        return None
    found = list(BROKEN_URL.finditer(messages))
    return (found[-1]["url"], found[-1]["sha256"]) if found else None


def published_sha256(index_url: str, project: str, filename: str) -> str:
    """The sha256 that the index's JSON simple API (PEP 691) gives for `project`'s `filename`."""
    project = re.sub(r"[-_.]+", "-", project).lower()
    request = urllib.request.Request(f"{index_url.rstrip('/')}/{project}/", headers={"Accept": SIMPLE_JSON})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == filename:
            return entry["hashes"]["sha256"]
    raise LookupError(f"{filename} is not among the files {index_url} lists for {project}")


def fresh_urls(url: str, tries: int) -> list[str]:
    """`tries` URLs for the file at `url` that no cache on the way has answered: each with its own query string,
    every other one on pypi.org where `url` is on PyPI's file host (pypi.org serves the same paths)."""
    urls = []
    for attempt in range(1, tries + 1):
        host_url = url.replace("https://files.pythonhosted.org/", "https://pypi.org/", 1) if attempt % 2 == 0 else url
        urls.append(f"{host_url}?refetch={attempt}")
    return urls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("messages", type=Path, help="what the failed `pip install` printed to stderr")
    parser.add_argument("--index-url", default=os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple"),
                        help="the index the wheel came from (PIP_INDEX_URL, else PyPI)")
    parser.add_argument("--tries", type=int, default=4, help="fresh downloads to try, each from its own URL")
    args = parser.parse_args()
    found = broken_download(args.messages.read_text(errors="replace")) if args.messages.exists() else None
    if found is None:
        print(f"refetch_wheel: {args.messages} names no broken download: nothing to refetch")
        sys.exit(1)
    url, sha256 = found
    filename = url.rsplit("/", 1)[-1]
    project = filename.split("-")[0]  # a wheel's name: project-version-tags.whl
    sha256 = sha256 or published_sha256(args.index_url, project, filename)
    for attempt, fresh_url in enumerate(fresh_urls(url, args.tries), start=1):
        requirement = f"{project} @ {fresh_url}#sha256={sha256}"  # pip checks the file against the sha256
        print(f"refetch_wheel: fetching {filename} afresh from {fresh_url} (try {attempt} of {args.tries})")
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", requirement])
        if done.returncode == 0:
            print(f"refetch_wheel: {filename} installed")
            return
    sys.exit(1)


if __name__ == "__main__":
    main()
