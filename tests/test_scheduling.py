"""`make test`'s grouping (tests/scheduling.py), checked in a small pytest project of its own run the way
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


OTHER_TESTS = "import time\n\n" + "".join(f"def test_other_{i}():\n    time.sleep(0.05)\n\n\n" for i in range(8))
"""Eight short tests outside every group, for the other process to take."""

SHARED_FIXTURE_TESTS = """
import os, time
import pytest


@pytest.fixture(scope="module")
def costly():
    with open(os.environ["LOG"], "a") as log:
        log.write(f"computed {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.parametrize("i", range(2))
def test_first(i, costly):
    time.sleep(0.3)


def test_second(costly):
    time.sleep(0.3)
"""


def _project(root: Path, other_tests: str, *, shared: str = "") -> Path:
    """A project whose conftest takes the hooks of tests/scheduling.py, with four tests under tests/browser/ (a
    path that KERNEL_TESTS lists), `other_tests` in tests/test_other.py and, with `shared` (the ids listed under the
    fixture `costly`, comma-separated), three tests that share the module fixture `costly` in tests/test_shared.py."""
    (root / "tests" / "browser").mkdir(parents=True)
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    kernel: starts Jupyter kernels\n")
    (root / "tests" / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "import scheduling\n"
        "from scheduling import pytest_runtest_setup, pytest_xdist_make_scheduler  # noqa: F401\n"
        f"scheduling.SHARED_FIXTURE_TESTS = {{'costly': tuple({shared!r}.split(','))}}\n"
    )
    if shared:
        (root / "tests" / "test_shared.py").write_text(SHARED_FIXTURE_TESTS)
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
    log = _project(tmp_path, OTHER_TESTS)
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


def test_tests_sharing_a_listed_module_fixture_run_in_one_process_and_compute_it_once(tmp_path):
    """Without the rule the three tests spread over both processes and `costly` is computed in each."""
    log = _project(tmp_path, OTHER_TESTS, shared="tests/test_shared.py::test_first,tests/test_shared.py::test_second")
    done = _pytest(tmp_path, log)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    computed = [line for line in log.read_text().splitlines() if line.startswith("computed")]
    assert len(computed) == 1, computed
    assert "15 passed" in done.stdout, done.stdout[-500:]


def test_a_test_using_a_listed_fixture_without_its_id_fails_before_it_runs(tmp_path):
    log = _project(tmp_path, "def test_alone():\n    pass\n", shared="tests/test_shared.py::test_first")
    done = _pytest(tmp_path, log)
    assert done.returncode != 0
    assert ("tests/test_shared.py::test_second uses the fixture costly but tests/scheduling.py's "
            "SHARED_FIXTURE_TESTS does not list it") in done.stdout + done.stderr
    assert "7 passed, 1 error" in done.stdout, done.stdout[-500:]
