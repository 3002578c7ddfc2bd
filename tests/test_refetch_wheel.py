"""scripts/refetch_wheel.py, which `make` runs when a fresh install broke on one file: against a local index
whose file host cuts every plain download of the wheel at half its length (as a cache holding it cut short
would) and serves it whole only under a query string it has not seen."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path
from urllib.parse import urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "refetch_wheel.py"
sys.path.insert(0, str(ROOT / "scripts"))
import refetch_wheel  # noqa: E402

WHEEL = "cutpkg-1.0-py3-none-any.whl"


def make_wheel(path: Path) -> bytes:
    with zipfile.ZipFile(path, "w") as wheel:
        wheel.writestr("cutpkg/__init__.py", "ANSWER = 42\n" + "# padding\n" * 20_000)
        info = "cutpkg-1.0.dist-info"
        wheel.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: cutpkg\nVersion: 1.0\n")
        wheel.writestr(f"{info}/WHEEL",
                       "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path.read_bytes()


@pytest.fixture
def cutting_index(tmp_path):
    """A PEP 691 index on localhost; `published` is the sha256 it lists, `requests` every path asked for."""
    data = make_wheel(tmp_path / WHEEL)
    state = {"published": hashlib.sha256(data).hexdigest(), "requests": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):  # the test reads state["requests"] instead
            pass

        def do_GET(self):
            state["requests"].append(self.path)
            url = urlsplit(self.path)
            if url.path == "/simple/cutpkg/":
                body = json.dumps({"meta": {"api-version": "1.0"}, "name": "cutpkg", "files": [
                    {"filename": WHEEL, "url": f"/files/{WHEEL}", "hashes": {"sha256": state["published"]}}]}).encode()
                kind, length = "application/vnd.pypi.simple.v1+json", len(body)
            elif url.path == f"/files/{WHEEL}":
                # Range requests are answered with the whole file, as the registry's proxy here does; the length
                # announced is the whole file's.
                body = data if url.query else data[: len(data) // 2]
                kind, length = "application/zip", len(data)
                self.close_connection = True
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(length))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    state["index"] = f"http://127.0.0.1:{server.server_port}/simple"
    yield state
    server.shutdown()


def pip_env(target: Path) -> dict[str, str]:
    # Installs go into a folder of the test's, never into the venv running it; no cache keeps a whole copy.
    return {**os.environ, "PIP_TARGET": str(target), "PIP_NO_CACHE_DIR": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def broken_install(index: str, target: Path, log: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--resume-retries", "1",
                           "--index-url", index, "cutpkg"], env=pip_env(target), capture_output=True, text=True)
    assert done.returncode != 0 and "incomplete-download" in done.stderr
    log.write_text(done.stderr)


def refetch(index: str, target: Path, log: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(log), "--index-url", index, "--tries", "2"],
                          env=pip_env(target), capture_output=True, text=True)


def test_a_wheel_cut_at_the_same_byte_on_every_try_is_fetched_afresh_checked_and_installed(cutting_index, tmp_path):
    target, log = tmp_path / "site", tmp_path / "pip-stderr.txt"
    broken_install(cutting_index["index"], target, log)
    assert not (target / "cutpkg").exists()
    done = refetch(cutting_index["index"], target, log)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{WHEEL} installed" in done.stdout
    assert (target / "cutpkg" / "__init__.py").read_text().startswith("ANSWER = 42")
    assert cutting_index["requests"][-1] == f"/files/{WHEEL}?refetch=1"


def test_a_refetched_file_that_differs_from_the_published_sha256_is_not_installed(cutting_index, tmp_path):
    target, log = tmp_path / "site", tmp_path / "pip-stderr.txt"
    broken_install(cutting_index["index"], target, log)
    cutting_index["published"] = "0" * 64
    done = refetch(cutting_index["index"], target, log)
    assert done.returncode == 1 and "THESE PACKAGES DO NOT MATCH THE HASHES" in done.stderr
    assert not (target / "cutpkg").exists()
    assert cutting_index["requests"][-2:] == [f"/files/{WHEEL}?refetch=1", f"/files/{WHEEL}?refetch=2"]


def test_a_log_that_names_no_broken_download_refetches_nothing(cutting_index, tmp_path):
    log = tmp_path / "pip-stderr.txt"
    log.write_text("ERROR: Could not find a version that satisfies the requirement nosuchpkg\n")
    done = refetch(cutting_index["index"], tmp_path / "site", log)
    assert done.returncode == 1 and "names no broken download" in done.stdout
    assert cutting_index["requests"] == []


def test_a_file_of_pypis_is_asked_for_afresh_on_its_file_host_and_on_pypi_org_in_turn():
    path = "packages/56/79/12978b/nvidia_cusparselt_cu12-0.7.1-py3-none-manylinux2014_x86_64.whl"
    assert refetch_wheel.fresh_urls(f"https://files.pythonhosted.org/{path}", 3) == [
        f"https://files.pythonhosted.org/{path}?refetch=1", f"https://pypi.org/{path}?refetch=2",
        f"https://files.pythonhosted.org/{path}?refetch=3"]
    assert refetch_wheel.fresh_urls(f"http://127.0.0.1:8000/files/{WHEEL}", 2) == [
        f"http://127.0.0.1:8000/files/{WHEEL}?refetch=1", f"http://127.0.0.1:8000/files/{WHEEL}?refetch=2"]


def test_the_broken_download_is_read_from_pips_own_message():
    url = "https://files.pythonhosted.org/packages/56/79/1297/nvidia_cusparselt_cu12-0.7.1-py3-none-manylinux2014_x86_64.whl"
    message = ("  WARNING: Attempting to resume incomplete download (195.8 MB/287.2 MB, attempt 20)\n"
               "error: incomplete-download\n\n× Download failed after 21 attempts because not enough bytes were "
               f"received (195.8 MB/287.2 MB)\n╰─> URL: {url}\n\nnote: This is an issue with network connectivity\n")
    assert refetch_wheel.broken_download(message) == (url, None)
    assert refetch_wheel.broken_download(message.replace(url, f"{url}#sha256={'ab' * 32}")) == (url, "ab" * 32)
    assert refetch_wheel.broken_download(f"URL: {url}\nerror: resolution-impossible\n") is None
