"""Fixtures: real supervisor processes on ipc sockets in short temporary directories."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from supervisor.testing import Supervisor, short_tmpdir, start_supervisor

__all__ = ["Supervisor", "echo_model", "short_tmpdir", "start_supervisor"]

# CI replays a fixed set of examples so that its verdict depends on the commit alone; runs on
# a developer's machine keep exploring (and keep the failures they find in .hypothesis/).
settings.register_profile("ci", derandomize=True, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _skipped.append(report.nodeid)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that start TensorFlow first, each module's tests in their own order: those
    modules take longest, and `make test` (pytest-xdist, --dist loadfile
    --no-loadscope-reorder) hands whole modules to its workers in this order, so the run
    does not end on one of them while the other worker idles."""
    with_tf = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("tf")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in with_tf)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """With TFS_FORBID_SKIPS set (CI), a skipped test fails the run: a skip is not a pass."""
    if os.environ.get("TFS_FORBID_SKIPS") and _skipped and exitstatus == 0:
        print(f"\n{len(_skipped)} test(s) skipped, which TFS_FORBID_SKIPS forbids:")
        for nodeid in _skipped:
            print(f"  {nodeid}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def supervisor_factory() -> Iterator[Callable[..., Supervisor]]:
    started: list[Supervisor] = []

    def make(config: dict[str, Any], wait: bool = True,
             env: dict[str, str] | None = None) -> Supervisor:
        sup = start_supervisor(config, env=env)
        started.append(sup)
        if wait:
            sup.wait_ready()
        return sup

    yield make
    for sup in started:
        sup.stop()
        shutil.rmtree(sup.config_path.parent, ignore_errors=True)


@pytest.fixture(scope="session")
def models_dir() -> Iterator[Path]:
    """The demo MLP as a SavedModel (through the CLI users run) and as a .keras file."""
    pytest.importorskip("tensorflow", reason="workers need the tensorflow extra")
    from worker import demo_model

    path = short_tmpdir()
    subprocess.run([sys.executable, "-m", "supervisor", "demo-model", str(path / "demo_sm")],
                   check=True)
    demo_model.build(seed=11).save(path / "demo.keras")
    save_text_model(path / "text_sm")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def save_text_model(path: Path) -> None:
    """A SavedModel with a string input and a string output, as text models have."""
    import tensorflow as tf

    class Text(tf.Module):  # type: ignore[misc]
        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
        def serve(self, text: Any) -> dict[str, Any]:
            return {"length": tf.strings.length(text, unit="UTF8_CHAR"),
                    "upper": tf.strings.upper(text)}

    module = Text()
    tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})


def echo_model(workers: int = 2, **options: Any) -> dict[str, Any]:
    return {"handler": "worker.handlers:echo", "workers": workers, "options": options}


def stand_in_saved_model(directory: Path) -> None:
    """What `check` reads of a SavedModel without TensorFlow: a saved_model.pb framed as one
    (a meta graph field, empty) and variables/variables.index. Enough for the checks of a
    layout (where a model is mounted, which paths resolve), never loadable."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "saved_model.pb").write_bytes(b"\x12\x00")
    (directory / "variables").mkdir(exist_ok=True)
    (directory / "variables" / "variables.index").write_bytes(b"")
