"""The bench harness's pure parts (bench/harness): percentiles, the open loop's Poisson
schedule, the HTTP bodies, how load is spread, and variants named by their behaviour."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from bench.common import percentiles
from bench.harness.load import Load, Tally, schedule
from bench.harness.transport import Http, json_codec, oip_codec, raw_codec
from bench.harness.workload import Variant


def test_percentiles_in_milliseconds_and_none_without_latencies() -> None:
    latencies = [i / 1000 for i in range(1, 101)]  # 1 .. 100 ms
    assert percentiles(latencies) == {"p50_ms": 50.5, "p99_ms": 99.01, "mean_ms": 50.5}
    assert percentiles(latencies, (50, 99.9), digits=1, mean=False) == {
        "p50_ms": 50.5, "p99.9_ms": 99.9}
    assert percentiles([]) == {"p50_ms": None, "p99_ms": None, "mean_ms": None}
    assert percentiles([], (99.9,), mean=False) == {"p99.9_ms": None}


def test_schedule_is_poisson_at_the_rate_within_the_window() -> None:
    rng = np.random.default_rng(3)
    counts = [len(schedule(200.0, 5.0, rng)) for _ in range(200)]
    assert abs(np.mean(counts) - 1000) < 15  # the mean count is rate x seconds
    assert 0.5 < np.var(counts) / np.mean(counts) < 1.5  # a Poisson count: variance = mean
    sends = schedule(200.0, 5.0, np.random.default_rng(4))
    assert np.all(np.diff(sends) > 0) and sends[0] > 0 and sends[-1] < 5.0
    gaps = np.diff(sends)
    assert math.isclose(np.mean(gaps), 1 / 200, rel_tol=0.1)  # exponential gaps
    assert math.isclose(np.std(gaps), np.mean(gaps), rel_tol=0.15)
    again = schedule(200.0, 5.0, np.random.default_rng(4))
    assert np.array_equal(sends, again)  # the same seed, the same schedule for every server


def test_tally_merges_client_processes() -> None:
    tally = Tally()
    tally.add(0.01)
    tally.add(None)
    tally.merge([0.02, 0.03], [1.0, 2.0], 2, 0.5)
    assert tally.latencies == [0.01, 0.02, 0.03] and len(tally.ends) == 3
    assert tally.failures == 3 and tally.cpu == 0.5


@pytest.mark.parametrize(("clients", "processes", "spread"),
                         [(32, 4, (4, 8)), (1, 4, (1, 1)), (6, 4, (4, 1)), (0, 4, (1, 1))])
def test_load_spreads_clients_over_processes(clients: int, processes: int,
                                             spread: tuple[int, int]) -> None:
    load = Load(Http(1, "/", raw_codec()), lambda seed: iter(()), lambda values: None,
                clients, processes)
    assert load.spread == spread


def test_http_bodies() -> None:
    ids = np.array([[5, 6, 7]], np.int32)
    raw = raw_codec()
    assert raw.encode({"input_ids": ids}) == ids.tobytes()
    assert raw.decode(np.arange(3, dtype=np.float32).tobytes()).tolist() == [0.0, 1.0, 2.0]
    rows = json_codec("input_ids", "pooled")
    assert json.loads(rows.encode({"input_ids": ids})) == {"input_ids": [5, 6, 7]}
    assert rows.decode(b'{"pooled": [0.5, 1.5]}').tolist() == [0.5, 1.5]
    assert json_codec("features", "probability").decode(b'{"probability": 0.25}').size == 1
    oip = oip_codec("pooled")
    assert json.loads(oip.encode({"input_ids": ids, "x": np.ones((1, 2), np.float32)})) == {
        "inputs": [{"name": "input_ids", "shape": [1, 3], "datatype": "INT32",
                    "data": [5, 6, 7]},
                   {"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1.0, 1.0]}]}
    answer = {"model_name": "text", "outputs": [
        {"name": "other", "shape": [1], "datatype": "FP32", "data": [9.0]},
        {"name": "pooled", "shape": [1, 2], "datatype": "FP32", "data": [0.5, 1.5]}]}
    assert oip.decode(json.dumps(answer).encode()).tolist() == [0.5, 1.5]


def test_variants_carry_their_behaviour_not_their_name() -> None:
    """The same behaviour in both peer benches, read from fields, never from a name."""
    from bench import peers, text_peers

    for bench in (peers, text_peers):
        adaptive = bench.PEERS["tfsupervisor-adaptive"]
        assert adaptive.adaptive and adaptive.server == "tfsupervisor"
        http = bench.PEERS["tfsupervisor-http"]
        assert (http.front, http.body, http.adaptive) == ("http", "oip", False)
        assert not bench.PEERS["tfsupervisor"].adaptive
        mosec = bench.PEERS["mosec-oip"]  # the very requests tfsupervisor-http gets
        assert (mosec.server, mosec.body) == ("script", http.body)
    assert peers.PEERS["tfsupervisor-nowait"].wait(5.0) == 0.0
    assert peers.PEERS["tfsupervisor"].wait(5.0) == 5.0
    renamed = Variant("whatever-adaptive", "a name says nothing")
    assert not renamed.adaptive and renamed.wait(3.0) == 3.0
    also = peers.variant("tfsupervisor-adaptive@2")
    try:
        assert also.wait(5.0) == 2.0 and not also.adaptive
    finally:
        del peers.PEERS[also.name]
