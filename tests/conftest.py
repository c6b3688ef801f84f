"""Fixtures: real supervisor processes on ipc sockets in short temporary directories."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.testing import Supervisor, short_tmpdir, start_supervisor

__all__ = ["Supervisor", "echo_model", "short_tmpdir", "start_supervisor"]


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
    yield path
    shutil.rmtree(path, ignore_errors=True)


def echo_model(workers: int = 2, **options: Any) -> dict[str, Any]:
    return {"handler": "worker.handlers:echo", "workers": workers, "options": options}
