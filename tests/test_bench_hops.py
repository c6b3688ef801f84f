"""The per-hop profile and the peers bench at tiny sizes (see test_bench.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_results import written

pytestmark = pytest.mark.tf
pytest.importorskip("tensorflow", reason="the benches' workers need the tensorflow extra")


def test_hops_smoke(tmp_path: Path, models_dir: Path) -> None:
    from bench import hops

    hops.run(1.0, 30, 1.0, tmp_path, model=models_dir / "demo_sm")
    result = written(tmp_path, "hops")
    loaded = result["under_load"]
    assert loaded["batches"] > 0 and loaded["failures"] == 0  # type: ignore[index]
    assert all(v["call"] > 0 for v in result["worker_path_us"].values())  # type: ignore[union-attr]


def test_peers_smoke(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, models_dir: Path) -> None:
    """tfsupervisor alone: the peers are an optional extra."""
    from bench import peers

    monkeypatch.setattr(peers, "SETTLE_MAX_S", 1.0)  # CI's cores are never idle
    ran = peers.run(1.0, 1, ["tfsupervisor"], tmp_path, warmup=0.5,
                    model=models_dir / "demo_sm")
    written(tmp_path, "peers")
    assert ran["servers"]["tfsupervisor"]["failures"] == 0
    assert ran["servers"]["tfsupervisor"]["req_s_mean"] > 0
    assert ran["rounds"]["tfsupervisor"][0]["machine_busy_before_pct"] >= 0
