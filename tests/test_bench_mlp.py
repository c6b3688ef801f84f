"""The MLP benchmarks at tiny sizes (see test_bench.py): throughput against the peers, and
latency around recycles."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_results import written

pytestmark = pytest.mark.tf
pytest.importorskip("tensorflow", reason="the benches' workers need the tensorflow extra")


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import mlp

    monkeypatch.setattr(mlp, "WORKERS", 1)  # every path still runs; half the TF processes
    monkeypatch.setattr(mlp, "WARM_SECONDS", 0.5)


def test_mlp_throughput_smoke(tmp_path: Path, small: None, models_dir: Path) -> None:
    from bench import mlp

    mlp.throughput(models_dir / "demo_sm", 0.5, tmp_path)
    result = written(tmp_path, "mlp_throughput")
    assert set(result["results"]) == {  # type: ignore[arg-type]
        "tfsupervisor, batching", "tfsupervisor, no batching",
        "in-process loop, 1 request per call", "gunicorn sync x1, max_requests 1000"}


def test_recycle_under_load_smoke(tmp_path: Path, small: None, models_dir: Path) -> None:
    from bench import mlp

    ran = mlp.recycle_under_load(models_dir / "demo_sm", 1.0, tmp_path)
    # (NaN where no recycle fell within the run: compared by name, not by value)
    assert set(written(tmp_path, "recycle_under_load")["results"]) == set(ran["results"])
    assert all(row["failures"] == 0 for row in ran["results"].values()), ran
