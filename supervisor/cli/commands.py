"""The `tfsupervisor` command: run, check, infer, status, tune, demo-model, schema."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from supervisor.cli.argtypes import MAX_BATCH, batch_rows, timeout_seconds, wait_seconds
from supervisor.cli.outcome import REFUSALS, CliExit, is_unknown_model, no_such_model
from supervisor.cli.render import render_explain, render_status, render_top
from supervisor.config.keys import Config, SupervisorSection
from supervisor.config.loading import (
    ControlEndpoints,
    config_reference,
    config_schema,
    control_endpoints,
    load_config,
)
from supervisor.config.settings import ConfigErrors
from supervisor.shared.exitcodes import DaemonExit

DEFAULT_CONFIG = "config.yaml"


def _version() -> str:
    try:
        return version("tfsupervisor")
    except PackageNotFoundError:
        return "unknown"


def _load(path: str) -> Config:
    try:
        return load_config(path)
    except ConfigErrors as errors:
        print(f"{path}: {len(errors.errors)} error(s)", file=sys.stderr)
        for error in errors.errors:
            print(f"  {error}", file=sys.stderr)
        raise SystemExit(1) from None


def cmd_run(args: argparse.Namespace) -> int:
    from supervisor.cli.preflight import model_files_missing
    from supervisor.daemon.daemon import Daemon
    from supervisor.shared import logs
    from supervisor.shared.exitcodes import DaemonExit

    # Logging first: a config that cannot be used is one JSON event too under --log-format
    # json (journald readers parse every line), not a block of text.
    logs.configure("info", args.log_format or "auto")
    log = logs.get(__name__)
    try:
        config = load_config(args.config)
    except ConfigErrors as errors:
        log.error("supervisor_start_failed", exit_code=int(DaemonExit.CONFIG),
                  error=f"{args.config}: {len(errors.errors)} config error(s)",
                  errors=[str(e) for e in errors.errors])
        return DaemonExit.CONFIG
    log_format = args.log_format or config.supervisor.log_format
    logs.configure(config.supervisor.log_level, log_format)
    for finding in model_files_missing(config):
        # Served anyway (the file may appear: its workers are retried with back-off), but
        # said now rather than after each 15 s TensorFlow load that fails.
        log.error("model_files_missing", setting=finding.where, error=finding.message,
                  hint="its workers fail to load until the file is there, retried with "
                  "back-off; `tfsupervisor check` lists what this host lacks")
    try:
        daemon = Daemon(config)
        daemon.log_format = log_format
        return daemon.run()
    except Exception:  # a bug that escaped the loop's guards: logged, and a status that
        # systemd restarts on (1 is a config error, which RestartPreventExitStatus lists)
        logs.get(__name__).exception("supervisor_crashed",
                                     exit_code=int(DaemonExit.START_FAILED))
        return DaemonExit.START_FAILED


def cmd_check(args: argparse.Namespace) -> int:
    from supervisor.cli.preflight import preflight

    config = _load(args.config)
    findings = preflight(config)
    for finding in findings:
        print(f"{args.config}: {finding}", file=sys.stderr)
    failed = any(f.error for f in findings)
    if args.load:
        failed = _check_loads(args, config, {f.where.split(".")[1] for f in findings
                                             if f.error and f.where.startswith("models.")}) \
            or failed
    if failed:
        return 1
    workers = sum(m.workers for m in config.models.values())
    loaded = "loaded, " if args.load else ""
    print(f"{args.config}: OK — {len(config.models)} model(s) "
          f"({', '.join(sorted(config.models))}; {loaded}files checked), {workers} worker(s), "
          f"frontend {', '.join(config.supervisor.endpoints)}; runtime dir "
          f"{config.supervisor.runtime_dir} takes a file and a socket (tried and removed)")
    return 0


def _check_loads(args: argparse.Namespace, config: Config, broken: set[str]) -> bool:
    """Each model (but those already found broken) loaded by a worker as `run` starts one;
    True if any fails, with the error `run` would report it unavailable with."""
    from supervisor.cli.loadcheck import load_model

    timeout = args.timeout if args.timeout is not None else config.supervisor.start_timeout
    failed = False
    for name in config.models:
        if name in broken:
            continue
        result = load_model(config, name, timeout)
        if result.error is not None:
            failed = True
            print(f"{args.config}: error: models.{name}: does not load: {result.error}",
                  file=sys.stderr)
        else:
            version = f" (version {result.version})" if result.version is not None else ""
            print(f"{args.config}: models.{name}: loaded and warmed up{version} in "
                  f"{result.seconds:.1f}s")
    return failed


def _control_endpoint(args: argparse.Namespace, admin: bool) -> str:
    """The endpoint to reach: --control / --admin, else the config's, read leniently: the
    running daemon was started from an earlier, valid file, so a bad edit must not cut the
    operator (or a liveness probe) off from it."""
    given = args.admin if admin else args.control
    if given:
        return str(given)
    found = _read_within(float(getattr(args, "timeout", 30.0)),
                         partial(_endpoints_of, args.config), args.config, admin)
    if found.problems:
        print(f"warning: {args.config} does not validate ({len(found.problems)} error(s); "
              f"`tfsupervisor check -c {args.config}`); reaching the running daemon anyway",
              file=sys.stderr)
    return found.admin if admin else found.control


class CommandFailed(Exception):
    """A command that cannot go on: main() prints ``error: message`` and exits ``status``."""

    def __init__(self, status: CliExit, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _endpoints_of(path: str) -> ControlEndpoints:
    """The config's endpoints, read leniently, but only from a file that is there: with
    none, the defaults would name another directory's daemon (or the systemd one)."""
    if not os.path.exists(path):
        raise CommandFailed(CliExit.REFUSED, f"no such config file: {path} (give -c the file "
                            "the supervisor runs from, or --control/--admin ENDPOINT)")
    return control_endpoints(path)


def _ask(endpoint: str, command: str, args: argparse.Namespace, **fields: Any) -> Any:
    """A control command's result; CommandFailed with the status of its kind of failure.
    A model the daemon does not serve is reported with those it does."""
    from supervisor.client.client import JobError, NoReply, control

    try:
        return control(endpoint, command, timeout=args.timeout, **fields, **_curve_args(args))
    except NoReply as exc:
        raise CommandFailed(CliExit.UNREACHABLE, exc.message) from None
    except JobError as exc:
        model = fields.get("model")
        if isinstance(model, str) and is_unknown_model(exc.message):
            served = _served(endpoint, args)
            message = no_such_model(model, served) if served is not None else exc.message
            raise CommandFailed(CliExit.REFUSED, message) from None
        if "has no live worker" in exc.message:  # a worker id that was given: unusable
            raise CommandFailed(CliExit.REFUSED, exc.message) from None
        raise CommandFailed(CliExit.FAILED, exc.message) from None


def _served(endpoint: str, args: argparse.Namespace) -> list[str] | None:
    """The models the daemon at ``endpoint`` serves (None if it cannot say)."""
    from supervisor.client.client import JobError, control

    try:
        report = control(endpoint, "status", timeout=args.timeout, **_curve_args(args))
    except JobError:
        return None
    return [m for m, s in report.get("models", {}).items() if not s.get("removed")]


T = TypeVar("T")


def _read_within(seconds: float, read: Callable[[], T], path: str, admin: bool) -> T:
    """``read`` of the config file, given up on after ``seconds`` (the command's own
    --timeout): on a hung mount, open() would otherwise block the command for good."""
    from supervisor.daemon.offloop import OffLoop

    task = OffLoop().submit("config-read", read, seconds)
    if not task.wait(seconds):
        flag = "--admin" if admin else "--control"
        raise SystemExit(f"error: reading {path} took longer than {seconds:g}s (its file "
                         f"system does not answer: a hung mount?); give {flag} ENDPOINT to "
                         "reach the daemon without it")
    return task.result()


def _random_input(spec: dict[str, Any], batch: int) -> np.ndarray:
    shape = [batch if i == 0 and d is None else (1 if d is None else d)
             for i, d in enumerate(spec["shape"])]
    rng = np.random.default_rng()
    if spec["dtype"] == "string":
        words = np.array([b"alpha", b"beta", b"gamma", b"delta"], dtype=object)
        return rng.choice(words, size=shape)
    dtype = np.dtype(spec["dtype"])
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, shape).astype(dtype)
    return rng.integers(0, 10, shape).astype(dtype)


def _read_inputs(items: list[str]) -> dict[str, np.ndarray]:
    """The --input NAME=FILE.npy arrays, each read before anything is sent."""
    inputs: dict[str, np.ndarray] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise CommandFailed(CliExit.REFUSED, f"--input {item}: expected NAME=FILE.npy")
        try:
            inputs[name] = np.load(path, allow_pickle=False)
        except OSError as exc:
            raise CommandFailed(CliExit.REFUSED, f"--input {item}: cannot read {path}: "
                                f"{exc.strerror or exc}") from None
        except ValueError as exc:  # not a .npy file, or one holding Python objects
            raise CommandFailed(CliExit.REFUSED, f"--input {item}: {path} is not a .npy "
                                f"array file numpy can read without pickle: {exc}") from None
    return inputs


def _no_random_inputs(name: str, model: dict[str, Any]) -> str | None:
    """Why --random cannot make inputs for ``model`` (its entry in the models answer)."""
    if model.get("inputs") is not None:
        return None
    if model.get("ready_workers"):  # ready, and its handler declares nothing to go by
        return (f"model '{name}' declares no inputs (its handler's `inputs` is None), so "
                "--random has nothing to go by: give them with --input NAME=FILE.npy")
    if model.get("failing_to_start"):
        return (f"model '{name}' is failing to start: its workers exit before they are ready "
                "(`tfsupervisor status` says why)")
    return f"model '{name}' has no worker ready yet: its inputs are not known"


def cmd_infer(args: argparse.Namespace) -> int:
    from supervisor.client.client import Client, JobError, NoReply, missing_socket

    config = _load(args.config)
    inputs = _read_inputs(args.input)
    endpoints = list(config.supervisor.endpoints)
    if all(missing_socket(e) for e in endpoints):  # else ZeroMQ waits out --timeout
        raise CommandFailed(CliExit.UNREACHABLE, f"no socket at {', '.join(endpoints)} (is the "
                            "supervisor running, with this config?)")
    with Client(endpoints, timeout=args.timeout,
                **_curve_args(args)) as client:
        try:
            served = client.models()
            if args.model not in served:
                raise CommandFailed(CliExit.REFUSED, no_such_model(args.model, served))
            if args.random:
                problem = _no_random_inputs(args.model, served[args.model])
                if problem is not None:  # none declared: give them; none known yet: wait
                    declared_none = bool(served[args.model].get("ready_workers"))
                    raise CommandFailed(CliExit.REFUSED if declared_none else CliExit.FAILED,
                                        problem)
                specs = served[args.model]["inputs"]
                inputs = {**{s["name"]: _random_input(s, args.batch) for s in specs}, **inputs}
            outputs = client.infer(args.model, inputs)
        except NoReply as exc:
            raise CommandFailed(CliExit.UNREACHABLE, exc.message) from None
        except JobError as exc:
            status = CliExit.REFUSED if exc.code in REFUSALS else CliExit.FAILED
            raise CommandFailed(status, str(exc)) from None
    np.set_printoptions(threshold=50, edgeitems=4)
    for name, array in outputs.items():
        print(f"{name}: {array.dtype}{list(array.shape)}")
        print(array)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from supervisor.client.client import JobError, NoReply, control
    from supervisor.core.readiness import not_ready_reason

    endpoint = _control_endpoint(args, admin=False)
    if not args.ready:
        report = _ask(endpoint, "status", args)
    else:
        try:
            report = control(endpoint, "status", timeout=args.timeout, **_curve_args(args))
        except JobError as exc:  # one line: what a probe's failure event shows
            print(f"not ready: {exc}", file=sys.stderr)
            return CliExit.UNREACHABLE if isinstance(exc, NoReply) else CliExit.FAILED
    if args.ready:  # a readiness probe: the exit code is the answer, and one line says why
        reason = not_ready_reason(report, args.model)
        if reason is None:
            return 0
        print(f"not ready: {reason}", file=sys.stderr)  # stdout stays empty
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_status(report))
    return 0


def cmd_drain(args: argparse.Namespace) -> int:
    """Kubernetes' preStop hook: start the drain now (SIGTERM to the supervisor that owns
    the runtime directory), then wait until every job it had is answered. The pod reads not
    ready at once and new jobs are answered shutting_down (clients send them elsewhere).
    With jobs to finish it returns before the daemon exits; an idle daemon may exit before
    the first look, which is a drain done too."""
    from supervisor.client.client import JobError, control
    from supervisor.daemon.instance_lock import LOCK_NAME, holder

    runtime_dir, endpoint, budget, problem = _drain_target(args)
    timeout = args.timeout if args.timeout is not None else budget
    lock = runtime_dir / LOCK_NAME
    try:
        pid = holder(lock)
    except PermissionError:
        print(f"error: not permitted to read {lock}: run drain as the supervisor's user "
              "(or one in its socket group)", file=sys.stderr)
        return 1
    if pid is None:
        if problem is not None:  # it may run from another runtime directory: not drained
            print(f"error: cannot use {args.config}: {problem}; no supervisor holds {lock}, "
                  "where this file would put it: nothing was drained", file=sys.stderr)
            return 1
        print(f"no supervisor holds {lock}: nothing to drain")
        return 0
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        print(f"supervisor {pid} is gone: nothing to drain")
        return 0
    except PermissionError:
        print(f"error: not permitted to signal supervisor {pid}: run drain as the user it "
              "runs as", file=sys.stderr)
        return 1
    deadline = time.monotonic() + timeout
    while True:
        try:
            report = control(endpoint, "status", timeout=max(0.5, min(
                5.0, deadline - time.monotonic())))
        except JobError:  # gone (or no longer answering): nothing left for us to wait on
            print(f"supervisor {pid} stopped answering: drained")
            return 0
        pending = {name: m["queued"] + m["in_flight"]
                   for name, m in report["models"].items() if m["queued"] + m["in_flight"]}
        if not report["serving"] and not pending:
            print(f"supervisor {pid} is draining with no job left: its workers stop next")
            return 0
        if time.monotonic() >= deadline:
            print(f"error: supervisor {pid} still has jobs after {timeout:g}s: "
                  f"{', '.join(f'{m} {n}' for m, n in sorted(pending.items()))}",
                  file=sys.stderr)
            return 1
        time.sleep(0.2)


def _drain_target(args: argparse.Namespace) -> tuple[Path, str, float, str | None]:
    """(runtime dir, status endpoint, how long the drain may take: shutdown_timeout plus
    STOP_GRACE, why the config could not be used or None). A config that no longer
    validates (or no longer parses) still names where the running daemon is, as far as
    it can be read: the drain then gets the default budget, and the caller fails rather
    than report 'nothing to drain' when no daemon is found there."""
    from supervisor.core.lifecycle import STOP_GRACE

    try:
        config = load_config(args.config)
    except ConfigErrors as errors:
        problem = str(errors.errors[0]).splitlines()[0] if errors.errors else "invalid"
        if len(errors.errors) > 1:
            problem += f" (and {len(errors.errors) - 1} more error(s))"
        endpoint = control_endpoints(args.config).control
        if not endpoint.startswith("ipc://"):
            print(f"error: {args.config} does not validate and its status endpoint is not "
                  "ipc: cannot find the supervisor's runtime directory", file=sys.stderr)
            raise SystemExit(1) from None
        default = SupervisorSection().shutdown_timeout
        return Path(endpoint[len("ipc://"):]).parent, endpoint, default + STOP_GRACE, problem
    sup = config.supervisor
    return config.runtime_dir, sup.control, sup.shutdown_timeout + STOP_GRACE, None


def cmd_top(args: argparse.Namespace) -> int:
    from supervisor.client.client import JobError, control

    endpoint = _control_endpoint(args, admin=False)
    quit_ = QuitFlag()
    signal.signal(signal.SIGINT, quit_)
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""  # piped: one screen after another
    try:
        while not quit_.asked:
            # The terminal's size at each frame ($COLUMNS/$LINES first): the frame fits it.
            # Piped, with no size given, there is no terminal to fit: nothing is cut.
            columns, rows = shutil.get_terminal_size() if sys.stdout.isatty() or \
                {"COLUMNS", "LINES"} & os.environ.keys() else (10**6, 10**6)
            try:
                report = control(endpoint, "status", timeout=args.interval + 5,
                                 **_curve_args(args))
                screen = "\n".join(render_top(report, columns, rows - 3, args.model))
            except JobError as exc:
                screen = f"error: {exc}"
            stamp = time.strftime("%H:%M:%S")
            title = f"tfsupervisor top — {endpoint} — {stamp} (Ctrl-C quits)"
            sys.stdout.write(f"{clear}{title[:max(columns - 1, 10)]}\n\n{screen}\n")
            sys.stdout.flush()
            if not quit_.asked:
                time.sleep(args.interval)
    except KeyboardInterrupt:  # the second Ctrl-C
        pass
    return 0


class QuitFlag:
    """SIGINT handler for a refreshing command: the first Ctrl-C only records (the loop ends
    after its current refresh: an exception raised anywhere, inside a ZeroMQ call say, could
    leave a socket open that then holds the process at exit), a second one interrupts."""

    def __init__(self) -> None:
        self.asked = False

    def __call__(self, signum: int, frame: Any) -> None:
        if self.asked:
            raise KeyboardInterrupt
        self.asked = True


def cmd_explain(args: argparse.Namespace) -> int:
    endpoint = _control_endpoint(args, admin=False)
    report = _ask(endpoint, "explain", args, model=args.model)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(render_explain(report))
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from supervisor.cli import tune
    from supervisor.client.client import NoReply

    endpoint = None if args.history else _control_endpoint(args, admin=False)
    try:
        return tune.run(args, endpoint, _curve_args(args))
    except NoReply as exc:
        raise CommandFailed(CliExit.UNREACHABLE, exc.message) from None


def cmd_recycle(args: argparse.Namespace) -> int:
    endpoint = _control_endpoint(args, admin=True)
    result = _ask(endpoint, "recycle", args, model=args.model, worker=args.worker)
    scheduled = result["scheduled"]
    print(f"recycling {', '.join(scheduled) or 'nothing'} (replacement first where the "
          "container's memory holds it, else drain first; watch with `tfsupervisor status`)")
    return 0


def cmd_reload(args: argparse.Namespace) -> int:
    # The daemon reads and validates the file itself and answers with every error: a
    # rejected reload is then logged (config_rejected) and counted where operators look.
    endpoint = _control_endpoint(args, admin=True)
    running = _running_file(endpoint, args)
    try:
        result = _ask(endpoint, "reload", args)
    except CommandFailed as failed:
        if failed.status is CliExit.FAILED and failed.message.startswith("config rejected"):
            raise CommandFailed(CliExit.REFUSED, failed.message) from None
        raise
    key_problems = result.pop("key_problems", [])
    where = f" ({running})" if running else ""
    print("reloaded: " + (", ".join(f"{k} {', '.join(v)}" for k, v in result.items())
                          or "no changes") + where)
    for problem in key_problems:  # the readable keys apply; these were skipped
        print(f"warning: client key skipped: {problem}", file=sys.stderr)
    starting = [*result.get("added", []), *result.get("replaced", []),
                *result.get("code_changed", []), *result.get("retried", [])]
    if starting and args.wait is None:
        print(f"new workers are starting for {', '.join(starting)}; a model whose new workers "
              "fail to load keeps its old ones serving (see `tfsupervisor status`, or reload "
              "with --wait SECONDS)")
    if args.wait is None:
        return 0
    return _wait_for_workers(endpoint, args)


def _running_file(endpoint: str, args: argparse.Namespace) -> str | None:
    """The file the daemon runs from (None when it does not say: an older daemon). A reload
    re-reads that file, never the one -c names: when they differ, nothing is reloaded and
    the command says which file to edit."""
    running = _ask(endpoint, "status", args).get("config")
    if not isinstance(running, str):
        return None
    if not args.admin and os.path.realpath(args.config) != os.path.realpath(running):
        raise CommandFailed(CliExit.REFUSED, f"the supervisor at {endpoint} runs from "
                            f"{running}, not {args.config}: a reload re-reads its own file. "
                            f"Put the changes into {running} and reload, or restart the "
                            f"supervisor with -c {args.config}; nothing was reloaded")
    return running


def _wait_for_workers(endpoint: str, args: argparse.Namespace) -> int:
    """After a reload: until every model serves on workers of the settings now in force (0),
    or one's new workers fail to start (1: the old ones serve on), or --wait runs out (1).
    Every model is waited for, not only those this reload changed: a repeated reload must
    not call a replacement that an earlier one left failing or unfinished a success."""
    from supervisor.client.client import JobError, control

    deadline = time.monotonic() + args.wait
    while True:
        try:
            status = control(endpoint, "status", timeout=args.timeout, **_curve_args(args))
        except JobError as exc:
            print(f"error: {exc.message}", file=sys.stderr)
            return 1
        models = [m for m, s in status["models"].items() if not s.get("removed")]
        failed = reload_failures(status, models)
        if failed:
            for name, error in failed.items():
                serving = "the old ones serve on" if status["models"][name]["available"] \
                    else "nothing serves it"
                print(f"error: {name}: new workers fail to start ({serving}): {error}",
                      file=sys.stderr)
            return 1
        waiting = [m for m in models if not reload_settled(status["models"].get(m))]
        if not waiting:
            print(f"serving on workers of the current settings and code: "
                  f"{', '.join(models)}")
            return 0
        if time.monotonic() >= deadline:
            print(f"error: still starting after {args.wait:g}s: {', '.join(waiting)}",
                  file=sys.stderr)
            return 1
        time.sleep(0.5)


def reload_failures(status: dict[str, Any], models: list[str]) -> dict[str, str]:
    """Models (of those named) whose workers failed to start since, with the error."""
    return {m: str(s["last_error"]) for m in models
            if (s := status["models"].get(m)) is not None and s.get("last_error")}


def reload_settled(model: dict[str, Any] | None) -> bool:
    """Every worker ready and staying, as many as configured: nothing left of the reload."""
    if model is None:
        return True  # removed again since: nothing to wait for
    workers = model["workers"]
    staying = [w for w in workers if not (w.get("recycle_reason") or w.get("recycle_requested")
                                          or w.get("recycle_held_back"))]
    return len(staying) == len(workers) and len(workers) >= model["configured_workers"] \
        and all(w["state"] == "ready" for w in workers)


def cmd_demo_model(args: argparse.Namespace) -> int:
    path = Path(args.text or args.path)
    if (path / "saved_model.pb").exists() and not args.force:
        print(f"{path}: demo model already there (use --force to rebuild)")
        return 0
    # Built in a child process: the `tfsupervisor` command itself never imports TensorFlow.
    module = "worker.demo_text" if args.text else "worker.demo_model"
    code = subprocess.call([sys.executable, "-m", module, str(path)])
    if code == 0:
        what = "text encoder (input_ids, attention_mask -> pooled)" if args.text else "MLP"
        print(f"{path}: demo {what} written (SavedModel, signature serving_default)")
    return code


def _curve_args(args: argparse.Namespace) -> dict[str, Any]:
    """CURVE keys for talking to a TCP endpoint that requires them (ipc needs none)."""
    if args.server_key and args.client_cert:
        return {"server_key": args.server_key, "client_cert": args.client_cert}
    return {}


def cmd_keygen(args: argparse.Namespace) -> int:
    from supervisor.daemon.security import KeysExist, keygen

    try:
        files = keygen(Path(args.directory), force=args.force)
    except KeysExist as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"""wrote CURVE keys to {args.directory}:
  server secret  {files["server_secret"]}   (keep on the supervisor host only)
  server public  {files["server_public"]}   (give to clients)
  client secret  {files["client_secret"]}   (give to one client; make one pair per client)
  authorized     {files["authorized_clients"]}/   (client public keys the server admits)

config.yaml:
  supervisor:
    curve:
      server_secret_key: {files["server_secret"]}
      authorized_clients: {files["authorized_clients"]}

client:
  Client("tcp://HOST:PORT", server_key="{files["server_public"]}",
         client_cert="{files["client_secret"]}")""")
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    if args.markdown:
        print(config_reference())
    else:
        print(json.dumps(config_schema(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfsupervisor",
        description="Supervise TensorFlow inference workers: ZeroMQ jobs, memory-aware "
                    "recycling.")
    parser.add_argument("--version", action="version", version=f"tfsupervisor {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Any, help: str, config: bool = True) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        if config:
            p.add_argument("-c", "--config", default=DEFAULT_CONFIG,
                           help=f"config file (default {DEFAULT_CONFIG})")
        if name in ("infer", "status", "top", "explain", "tune", "recycle", "reload"):
            p.add_argument("--server-key", help="server public certificate (CURVE over TCP)")
            p.add_argument("--client-cert", help="client secret certificate (CURVE over TCP)")
        if name in ("status", "top", "explain", "tune"):
            p.add_argument("--control", metavar="ENDPOINT", help="the status endpoint "
                           "(default: supervisor.control of the config)")
        if name in ("recycle", "reload"):
            p.add_argument("--admin", metavar="ENDPOINT", help="the admin endpoint "
                           "(default: supervisor.admin of the config)")
        p.set_defaults(func=func)
        return p

    run = add("run", cmd_run, "Run the supervisor in the foreground.")
    run.add_argument("--log-format", choices=("auto", "console", "json"), default=None,
                     help="override supervisor.log_format")
    check = add("check", cmd_check, "Validate a config file and what this host must have "
                "for it (model files, handler modules, the runtime dir); exit 1 on any error.")
    check.add_argument("--load", action="store_true",
                       help="also load each model in a worker process as `run` does (the "
                       "highest version of a versioned directory), checking its padding and "
                       "warming it up, and report the error `run` would give; seconds per "
                       "TensorFlow model")
    check.add_argument("--timeout", type=timeout_seconds, metavar="SECONDS",
                       help="with --load: how long each model may take to be ready "
                       "(default: supervisor.start_timeout)")
    infer = add("infer", cmd_infer, "Submit one job and print its outputs.")
    infer.add_argument("model")
    infer.add_argument("--input", action="append", default=[], metavar="NAME=FILE.npy",
                       help="an input array from a .npy file (repeatable)")
    infer.add_argument("--random", action="store_true",
                       help="generate every input from the model's spec")
    infer.add_argument("--batch", type=batch_rows, default=1,
                       help=f"rows with --random (1 to {MAX_BATCH}, default 1)")
    infer.add_argument("--timeout", type=timeout_seconds, default=30.0,
                       help="seconds (default 30)")
    status = add("status", cmd_status, "Show models and workers of a running supervisor.")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--timeout", type=timeout_seconds, default=5.0)
    status.add_argument("--ready", action="store_true",
                        help="exit 0 only if the daemon is serving and every required model "
                        "has a ready worker (probes); otherwise one line on stderr says why")
    status.add_argument("--model", action="append", metavar="NAME",
                        help="with --ready: the answer depends on these models (repeatable), "
                        "each needing a ready worker, instead of the required ones")
    drain = add("drain", cmd_drain, "Start a running supervisor's drain (SIGTERM) and wait "
                "until it has answered every job; for Kubernetes' preStop hook.")
    drain.add_argument("--timeout", type=timeout_seconds, metavar="SECONDS",
                       help="give up (exit 1) after this long (default: "
                       "supervisor.shutdown_timeout + 5s)")
    top = add("top", cmd_top, "Status, refreshed until Ctrl-C.")
    top.add_argument("--interval", type=timeout_seconds, default=1.0,
                     help="seconds between refreshes")
    top.add_argument("--model", metavar="NAME", help="that model's workers in full (the "
                     "frame fits the terminal: a line per model otherwise)")
    explain = add("explain", cmd_explain, "Why a model's workers grow: per worker, the "
                  "suspected cause and its remedy, the probes' trends, the input shapes and "
                  "Python types that grew it.")
    explain.add_argument("model")
    explain.add_argument("--json", action="store_true", help="machine-readable output")
    explain.add_argument("--timeout", type=timeout_seconds, default=5.0)
    from supervisor.cli.tune import add_arguments as tune_arguments
    tune_arguments(add("tune", cmd_tune, "Suggest each model's policy (warm-up, max_memory, "
                       "trend limits) and batch and padding sizes from what its workers and "
                       "traffic did, each value with its evidence; --write puts them into "
                       "the config file."))
    recycle = add("recycle", cmd_recycle, "Gracefully replace a model's workers (or one).")
    recycle.add_argument("model")
    recycle.add_argument("--worker", help="only this worker id (default: all, K at a time)")
    recycle.add_argument("--timeout", type=timeout_seconds, default=10.0)
    reload = add("reload", cmd_reload, "Re-read the config in a running supervisor and wait "
                 "for the outcome (exit 1 if it was rejected).")
    reload.add_argument("--timeout", type=timeout_seconds, default=30.0)
    reload.add_argument("--wait", type=wait_seconds, metavar="SECONDS",
                        help="then wait up to this long until every model serves on workers "
                        "of the settings now in force: exit 1 if a model's workers fail to "
                        "start or are not ready in time")
    demo = add("demo-model", cmd_demo_model, "Build the demo MLP (or, with --text, a "
               "transformer text encoder) as a SavedModel.", config=False)
    demo.add_argument("path", nargs="?", default="models/demo")
    demo.add_argument("--text", metavar="PATH", help="build the demo text encoder at PATH "
                      "instead (token ids and attention mask of any length; served with "
                      "padding by examples/text.yaml)")
    demo.add_argument("--force", action="store_true")
    keygen = add("keygen", cmd_keygen, "Write CURVE server and client key pairs.",
                 config=False)
    keygen.add_argument("directory")
    keygen.add_argument("--force", action="store_true",
                        help="replace keys already there (cuts off clients of the old ones)")
    schema = add("schema", cmd_schema, "Print the JSON schema of config.yaml.", config=False)
    schema.add_argument("--markdown", action="store_true",
                        help="print the configuration reference (docs/configuration.md)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except CommandFailed as failed:
        print(f"error: {failed.message}", file=sys.stderr)
        return int(failed.status)
    except BrokenPipeError:
        if args.func is cmd_run:  # the daemon's status is the truth: never 0 for a failure
            return int(DaemonExit.START_FAILED)
        # The reader went away (`tfsupervisor explain ... | head`): not a failure of the
        # command. Python would report the broken pipe again when it flushes stdout at
        # exit, so stdout goes to /dev/null first.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
