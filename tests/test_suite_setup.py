"""What the suite's own set-up promises: tests marked with an ``xdist_group`` share one worker.

The verifier's corpus, the fuzz runner and the int8 cases' converted models are built once per worker
that reads them (docs/testing.md); that is once per run only while ``--dist loadgroup`` groups.
"""

from __future__ import annotations

import pytest


@pytest.mark.xdist_group("suite_setup")
def test_a_test_in_an_xdist_group_is_scheduled_with_its_group(request: pytest.FixtureRequest) -> None:
    if not request.config.getoption("loadgroup", False):  # what pytest-xdist tells its workers
        pytest.skip("not run with pytest-xdist's --dist loadgroup (make test runs it so)")
    # xdist puts a grouped test's group after its id; the scheduler sends every id of a group to one worker
    assert request.node.nodeid.endswith("@suite_setup"), request.node.nodeid
