"""Padding of variable-length dimensions without TensorFlow: the shared definition, the
settings, the supervisor's batching key and the worker's padded batch, with hostile input."""

from __future__ import annotations

import dataclasses
import json
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.config.keys import BatchPolicy
from supervisor.config.loading import parse_config
from supervisor.config.settings import ConfigErrors
from supervisor.config.worker_spec import SpawnError, WorkerSpec, build_spec
from supervisor.core.batching import take_batch
from supervisor.core.jobs import Job
from supervisor.core.router import Router
from supervisor.shared.padding import PadDim, batch_key, batch_keys, cut, fits_dtype, lengths, pad
from supervisor.shared.protocol import RESULT, ProtocolError, TensorSpec, pack_arrays, unpack_arrays
from tests.test_batching import batch_message, replies_by_id
from worker.batch import run_batch
from worker.runners import LoadError, Runner
from worker.warmup import check_padding, shapes, verify, warm

SEQ = PadDim("seq", {"ids": 1, "mask": 1}, (4, 8, 16), 0.0, {"states": 1}, None, None, True)


def spec(name: str, *shape: int, dtype: str = "int32") -> TensorSpec:
    return TensorSpec(name, dtype, tuple(shape))


# --- the definition --------------------------------------------------------------------------

def test_lengths_and_buckets() -> None:
    assert lengths([spec("ids", 2, 5), spec("mask", 2, 5)], [SEQ]) == {"seq": 5}
    assert SEQ.bucket(5) == 8 and SEQ.bucket(4) == 4 and SEQ.bucket(1) == 4
    assert lengths([spec("other", 1, 3)], [SEQ]) == {}  # no padded input: nothing to pad


@pytest.mark.parametrize(("specs", "message"), [
    ([spec("ids", 1, 5), spec("mask", 1, 6)], "disagree on 'seq'"),
    ([spec("ids", 1, 17)], "more than the largest size"),
    ([spec("ids", 3)], "needs an axis 1"),
    ([spec("ids")], "needs an axis 1"),
])
def test_hostile_lengths_are_bad_requests(specs: list[TensorSpec], message: str) -> None:
    with pytest.raises(ProtocolError, match=message) as raised:
        lengths(specs, [SEQ])
    assert raised.value.code == "bad_request"


def test_batch_key_counts_padded_axes_at_their_bucket() -> None:
    def key(n: int) -> Any:
        return batch_key([spec("ids", 1, n), spec("mask", 1, n), spec("x", 1, 3, 7)], [SEQ])

    assert key(5) == key(8) != key(9)
    assert key(5)[0] == ("ids", "int32", (8,))
    assert key(5)[2] == ("x", "int32", (3, 7))  # an input the dimension does not name
    exact = dataclasses.replace(SEQ, pads=False)  # changes_outputs: equal lengths only
    assert batch_key([spec("ids", 1, 5)], [exact]) != batch_key([spec("ids", 1, 6)], [exact])


def test_pad_generates_and_cut_gives_back() -> None:
    dim = dataclasses.replace(SEQ, mask_input="made_mask", length_input="made_len")
    ids = np.arange(1, 11, dtype=np.int64).reshape(2, 5)
    out = pad({"ids": ids}, [dim], {"seq": 8}, {"made_len": "int64"})
    assert out["ids"].shape == (2, 8) and out["ids"].dtype == np.int64
    assert (out["ids"][:, 5:] == 0).all() and (out["ids"][:, :5] == ids).all()
    assert out["made_mask"].tolist() == [[1] * 5 + [0] * 3] * 2
    assert out["made_len"].tolist() == [5, 5] and out["made_len"].dtype == np.int64
    states = np.zeros((2, 8, 3), np.float32)
    assert cut({"states": states, "y": np.ones(2)}, [dim], {"seq": 5}, {"seq": 8})[
        "states"].shape == (2, 5, 3)
    with pytest.raises(ValueError, match="follows the padded length 8"):
        cut({"states": np.zeros((2, 7, 3))}, [dim], {"seq": 5}, {"seq": 8})


@pytest.mark.parametrize(("value", "dtype", "fits"), [
    (0, "int32", True), (-1, "int32", True), (1.5, "int32", False), (-1, "uint8", False),
    (300, "uint8", False), (2**31, "int32", False), (0.25, "float32", True), (1, "bool", True),
    (2, "bool", False), (0, "not-a-dtype", False), (0.1, "float32", False),
    (0.1, "float64", True), (1e300, "float32", False), (-0.0, "float16", True),
])
def test_pad_values_must_fit_the_dtype(value: float, dtype: str, fits: bool) -> None:
    assert fits_dtype(value, dtype) is fits


# --- settings ------------------------------------------------------------------------------

def config(padding: Any, **model: Any) -> str:
    return json.dumps({"models": {"enc": {"handler": "m:f", "padding": padding, **model}}})


@pytest.mark.parametrize(("padding", "path"), [
    ({"seq": {"inputs": {"ids": 0}, "sizes": [8]}}, "models.enc.padding.seq.inputs.ids"),
    ({"seq": {"inputs": {"ids": "1"}, "sizes": [8]}}, "models.enc.padding.seq.inputs.ids"),
    ({"seq": {"inputs": ["ids"], "sizes": [8]}}, "models.enc.padding.seq.inputs"),
    ({"seq": {"inputs": {}, "sizes": [8]}}, "models.enc.padding.seq.inputs"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": []}}, "models.enc.padding.seq.sizes"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [8, 8]}}, "models.enc.padding.seq.sizes"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [0]}}, "models.enc.padding.seq.sizes[0]"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [8], "value": float("nan")}},
     "models.enc.padding.seq.value"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [8], "value": "0"}}, "models.enc.padding.seq.value"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [8], "mask_input": "ids"}},
     "models.enc.padding.seq"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [8], "mask_input": "m", "length_input": "m"}},
     "models.enc.padding.seq"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [8], "typo": 1}}, "models.enc.padding.seq.typo"),
    ({"a": {"inputs": {"ids": 1}, "sizes": [8]}, "b": {"inputs": {"ids": 1}, "sizes": [4]}},
     "models.enc.padding.b.inputs.ids"),
    ({"a": {"inputs": {"ids": 1}, "sizes": [8], "mask_input": "m"},
      "b": {"inputs": {"m": 2}, "sizes": [4]}}, "models.enc.padding.a"),
    ("seq", "models.enc.padding"),
    ({"a": {"inputs": {"x": 1}, "sizes": [8], "mask_input": "m"},
      "b": {"inputs": {"y": 1}, "sizes": [4], "mask_input": "m"}}, "models.enc.padding.b"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [10**12]}}, "models.enc.padding.seq.sizes[0]"),
    # past the protocol's 8 dimensions: no array could have that axis
    ({"seq": {"inputs": {"ids": 8}, "sizes": [8]}}, "models.enc.padding.seq.inputs.ids"),
    ({"seq": {"inputs": {"ids": 1}, "sizes": [8], "outputs": {"t": 9}}},
     "models.enc.padding.seq.outputs.t"),
    ({"a": {"inputs": {"x": 1}, "sizes": list(range(1, 20))},
      "b": {"inputs": {"y": 1}, "sizes": list(range(1, 20))}}, "models.enc.padding"),
])
def test_padding_settings_are_validated_with_their_path(padding: Any, path: str) -> None:
    with pytest.raises(ConfigErrors) as raised:
        parse_config(config(padding).replace("NaN", ".nan"), Path("/tmp/c.yaml"))
    assert path in [e.path for e in raised.value.errors], raised.value


def test_warmup_batch_sizes_are_validated() -> None:
    for bad in ([], [0], ["1"], 4, [64]):  # 64: more than max_batch_size (32)
        with pytest.raises(ConfigErrors) as raised:
            parse_config(config({}, warmup_batch_sizes=bad), Path("/tmp/c.yaml"))
        assert raised.value.errors[0].path.startswith("models.enc.warmup_batch_sizes")


def worker_spec(**model: Any) -> WorkerSpec:
    cfg = parse_config(config({"seq": {"inputs": {"ids": 1}, "sizes": [16, 8]}}, **model),
                       Path("/tmp/c.yaml"))
    return build_spec(cfg, "enc", "enc-1", 1, "json", "ab" * 16)


def test_the_spec_carries_padding_and_the_worker_reads_the_same() -> None:
    spec = WorkerSpec.from_env(worker_spec(warmup_batch_sizes=[1, 4]).to_env())
    (dim,) = spec.pad_dims()
    assert dim.sizes == (8, 16) and dim.inputs == {"ids": 1} and dim.pads and dim.verify
    assert spec.warmup_batch_sizes == [1, 4]


@pytest.mark.parametrize("padding", [
    {"seq": {"inputs": {"ids": 1}, "sizes": "8"}},
    {"seq": {"inputs": {"ids": -1}}},
    {"seq": {"inputs": {"ids": 1}, "bogus": True}},
    [],
])
def test_a_hostile_spec_padding_is_refused(padding: Any) -> None:
    raw = json.loads(worker_spec().to_env())
    raw["padding"] = padding
    with pytest.raises(SpawnError, match="padding"):
        WorkerSpec.from_env(json.dumps(raw))


def test_a_hostile_spec_warmup_is_refused() -> None:
    raw = json.loads(worker_spec().to_env())
    for bad in ([1, 10**30], [True], [], "1", [1.5]):
        raw["warmup_batch_sizes"] = bad
        with pytest.raises(SpawnError, match="warmup_batch_sizes"):
            WorkerSpec.from_env(json.dumps(raw))


# --- the supervisor's batching -------------------------------------------------------------

def job(i: int, length: int, dims: tuple[PadDim, ...] = (SEQ,), rows: int = 1,
        width: int = 1) -> Job:
    specs, frames = pack_arrays({"ids": np.ones((rows, length), np.int32),
                                 "extra": np.ones((rows, width), np.float32)})
    key, joins = batch_keys([TensorSpec.from_wire(s) for s in specs], dims)
    return Job(i, "m", [], str(i).encode(), specs, frames, received_at=0.0, key=key,
               joins=joins, rows=rows)


def test_mixed_lengths_of_one_bucket_share_a_batch() -> None:
    queue = deque([job(0, 5), job(1, 16), job(2, 8), job(3, 6), job(9, 3, width=2), job(4, 3)])
    policy = BatchPolicy.from_config(8, 0.0, None)
    # 0, 2 and 3 padded to 8 make 3 rows, sent as 4: the fourth is job 4's, padded up from
    # its bucket of 4 rather than a copy of a row (job 9's other input does not match)
    assert [j.id for j in take_batch(queue, policy, 0.0)] == [0, 2, 3, 4]
    assert [j.id for j in take_batch(queue, policy, 0.0)] == [1]
    assert [j.id for j in take_batch(queue, policy, 0.0)] == [9]


def test_jobs_admitted_under_other_padding_settings_never_ride() -> None:
    """After a reload that regroups the padded axes, jobs of both settings share the queue:
    comparing their buckets across dimensions raised on every dispatch, stalling the model."""
    one = PadDim("seq", {"ids": 1, "extra": 1}, (4, 8, 16), 0.0, {}, None, None, True)
    two = (dataclasses.replace(one, inputs={"ids": 1}),
           dataclasses.replace(one, name="seq2", inputs={"extra": 1}))
    old = [job(i, 16, (one,), width=16) for i in range(3)]
    queue = deque([*old, job(3, 4, two, width=4)])
    policy = BatchPolicy.from_config(8, 0.0, None)
    assert [j.id for j in take_batch(queue, policy, 0.0)] == [0, 1, 2]
    assert [j.id for j in take_batch(queue, policy, 0.0)] == [3]


def test_a_batching_failure_answers_the_head_and_never_stalls_the_model(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the defect (a reload once made comparing two queued jobs raise), the job at
    the head is answered internal and the others are dispatched, not retried forever."""
    import supervisor.core.router as router_module
    from supervisor.core.actions import Reply

    real = router_module.take_batch

    def broken_once(queue: Any, policy: Any, now: float) -> list[Job]:
        if queue[0].id == 0:
            raise ValueError("zip() argument 2 is shorter than argument 1")
        return real(queue, policy, now)

    monkeypatch.setattr(router_module, "take_batch", broken_once)
    outbox: list[Any] = []
    router = Router(outbox, max_queue=100)
    for j in (job(0, 8), job(1, 8), job(2, 3)):
        router.submit(j)
    sent = router.dispatch("m", [("w1", 0), ("w2", 0)], 0.0, BatchPolicy.from_config(8, 0, None))
    replies = [a for a in outbox if isinstance(a, Reply)]
    assert [r.job.id for r in replies if r.job] == [0]
    assert replies[0].msg.header["code"] == "internal"
    assert sent == 1 and router.held_by("w2")[0].id == 1  # the next worker served on
    assert router.queued("m") == 1 and router.pending() == 2  # job 2 waits its turn


def test_tune_counts_a_batchs_own_rows_not_its_riders() -> None:
    """Riders only fill the batch sizes already allowed: counted, they would make `tune`
    approve whatever sizes are configured."""
    router = Router([], max_queue=100)
    for j in (job(0, 8), job(1, 8), job(2, 8), job(3, 3)):
        router.submit(j)
    router.dispatch("m", [("w", 0)], 0.0, BatchPolicy.from_config(8, 0.0, None))
    assert router.batch_rows["m"] == {3: 1}  # 3 rows of 8 long, sent as 4 with a rider
    assert router.batches["m"] == (1, 4, 4)  # batches, rows, rows computed


def test_shorter_jobs_never_ride_where_lengths_do_not_pad() -> None:
    fixed = dataclasses.replace(SEQ, pads=False)
    queue = deque([job(0, 8, (fixed,)), job(1, 5, (fixed,))])
    policy = BatchPolicy.from_config(8, 0.0, None)
    assert [j.id for j in take_batch(queue, policy, 0.0)] == [0]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 16), st.integers(1, 3), st.integers(1, 2)),
                min_size=1, max_size=24),
       st.integers(1, 8), st.sets(st.integers(1, 7), max_size=3))
def test_every_batch_is_one_padded_shape_and_no_job_is_lost(
        shapes: list[tuple[int, int, int]], most: int, sizes: set[int]) -> None:
    """Batches taken until the queue is empty: each job in exactly one; a batch's jobs share
    the layout, none with a bucket past its head's; its head's own bucket fills it first,
    and the shorter riders only take rows it would have been padded with."""
    jobs = [job(i, n, rows=r, width=w) for i, (n, r, w) in enumerate(shapes)]
    policy = BatchPolicy.from_config(most, 0.0, tuple({*sizes, most}) if sizes else None)
    queue, seen = deque(jobs), []
    while queue:
        batch = take_batch(queue, policy, 0.0)
        assert batch, "a queue of due jobs gives a batch"
        seen += [j.id for j in batch]
        head, rest = batch[0], batch[1:]
        own = [j for j in batch if j.key == head.key]
        riders = [j for j in batch if j.key != head.key]
        assert rest == own[1:] + riders  # its own bucket first, in order
        rows = sum(j.rows or 1 for j in own)
        for rider in riders:
            assert head.joins and rider.joins and rider.joins.fits_under(head.joins)
            assert (rider.joins.layout, rider.joins.dims) == (head.joins.layout,
                                                              head.joins.dims)
            assert rider.joins.buckets < head.joins.buckets
        if len(batch) > 1:
            assert sum(j.rows or 1 for j in batch) <= policy.pad_to(rows) <= most
    assert sorted(seen) == list(range(len(jobs)))


# --- the worker's padded batch -------------------------------------------------------------

class MaskedSum:
    """Sums each row's ids where the mask says real, and returns the per-token ids doubled:
    padding leaves both alone. Records the shapes it is called with."""

    inputs = [TensorSpec("ids", "int32", (None, None)), TensorSpec("mask", "int32", (None, None))]

    def __init__(self, masked: bool = True) -> None:
        self.masked = masked
        self.seen: list[tuple[int, ...]] = []

    def __call__(self, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        ids, mask = inputs["ids"], inputs["mask"]
        self.seen.append(ids.shape)
        weights = mask if self.masked else np.ones_like(mask)
        return {"total": (ids * weights).sum(axis=1), "states": ids * 2,
                "mean": (ids * weights).sum(axis=1) / weights.sum(axis=1)}


MASKED = dataclasses.replace(SEQ, inputs={"ids": 1}, mask_input="mask")


def runner(model: MaskedSum, dim: PadDim = MASKED) -> Runner:
    made = Runner(model, model.inputs, None)
    made.padding = (dim,)
    return made


def results(replies: list[Any]) -> dict[bytes, Any]:
    return {r.job_id: unpack_arrays(r.header["outputs"], r.arrays) if r.kind == RESULT
            else r.header["code"] for r in replies}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 16), min_size=1, max_size=6), st.integers(0, 2**16))
def test_each_job_gets_its_unpadded_outputs(job_lengths: list[int], seed: int) -> None:
    rng = np.random.default_rng(seed)
    model = MaskedSum()
    jobs = [{"ids": rng.integers(1, 100, (1, n)).astype(np.int32)} for n in job_lengths]
    same_bucket = [j for j in jobs if MASKED.bucket(j["ids"].shape[1]) ==
                   MASKED.bucket(jobs[0]["ids"].shape[1])]
    got = results(run_batch(runner(model), batch_message(jobs, pad_to=len(jobs))))
    for i, arrays in enumerate(jobs):
        ids = arrays["ids"]
        out = got[str(i).encode()]
        assert out["total"].tolist() == [int(ids.sum())]
        assert out["states"].tolist() == (ids * 2).tolist()  # cut back to its own length
    assert len(model.seen) == 1 and model.seen[0][1] == max(
        MASKED.bucket(j["ids"].shape[1]) for j in jobs)
    assert same_bucket  # (the supervisor sends one bucket per batch; the worker copes anyway)


def test_a_bad_job_in_a_padded_batch_is_answered_alone() -> None:
    model = MaskedSum()
    parts = [{"ids": np.ones((1, 3), np.int32)}, {"ids": np.ones((1, 2, 2), np.int32)}]
    got = results(run_batch(runner(model), batch_message(parts, pad_to=4)))
    assert got[b"1"] == "bad_request"
    assert got[b"0"]["total"].tolist() == [3]


def test_a_worker_serves_what_a_newer_admission_admitted() -> None:
    # After a reload that raised the largest size, the old worker (older settings) still
    # serves the longer jobs admission now takes, unpadded, with exact outputs.
    model = MaskedSum()
    parts = [{"ids": np.ones((1, 3), np.int32)}, {"ids": np.ones((1, 40), np.int32)}]
    got = results(run_batch(runner(model), batch_message(parts, pad_to=2)))
    assert got[b"0"]["total"].tolist() == [3] and got[b"1"]["total"].tolist() == [40]
    assert got[b"1"]["states"].shape == (1, 40)
    assert model.seen == [(2, 40)]


def test_without_padding_a_changing_model_batches_only_equal_lengths() -> None:
    model = MaskedSum()
    exact = dataclasses.replace(MASKED, pads=False)
    parts = [{"ids": np.ones((1, 3), np.int32)}, {"ids": np.ones((1, 5), np.int32)}]
    got = results(run_batch(runner(model, exact), batch_message(parts, pad_to=2)))
    assert [got[k]["total"].tolist() for k in (b"0", b"1")] == [[3], [5]]
    assert sorted(shape[1] for shape in model.seen[-2:]) == [3, 5]  # each alone, unpadded


# --- the worker's load checks and warm-up --------------------------------------------------

def test_warmup_runs_every_batch_size_at_every_size() -> None:
    model = MaskedSum()
    made = runner(model)
    warm(made, [1, 4])
    assert model.seen == [(1, 4), (1, 8), (1, 16), (4, 4), (4, 8), (4, 16)]
    assert len(shapes(made, [1, 4])) == 6


def test_verify_refuses_a_model_that_padding_changes() -> None:
    verify(runner(MaskedSum()))  # masked: padding is harmless
    with pytest.raises(LoadError, match="changes the model's output 'mean'"):
        verify(runner(MaskedSum(masked=False)))
    verify(runner(MaskedSum(masked=False), dataclasses.replace(MASKED, verify=False)))


@pytest.mark.parametrize(("dim", "message"), [
    (dataclasses.replace(MASKED, inputs={"nope": 1}), "no input 'nope'"),
    (dataclasses.replace(MASKED, mask_input="absent"), "no input 'absent' to generate"),
    (dataclasses.replace(MASKED, value=0.5), "cannot be held exactly"),
    (dataclasses.replace(MASKED, inputs={"ids": 2}), "no axis 2"),
])
def test_padding_that_does_not_fit_the_model_is_a_load_error(dim: PadDim, message: str) -> None:
    with pytest.raises(LoadError, match=message):
        check_padding(runner(MaskedSum(), dim))


def test_the_pad_value_is_not_held_to_the_dtype_when_lengths_are_not_padded() -> None:
    # changes_outputs: true batches equal lengths only; the value is never written.
    check_padding(runner(MaskedSum(), dataclasses.replace(MASKED, value=0.5, pads=False)))


def test_an_output_named_to_be_cut_must_follow_the_padded_length() -> None:
    # 'total' is [rows]: it has no axis 1; even with verify off, warm-up refuses it.
    dim = dataclasses.replace(MASKED, outputs={"total": 1}, verify=False)
    with pytest.raises(LoadError, match="does not follow the padded length"):
        warm(runner(MaskedSum(), dim), [1])


def test_a_fixed_length_input_cannot_be_padded() -> None:
    model = MaskedSum()
    model.inputs = [TensorSpec("ids", "int32", (None, 8)), TensorSpec("mask", "int32", (None, 8))]
    with pytest.raises(LoadError, match="always 8 long"):
        check_padding(runner(model))


def test_the_generated_input_is_not_asked_of_clients() -> None:
    made = runner(MaskedSum())
    assert [s.name for s in made.client_inputs or []] == ["ids"]
    replies = replies_by_id(run_batch(made, batch_message(
        [{"ids": np.ones((1, 3), np.int32), "mask": np.ones((1, 3), np.int32)}], pad_to=1)))
    assert replies[b"0"].header["code"] == "bad_request"  # the client may not send it


def test_a_reload_that_changes_padding_or_warmup_replaces_the_workers() -> None:
    from supervisor.core.reload_plan import plan

    def parsed(padding: Any, **model: Any) -> Any:
        return parse_config(config(padding, **model), Path("/tmp/c.yaml"))

    old = parsed({"seq": {"inputs": {"ids": 1}, "sizes": [8, 16]}})
    for new in (parsed({"seq": {"inputs": {"ids": 1}, "sizes": [8, 16, 32]}}),
                parsed({"seq": {"inputs": {"ids": 1}, "sizes": [8, 16], "changes_outputs": True}}),
                parsed({}),
                parsed({"seq": {"inputs": {"ids": 1}, "sizes": [8, 16]}},
                       warmup_batch_sizes=[1, 4])):
        assert plan(old, new).replaced == ["enc"]
    same = parsed({"seq": {"inputs": {"ids": 1}, "sizes": [8, 16]}})
    assert plan(old, same).replaced == []


def test_a_handlers_output_specs_leave_cut_axes_open() -> None:
    from worker.warmup import output_specs

    outputs = MaskedSum()({"ids": np.ones((2, 16), np.int32), "mask": np.ones((2, 16), np.int32)})
    specs = {s.name: s.shape for s in output_specs(outputs, (MASKED,))}
    assert specs == {"total": (None,), "states": (None, None), "mean": (None,)}
    fixed = {s.name: s.shape for s in output_specs(outputs, ())}
    assert fixed["states"] == (None, 16)


def test_an_exponent_yaml_reads_as_text_is_named_so() -> None:
    text = "models:\n  enc:\n    handler: m:f\n    padding:\n      seq:\n" \
           "        inputs: {ids: 1}\n        sizes: [8]\n        value: 1e3\n"
    with pytest.raises(ConfigErrors) as raised:
        parse_config(text, Path("/tmp/c.yaml"))
    error = raised.value.errors[0]
    assert error.path == "models.enc.padding.seq.value"
    assert "YAML 1.1 reads a number with an exponent as text unless it has a dot and a " \
        "signed exponent; write 1.0e+03" in str(error), error
    assert parse_config(text.replace("1e3", "1.0e+3"), Path("/tmp/c.yaml")) \
        .models["enc"].padding["seq"].value == 1000.0
