"""The direct call of a SavedModel signature (worker/direct_call.py): adopted only where it
answers as the public call does, on real SavedModels."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from supervisor.client.testing import short_tmpdir
from worker.direct_call import direct_call, prove
from worker.runners import Arrays, Runner, load
from worker.warmup import _close, adopt_direct, example, warm

pytestmark = pytest.mark.tf
tf = pytest.importorskip("tensorflow", reason="workers need the tensorflow extra")


@pytest.fixture(scope="module")
def two_inputs() -> Iterator[Path]:
    """Inputs declared out of alphabetical order, of one shape, told apart by the output."""

    class Two(tf.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.scale = tf.Variable(2.0)

        @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.float32, name="zeta"),
                                      tf.TensorSpec([None, 3], tf.float32, name="alpha")])
        def serve(self, zeta: Any, alpha: Any) -> dict[str, Any]:
            return {"diff": zeta - self.scale * alpha,
                    "rows": tf.shape(zeta)[0] + tf.zeros_like(zeta[:, 0], tf.int32)}

    path = short_tmpdir() / "two_sm"
    module = Two()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    yield path


def adopted(path: Path) -> tuple[Runner, Any]:
    """A SavedModel runner after the warm-up, and its public call."""
    runner = load("saved_model", str(path), "serving_default", {})
    public = runner.call
    warm(runner, [1, 4])
    adopt_direct(runner, [1, 4])
    return runner, public


def batch(runner: Runner, rows: int, seed: int) -> Arrays:
    rng = np.random.default_rng(seed)
    assert runner.inputs is not None
    return {s.name: rng.standard_normal((rows, *s.shape[1:])).astype(s.dtype)
            for s in runner.inputs}


@pytest.mark.parametrize("name", ["demo_sm", "two"])
def test_the_direct_call_serves_and_answers_as_the_public_call(
        name: str, models_dir: Path, two_inputs: Path) -> None:
    runner, public = adopted(models_dir / "demo_sm" if name == "demo_sm" else two_inputs)
    assert runner.call is not public and runner.direct is None
    for seed, rows in enumerate([1, 3, 32, 5]):
        inputs = batch(runner, rows, seed)
        want, got = public(inputs), runner.call(inputs)
        assert want.keys() == got.keys()
        for key in want:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]))


def test_string_signatures_take_the_direct_call_too(models_dir: Path) -> None:
    runner, public = adopted(models_dir / "text_sm")
    assert runner.call is not public
    text = np.array([b"abc", "é".encode(), b""], dtype=object)
    got, want = runner.call({"text": text}), public({"text": text})
    np.testing.assert_array_equal(got["upper"], want["upper"])
    np.testing.assert_array_equal(got["length"], [3, 1, 0])


def test_inputs_in_the_wrong_order_are_caught_and_the_public_call_kept(
        two_inputs: Path) -> None:
    runner = load("saved_model", str(two_inputs), "serving_default", {})
    public = runner.call

    def swapped(arrays: Arrays) -> Any:
        return public({"zeta": arrays["alpha"], "alpha": arrays["zeta"]})

    sample = example(runner, 2, {}, {})  # zeros: the swap could not show on these alone
    assert not prove(public, swapped, sample, _close)
    runner.direct = swapped
    adopt_direct(runner, [2])
    assert runner.call is public


def test_a_direct_call_that_fails_or_answers_otherwise_is_not_used(
        two_inputs: Path) -> None:
    runner = load("saved_model", str(two_inputs), "serving_default", {})
    public = runner.call
    sample = example(runner, 2, {}, {})

    def broken(arrays: Arrays) -> Any:
        raise RuntimeError("internals moved")

    def fewer(arrays: Arrays) -> Any:
        return {"diff": public(arrays)["diff"]}

    def as_float(arrays: Arrays) -> Any:
        out = dict(public(arrays))
        out["rows"] = np.asarray(out["rows"], np.float32)
        return out

    for other in (broken, fewer, as_float):
        assert not prove(public, other, sample, _close)


def test_no_direct_call_for_what_is_not_a_traced_signature() -> None:
    assert direct_call(lambda **kw: kw) is None
    assert direct_call(object()) is None
