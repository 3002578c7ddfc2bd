"""Tests that start Jupyter kernels run in one pytest-xdist process, in collection order (`make test` runs
`-n logical --dist loadgroup`): the notebooks, because a later one loads an earlier one's checkpoint from `runs/` (as
on a user's machine) and would otherwise rebuild it while the earlier one still writes it; and the tests marked
`kernel` (a Jupyter server, a notebook client), so that no two kernels start at once.

The group is decided on the controller from the test's id (`starts_kernels`), through xdist's scheduler hook. An
`xdist_group` marker is not enough: xdist appends the group to `item._nodeid`, which pytest 9.2 no longer reads
(pytest-xdist issue 1386, open), so marked tests spread over both processes, and notebook 06 would rebuild notebook
05's checkpoint while 05 still trains into the same folder. A test marked `kernel` whose id the rule misses fails
before it runs."""

from __future__ import annotations

from typing import Any

import pytest

KERNEL_GROUP = "kernels"
KERNEL_TESTS = (
    "tests/browser/",
    "tests/test_notebooks.py::test_the_setup_notebook_shows_no_hub_token",
)
"""Ids (or their beginnings) of the tests marked `kernel`; notebooks (`.ipynb`) belong to the group anyway."""


def starts_kernels(nodeid: str) -> bool:
    """Whether the test with this id starts Jupyter kernels: a notebook run by nbmake, or one of KERNEL_TESTS."""
    return nodeid.split("::", 1)[0].endswith(".ipynb") or nodeid.startswith(KERNEL_TESTS)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Fail a test marked `kernel` that `starts_kernels` does not recognise, before it runs: it would run beside the
    notebooks."""
    if item.get_closest_marker("kernel") and not starts_kernels(item.nodeid):
        pytest.fail(
            f"{item.nodeid} is marked kernel but tests/kernel_group.py's KERNEL_TESTS does not list it: add its id "
            "there so that it runs in the notebooks' test process",
            pytrace=False,
        )


@pytest.hookimpl(optionalhook=True)  # an xdist hook: pytest without xdist runs the tests too
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under `--dist loadgroup`: xdist's scope scheduling with every kernel-starting test in one scope (one process,
    in collection order) and each other test on its own."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class KernelsInOneProcess(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return KERNEL_GROUP if starts_kernels(nodeid) else nodeid

    return KernelsInOneProcess(config, log)
