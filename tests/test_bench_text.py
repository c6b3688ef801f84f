"""The text workload's benchmarks at tiny sizes (see test_bench.py): the peers bench and the
cost table."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import text_peers
from tests.bench_results import written

pytestmark = pytest.mark.tf
pytest.importorskip("tensorflow", reason="the benches' workers need the tensorflow extra")


def test_text_peers_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The text bench end to end: tfsupervisor with the adaptive wait (closed and open
    loop, memory at both ends) and the compute ceiling, on the demo text model."""
    from bench.harness import server

    monkeypatch.setattr(server, "SETTLE_MAX_S", 1.0)  # CI's cores are never idle
    ran = text_peers.run(["tfsupervisor-adaptive", "ceiling"], 1, 1.0, 0.5, 0.5, [0.5],
                         tmp_path)
    result = written(tmp_path, "text_peers")
    assert result["summary"] == ran["summary"]
    [ours] = ran["rounds"]["tfsupervisor-adaptive"]
    assert ours["failures"] == 0 and ours["rows"] > 0, ours
    assert ours["memory_end"]["largest_mib"] > 0 and ours["open"][0]["failures"] == 0
    [ceiling] = ran["rounds"]["ceiling"]
    assert ceiling["rows"] >= 2 * text_peers.BATCH and ceiling["rows_per_cpu_s"] > 0


def test_text_costs_smoke(tmp_path: Path) -> None:
    """The cost table at its smallest: every (rows, length) measured and written."""
    from bench import text_costs

    ran = text_costs.run((16, 32), (1, 2), 0.01, tmp_path)
    result = written(tmp_path, "text_costs")
    assert set(result["costs"]) == set(ran["costs"]) == {"1x16", "2x16", "1x32", "2x32"}
    assert all(c["ms_per_call"] > 0 and c["ms_per_row"] > 0 for c in ran["costs"].values())
