"""The leak benchmarks at tiny sizes (see test_bench.py): the probes on one reproduced leak,
and the bound a recycled retracing leak keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_results import written

pytestmark = pytest.mark.tf
pytest.importorskip("tensorflow", reason="the benches' workers need the tensorflow extra")


def test_leak_probes_smoke(tmp_path: Path) -> None:
    from bench import leak_probes

    leak_probes.run(0.01, ["d_native_leak"], tmp_path)
    [case] = written(tmp_path, "leak_probes")["results"]  # type: ignore[misc]
    assert case["jobs"] == 40 and case["exit_code"] == 0
    assert case["traced"] == [["forward", 1]]


def test_leak_bound_smoke(tmp_path: Path) -> None:
    from bench import leak_bound

    leak_bound.run(2.0, tmp_path, quick=True)
    written(tmp_path, "leak_bound")
    assert (tmp_path / "leak_bound.png").stat().st_size > 10_000
