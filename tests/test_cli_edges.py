"""The command line as a new user meets it: an input file that is not there, a config file
that is not there, a model that is not served, no daemon at all, a model whose files are
missing, `reload -c` another file, `explain` right after start, `tune` on a short record, a
padding check that passed. Every failure is one line and an exit status of its kind
(supervisor/cli/outcome.py), never a traceback. Real daemons, real sockets."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from supervisor.cli.outcome import CliExit
from supervisor.cli.render import COST_JOBS, render_explain
from supervisor.cli.tune import short_record, warmup_growth
from supervisor.config.loading import parse_config
from supervisor.core.history import Sample
from supervisor.core.tuning import (
    Finding,
    ModelHistory,
    ModelTuning,
    Recorded,
    WorkerSeries,
)
from tests.conftest import echo_model, short_tmpdir

CLI = [sys.executable, "-m", "supervisor"]


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def _refused(out: subprocess.CompletedProcess[str], status: CliExit, *words: str) -> str:
    """One line on stderr, no traceback, the status of its kind; the line."""
    assert out.returncode == status, out
    assert "Traceback" not in out.stderr, out.stderr
    line = out.stderr.strip()
    assert line.startswith("error: ") and "\n" not in line, line
    for word in words:
        assert word in line, (word, line)
    return line


@pytest.fixture
def workdir() -> Iterator[Path]:
    path = short_tmpdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _config(workdir: Path, config: dict[str, Any], name: str = "config.yaml") -> Path:
    path = workdir / name
    config.setdefault("supervisor", {}).setdefault("runtime_dir", str(workdir / "run"))
    path.write_text(yaml.safe_dump(config))
    return path


# --- no daemon needed -----------------------------------------------------------------------


def test_an_input_file_that_cannot_be_read_is_one_line(workdir: Path) -> None:
    config = str(_config(workdir, {"models": {"m": echo_model(1)}}))
    _refused(_cli("infer", "-c", config, "m", "--input", f"x={workdir}/missing.npy"),
             CliExit.REFUSED, "missing.npy", "No such file")
    (workdir / "text.npy").write_text("not an array")
    _refused(_cli("infer", "-c", config, "m", "--input", f"x={workdir}/text.npy"),
             CliExit.REFUSED, "text.npy", "not a .npy")
    _refused(_cli("infer", "-c", config, "m", "--input", "x"), CliExit.REFUSED, "NAME=FILE")


def test_a_missing_config_file_is_said_and_no_other_daemon_is_asked(
        supervisor_factory: Any) -> None:
    """Before: the missing file 'did not validate', and its defaults (./run beside it)
    reached the daemon running there, whose status was printed as if asked for."""
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    missing = sup.config_path.parent / "typo.yaml"
    for command in (["status"], ["explain", "m"], ["recycle", "m"], ["reload"], ["tune"]):
        out = _cli(*command, "-c", str(missing))
        _refused(out, CliExit.REFUSED, "no such config file", str(missing))
        assert "does not validate" not in out.stderr and out.stdout == "", (command, out)


def test_a_batch_no_request_can_carry_is_a_usage_error(workdir: Path) -> None:
    """-3 failed in numpy with a traceback, 10^8 tried to allocate 47 GiB, 0 sent nothing."""
    config = str(_config(workdir, {"models": {"m": echo_model(1)}}))
    for rows in ("-3", "0", "100000000", "two"):
        out = _cli("infer", "-c", config, "m", "--random", "--batch", rows)
        assert out.returncode == 2 and "Traceback" not in out.stderr, out
        assert "argument --batch: expected" in out.stderr, out.stderr


def test_random_inputs_for_a_model_that_cannot_load_say_so() -> None:
    """Not "no worker ready yet", which tells the user to wait for what never comes."""
    from supervisor.cli.commands import _no_random_inputs

    failing = {"inputs": None, "ready_workers": 0, "failing_to_start": True}
    assert "is failing to start" in str(_no_random_inputs("m", failing))
    starting = {**failing, "failing_to_start": False}
    assert "no worker ready yet" in str(_no_random_inputs("m", starting))


def test_no_daemon_is_one_status_for_every_command(workdir: Path) -> None:
    config = str(_config(workdir, {"models": {"m": echo_model(1)}}))
    for command in (["status"], ["explain", "m"], ["recycle", "m"], ["reload"], ["tune"],
                    ["infer", "m", "--random"]):  # at once, not after its 30 s
        _refused(_cli(*command, "-c", config, timeout=20), CliExit.UNREACHABLE)


# --- one daemon -----------------------------------------------------------------------------


def test_a_model_not_served_is_one_message_and_status_everywhere(
        supervisor_factory: Any) -> None:
    sup = supervisor_factory({"models": {"m": echo_model(1), "other": echo_model(1)}})
    config = str(sup.config_path)
    np.save(sup.config_path.parent / "x.npy", np.ones((1, 4), np.float32))
    for command in (["infer", "nope", "--random"],
                    ["infer", "nope", "--input", f"x={sup.config_path.parent / 'x.npy'}"],
                    ["explain", "nope"], ["recycle", "nope"], ["tune", "nope"]):
        _refused(_cli(*command, "-c", config), CliExit.REFUSED, "no model named 'nope'",
                 "(served: m, other)")
    # A request the model refuses is the same kind: what was sent is wrong.
    np.save(sup.config_path.parent / "wide.npy", np.ones((1, 5), np.float32))
    _refused(_cli("infer", "m", "-c", config, "--input",
                  f"x={sup.config_path.parent / 'wide.npy'}"), CliExit.REFUSED, "bad_request")


def test_reload_of_another_file_names_the_daemons_and_reloads_nothing(
        supervisor_factory: Any) -> None:
    """What `tune --write -c other.yaml` tells the user to run: the daemon re-read its own
    file and answered 'no changes'."""
    sup = supervisor_factory({"models": {"m": echo_model(1)}})
    other = sup.config_path.parent / "other.yaml"
    text = sup.config_path.read_text()
    other.write_text(text.replace("workers: 1", "workers: 2"))
    assert other.read_text() != text
    line = _refused(_cli("reload", "-c", str(other)), CliExit.REFUSED,
                    f"runs from {sup.config_path}", "nothing was reloaded")
    assert str(other) in line
    assert sup.status()["models"]["m"]["configured_workers"] == 1
    out = _cli("reload", "-c", str(sup.config_path))
    assert out.returncode == 0 and out.stdout.startswith("reloaded: no changes") \
        and str(sup.config_path) in out.stdout, out


def _events(sup: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in sup.log().splitlines() if line.startswith("{")]


def test_run_says_at_start_up_which_model_files_are_missing(supervisor_factory: Any) -> None:
    """`check` knew; `run` retried a 15 s TensorFlow load forever without a word."""
    sup = supervisor_factory({"models": {
        "gone": {"saved_model": "models/not-there", "workers": 1}}}, wait=False)
    deadline = time.monotonic() + 60
    while not any(e["event"] == "supervisor_started" for e in _events(sup)):
        assert time.monotonic() < deadline and sup.process.poll() is None, sup.log()
        time.sleep(0.1)
    events = _events(sup)
    missing = [e for e in events if e["event"] == "model_files_missing"]
    assert len(missing) == 1, missing
    assert missing[0]["setting"] == "models.gone.saved_model"
    assert "not-there: no such directory" in missing[0]["error"]
    started = next(i for i, e in enumerate(events) if e["event"] == "supervisor_started")
    assert events.index(missing[0]) < started  # said before anything is spawned


def test_a_padding_check_that_passed_is_in_the_ready_event(supervisor_factory: Any) -> None:
    padded = echo_model(1, inputs={"ids": {"dtype": "int32", "shape": [None, None]}})
    padded["padding"] = {"seq": {"inputs": {"ids": 1}, "sizes": [4, 8],
                                 "outputs": {"ids": 1}}}
    sup = supervisor_factory({"models": {"p": padded, "m": echo_model(1)}})
    ready = {e["model"]: e for line in sup.log().splitlines() if line.startswith("{")
             and (e := json.loads(line))["event"] == "worker_ready"}
    assert ready["p"]["padding_checked"] == ["seq"]
    assert "padding_checked" not in ready["m"]


# --- explain and tune on little data --------------------------------------------------------


def _explained(jobs: int, per_job: float) -> str:
    worker = {"id": "m-1", "slot": 0, "state": "ready", "jobs": jobs, "memory": 600 << 20,
              "baseline": None, "trends": {"window_samples": 0, "window_jobs": 0},
              "growth_split": None, "diagnosis": None,
              "probes": {"jobs": jobs, "cost_seconds": per_job * jobs, "traced": [],
                         "top_shapes": [], "census": [], "containers": []},
              "probes_at_ready": None, "probe_cost_per_job": per_job}
    return render_explain({"model": "m", "memory_metric": "rss", "workers": [worker],
                           "last_recycle": None})


def test_explain_right_after_start_gives_no_cost_per_job() -> None:
    """One job after start: 64 ms of start-up readings read as '64471.0 us per job'."""
    early = _explained(1, 0.0644710)
    assert "us per job" not in early
    assert "probes took 64.5 ms over its first 1 job(s)" in early
    assert f"after {COST_JOBS:,} jobs" in early
    later = _explained(5000, 8.6e-6)
    assert "probes cost 8.6 us per job over 5,000 jobs" in later


def _tuning(*findings: Finding) -> ModelTuning:
    return ModelTuning("m", "summary", list(findings))


def _recorded(watched: float) -> Recorded:
    life = tuple(Sample(10.0 + t, int(t), 500 << 20) for t in np.linspace(0, watched, 20))
    worker = WorkerSeries("m-1", 0.0, 10.0, None, None, int(watched), life, life[-5:])
    return Recorded(10.0 + watched, 1.0, {"m": ModelHistory(100, ((1, 100),), {}, (worker,))})


def test_tune_says_when_the_record_is_short() -> None:
    warmup = Finding(("policy", "warmup_jobs"), 0, "the slowest worker's 0 jobs to its level")
    note = short_record(_tuning(warmup), _recorded(150.0))
    assert note is not None and "short record" in note and "2m30s" in note \
        and "--since 24h" in note, note
    assert short_record(_tuning(warmup), _recorded(2 * 3600.0)) is None
    # Nothing proposed (not enough data): nothing to qualify.
    assert short_record(_tuning(Finding(("policy", "max_memory"), None, "not enough data")),
                        _recorded(150.0)) is None


def test_tune_says_how_much_more_padding_sizes_cost_the_warm_up() -> None:
    model = parse_config(yaml.safe_dump({"models": {"m": {
        "handler": "worker.handlers:echo", "warmup_batch_sizes": [1, 16],
        "padding": {"seq": {"inputs": {"ids": 1}, "sizes": [32, 64, 128]}}}}}),
        Path("/tmp/c.yaml")).models["m"]
    tripled = Finding(("padding", "seq", "sizes"), [8 * i for i in range(1, 10)], "evidence")
    said = warmup_growth(model, tripled)
    assert "from 6 to 18 shapes (3.0x)" in said and "longer to become ready" in said, said
    fewer = Finding(("padding", "seq", "sizes"), [64, 128], "evidence")
    assert warmup_growth(model, fewer) == ""


# --- top fits the terminal ---------------------------------------------------------------------


def test_top_fits_the_terminal_summary_first_and_says_what_it_left_out(
        supervisor_factory: Any) -> None:
    """With 50 models `top` printed `status` whole every second (104 lines, 250-character
    lines) whatever the terminal's size."""
    import os
    import signal

    from supervisor.cli.render import render_top

    sup = supervisor_factory({"models": {"a": echo_model(1), "b": echo_model(1)}})
    report = sup.status()
    many = {f"model-{i:02d}": report["models"]["a" if i % 2 else "b"] for i in range(50)}
    frame = render_top({**report, "models": many}, 80, 21)
    assert len(frame) <= 21 and all(len(line) < 80 for line in frame), frame
    assert frame[0].startswith("50 models: 50 available, 0 starting, 0 UNAVAILABLE")
    assert frame[-1].startswith("… ") and "more models" in frame[-1], frame
    assert sum(line.startswith("model-") for line in frame) == 21 - 4  # summary, blank, head
    one = render_top(report, 80, 21, model="a")
    assert any(line.startswith("a ") and "a-" in line for line in one), one
    # The command itself, in a terminal of 60 x 6 ($COLUMNS, $LINES): each frame fits.
    top = subprocess.Popen([*CLI, "top", "-c", str(sup.config_path), "--interval", "0.2"],
                           stdout=subprocess.PIPE, text=True,
                           env={**os.environ, "COLUMNS": "60", "LINES": "6"})
    try:
        assert top.stdout is not None
        lines = []
        while not (lines and lines[-1].startswith("… ")):  # the first frame's last line
            lines.append(top.stdout.readline().rstrip("\n"))
            assert lines[-1] or len(lines) < 20, lines
    finally:
        top.send_signal(signal.SIGINT)
        top.communicate(timeout=30)
    assert lines[0].startswith("tfsupervisor top") and len(lines) <= 6, lines
    assert all(len(line) < 60 for line in lines), lines
