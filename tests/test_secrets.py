"""A token never leaks: a stand-in Hugging Face Hub on 127.0.0.1 refuses every request (401, 403 or 500) with an
error page that echoes the token it was sent, as misconfigured proxies and some servers do. Model downloads and
uploads through the command line then fail, and the token appears in no output, log, metrics row, checkpoint or
exported file."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

SENTINEL = "hf_SENTINEL_9f8e7d6c5b4a"


class _EchoingHub(http.server.BaseHTTPRequestHandler):
    status = 401

    def _refuse(self) -> None:
        sent = self.headers.get("Authorization", "")
        body = json.dumps({"error": f"Invalid credentials in Authorization header: {sent}"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Error-Message", f"token {sent} refused")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        type(self).seen.append(sent)

    do_GET = do_POST = do_HEAD = do_PUT = _refuse

    def log_message(self, *args) -> None:  # quiet
        pass


@pytest.fixture(params=[401, 403, 500])
def hub(request):
    handler = type("Hub", (_EchoingHub,), {"status": request.param, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", handler
    server.shutdown()


def _cli(args: list[str], endpoint: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "KAGGLE_"))}
    env.update(HF_ENDPOINT=endpoint, HF_TOKEN=SENTINEL, HF_HUB_DISABLE_TELEMETRY="1", HF_HOME=str(cwd / "hf-home"),
               HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
    return subprocess.run([sys.executable, "-m", "grpo_kit.cli", *args], capture_output=True, text=True, timeout=600,
                          env=env, cwd=cwd)


def _files_holding(root: Path, secret: str) -> list[str]:
    return [str(p) for p in root.rglob("*") if p.is_file() and secret.encode() in p.read_bytes()]


def test_a_refused_download_and_a_refused_push_never_show_the_token(hub, tmp_path):
    endpoint, handler = hub
    settings = tmp_path / "settings.yaml"
    settings.write_text(f"model: {{hf_token: {SENTINEL}}}\ngrpo: {{steps: 2, save_every: 1}}\ntask: {{num_test: 4}}\n")
    runs = []

    # a gated model from the stand-in hub: refused, with the token echoed back in the error page
    runs.append(
        _cli(
            ["train", "--preset", "cpu-tiny-quick", "--model", "google/gemma-3-1b-it", "--config", str(settings),
             "--output-dir", str(tmp_path / "refused"), "--device", "cpu", "--quiet"],
            endpoint,
            tmp_path,
        )
    )
    assert runs[-1].returncode == 2, runs[-1].stderr[-2000:]
    assert "cannot load 'google/gemma-3-1b-it'" in runs[-1].stderr
    # … and explained by what the hub answered, also where huggingface_hub wraps the answer as "not in the cache"
    because = {401: "rejected the token (401)", 403: "the token in use has no access to google/gemma-3-1b-it",
               500: "the Hugging Face Hub answered 500 (a server error)"}[handler.status]
    assert because in runs[-1].stderr, runs[-1].stderr[-2000:]

    # a run that trains (the tiny Gemma, the token in its settings), then an export pushed to the stand-in hub
    runs.append(_cli(["train", "--preset", "cpu-tiny-quick", "--config", str(settings), "--output-dir",
                      str(tmp_path / "run"), "--device", "cpu", "--quiet"], endpoint, tmp_path))
    assert runs[-1].returncode == 0, runs[-1].stderr[-2000:]
    runs.append(_cli(["export", "--preset", "cpu-tiny-quick", "--config", str(settings), "--checkpoint",
                      str(tmp_path / "run" / "checkpoint"), "--out", str(tmp_path / "export"), "--push-to", "me/tiny",
                      "--device", "cpu", "--quiet"], endpoint, tmp_path))
    assert runs[-1].returncode == 2 and "push to me/tiny failed" in runs[-1].stderr, runs[-1].stderr[-2000:]
    because = "the token needs write access" if handler.status < 500 else "answered 500 (a server error)"
    assert because in runs[-1].stderr, runs[-1].stderr[-2000:]

    assert any(SENTINEL in seen for seen in handler.seen), "the stand-in hub was never sent the token"
    leaks = [r.args for r in runs if SENTINEL in r.stdout + r.stderr]
    assert not leaks, f"the token was printed by {leaks}"
    assert (tmp_path / "run" / "metrics.jsonl").read_text() and (tmp_path / "export" / "config.json").exists()
    for folder in ("refused", "run", "export"):
        assert not _files_holding(tmp_path / folder, SENTINEL), folder
