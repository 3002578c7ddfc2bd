"""`make test`'s grouping (tests/kernel_group.py), checked in a small pytest project of its own run the way
`make test` runs the suite: two xdist processes, `--dist loadgroup`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

KERNEL_TESTS = """
import os, time
import pytest

pytestmark = pytest.mark.kernel


@pytest.mark.parametrize("i", range(4))
def test_kernel(i, request):
    time.sleep(0.3)  # long enough for the other process to take work if the group were split
    with open(os.environ["LOG"], "a") as log:
        log.write(f"{request.node.nodeid} {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


def _project(root: Path, other_tests: str) -> Path:
    """A project whose conftest takes the hooks of tests/kernel_group.py, with four tests under tests/browser/ (a
    path that KERNEL_TESTS lists) and `other_tests` in tests/test_other.py."""
    (root / "tests" / "browser").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    kernel: starts Jupyter kernels\n")
    (root / "tests" / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from kernel_group import pytest_runtest_setup, pytest_xdist_make_scheduler  # noqa: F401\n"
    )
    (root / "tests" / "browser" / "test_kernels.py").write_text(KERNEL_TESTS)
    (root / "tests" / "test_other.py").write_text(other_tests)
    return root / "log"


def _pytest(root: Path, log: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider", "-q", "tests"],
        cwd=root, env={**_environ(), "LOG": str(log)}, capture_output=True, text=True, timeout=300,
    )


def _environ() -> dict[str, str]:
    """This run's environment without pytest's and the kit's variables (an xdist worker's id among them)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GRPO_KIT_"))}


def test_kernel_tests_run_in_one_process_in_collection_order(tmp_path):
    log = _project(tmp_path, "import time\n\n" + "".join(
        f"def test_other_{i}():\n    time.sleep(0.05)\n\n\n" for i in range(8)))
    done = _pytest(tmp_path, log)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = [line.split() for line in log.read_text().splitlines()]
    assert [nodeid for nodeid, _ in rows] == [f"tests/browser/test_kernels.py::test_kernel[{i}]" for i in range(4)]
    assert len({worker for _, worker in rows}) == 1, rows


def test_a_kernel_test_the_rule_misses_fails_before_it_runs(tmp_path):
    log = _project(tmp_path, "import pytest\n\n\n@pytest.mark.kernel\ndef test_starts_a_server():\n"
                             "    raise AssertionError('ran')\n")
    done = _pytest(tmp_path, log)
    assert done.returncode != 0
    assert "tests/test_other.py::test_starts_a_server is marked kernel but" in done.stdout + done.stderr
    assert "4 passed, 1 error" in done.stdout and "AssertionError: ran" not in done.stdout
