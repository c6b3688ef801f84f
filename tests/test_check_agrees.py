"""`check` agrees with `run` (issue 47, items 3 and 6): what makes `run` report a model
unavailable, or fail to start, `check` reports first, in `run`'s words.

- without TensorFlow, in milliseconds: a truncated saved_model.pb, a deleted variables/, the
  highest version of a TF Serving layout; a runtime dir on a full file system; a handler
  module that only the model's own env provides (no false warning);
- `check --load`: each model loaded by a worker process as `run` starts one (a damaged
  variables file, a padding naming an input the model does not have).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import echo_model, short_tmpdir
from tests.test_own_resources import tmpfs

CLI = [sys.executable, "-m", "supervisor"]


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(workdir: Path, models: dict[str, Any], **supervisor: Any) -> Path:
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump({"supervisor": {"runtime_dir": str(workdir / "run"),
                                                   **supervisor},
                                    "models": models}, sort_keys=False))
    return path


def _truncate(path: Path) -> None:
    with open(path, "r+b") as stream:
        stream.truncate(os.path.getsize(path) // 2)


# A padding that names an input the model does not have: `run` refuses it at load.
PAD_TOKENS = {"handler": "worker.handlers:echo", "workers": 1,
              "options": {"inputs": {"input_ids": {"dtype": "int32", "shape": [None, None]}}},
              "padding": {"seq": {"inputs": {"tokens": 1}, "sizes": [8, 16], "value": 0}}}


@pytest.mark.tf
def test_check_finds_a_truncated_model_and_deleted_variables_without_loading(
        models_dir: Path, workdir: Path) -> None:
    demo = models_dir / "demo_sm"
    shutil.copytree(demo, workdir / "truncated")
    _truncate(workdir / "truncated" / "saved_model.pb")
    shutil.copytree(demo, workdir / "novars")
    shutil.rmtree(workdir / "novars" / "variables")
    shutil.copytree(demo, workdir / "served" / "1")  # the highest version is the one served
    shutil.copytree(workdir / "truncated", workdir / "served" / "2")
    shutil.copytree(workdir / "truncated", workdir / "older" / "1")  # not served: no matter
    shutil.copytree(demo, workdir / "older" / "2")
    config = _config(workdir, {name: {"saved_model": str(workdir / name), "workers": 1}
                               for name in ("truncated", "novars", "served", "older")})
    out = _cli("check", "-c", str(config), timeout=30)
    assert out.returncode == 1, out.stderr
    errors = [line for line in out.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 3, out.stderr
    assert "models.truncated.saved_model" in errors[0] and "is damaged" in errors[0]
    assert "runs past the end" in errors[0]
    assert "models.novars.saved_model" in errors[1] and "variables.index" in errors[1]
    assert f"{workdir}/served/2/saved_model.pb is damaged" in errors[2]
    assert "models.older" not in out.stderr


def test_check_tries_the_runtime_dir_as_run_will_on_a_full_file_system() -> None:
    assert os.geteuid() == 0, "mounts a tmpfs: run as root (CI does)"
    with tmpfs("256k") as disk:
        config = _config(disk, {"m": echo_model(1)})
        runtime = disk / "run"
        assert _cli("check", "-c", str(config)).returncode == 0
        assert not runtime.exists()  # the try left nothing behind
        with open(disk / "filler", "wb", buffering=0) as filler:
            try:
                while True:
                    filler.write(b"\0" * 4096)
            except OSError:
                pass
        out = _cli("check", "-c", str(config))
        assert out.returncode == 1, out.stdout
        assert "error: supervisor.runtime_dir" in out.stderr, out.stderr
        assert "No space left on device" in out.stderr and "binds its sockets" in out.stderr
        assert not runtime.exists() or not list(runtime.iterdir())


def test_a_handler_module_is_looked_up_where_the_workers_look(workdir: Path) -> None:
    """Only the model's env.PYTHONPATH provides it: the workers load it, so no warning;
    absent everywhere, the warning says where it was looked for."""
    (workdir / "lib").mkdir()
    (workdir / "lib" / "nphandler.py").write_text(
        "from worker.handlers import echo as make\n")
    config = _config(workdir, {
        "np": {"handler": "nphandler:make", "workers": 1,
               "env": {"PYTHONPATH": str(workdir / "lib")}},
        "gone": {"handler": "no_such_module_anywhere:make", "workers": 1}})
    out = _cli("check", "-c", str(config))
    assert out.returncode == 0, out.stderr
    assert "models.np" not in out.stderr, out.stderr
    assert "warning: models.gone.handler: module 'no_such_module_anywhere' is not " \
           "importable with the workers' environment" in out.stderr
    assert "runtime dir" in out.stdout and "tried and removed" in out.stdout


def test_check_load_gives_the_error_run_gives_for_a_padding_of_no_such_input(
        workdir: Path, supervisor_factory: Any) -> None:
    """TF-free: the handler's declared inputs are the model's. `check` alone passes it,
    `check --load` fails it, and `run` reports the model unavailable with the same words."""
    config = _config(workdir, {"pad": PAD_TOKENS, "ok": echo_model(1)})
    assert _cli("check", "-c", str(config)).returncode == 0
    out = _cli("check", "--load", "--timeout", "60", "-c", str(config))
    assert out.returncode == 1, out.stdout + out.stderr
    said = next(line for line in out.stderr.splitlines() if "models.pad" in line)
    message = said.partition("models.pad: does not load: ")[2]
    assert message == "padding 'seq': the model has no input 'tokens' (it has: input_ids)"
    assert "models.ok: loaded and warmed up in" in out.stdout
    sup = supervisor_factory({"models": {"pad": PAD_TOKENS}}, wait=False)
    status = sup.wait_for(lambda s: s["models"]["pad"]["last_error"] is not None, 60,
                          "the model's load error")
    assert status["models"]["pad"]["last_error"] == message


@pytest.mark.tf
def test_check_load_loads_as_run_does(models_dir: Path, workdir: Path) -> None:
    """A variables file emptied (the files are there and well framed: only a load tells)
    fails with TensorFlow's error; a TF Serving layout loads its highest version."""
    demo = models_dir / "demo_sm"
    shutil.copytree(demo, workdir / "empty")
    data = next((workdir / "empty" / "variables").glob("variables.data-*"))
    data.write_bytes(b"")
    shutil.copytree(demo, workdir / "served" / "2")
    shutil.copytree(workdir / "empty", workdir / "served" / "1")
    config = _config(workdir, {"empty": {"saved_model": str(workdir / "empty"), "workers": 1},
                               "served": {"saved_model": str(workdir / "served"),
                                          "workers": 1}})
    assert _cli("check", "-c", str(config)).returncode == 0  # nothing seen without a load
    out = _cli("check", "--load", "-c", str(config), timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "error: models.empty: does not load: " in out.stderr, out.stderr
    assert "models.served: loaded and warmed up (version 2)" in out.stdout, out.stdout
    assert "OK" not in out.stdout
