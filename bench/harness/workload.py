"""What a side-by-side bench serves (a ``Workload``), the servers it is served by (each a
``Variant``, named explicitly, its behaviour in fields), and the interleaved rounds."""

from __future__ import annotations

import json
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.load import CLIENTS, PROCESSES, Load
from bench.harness.server import (
    Server,
    installed,
    settle,
    start_process,
    start_tfsupervisor,
)
from bench.harness.transport import (
    Codec,
    Grpc,
    Http,
    Inputs,
    Transport,
    Zmq,
    json_codec,
    oip_codec,
    raw_codec,
)
from supervisor.testing import Supervisor, free_port

SKIPPED = "skipped (not installed)"
NO_HTTP_FRONT = "skipped (this tfsupervisor has no HTTP front: supervisor.http unknown)"


@dataclass(frozen=True)
class Variant:
    """One server under test, and how it behaves.

    ``server``: "tfsupervisor"; "script" (a peer's server script, ``script`` after the
    workload's loader, run as ``command``); or "ceiling" (no server: the bench's own loop).
    ``front``: how clients reach tfsupervisor: "zmq" (its Client), "http" (its Open
    Inference Protocol v2 front, ``supervisor.http``) or "grpc" (the same protocol over
    gRPC, ``supervisor.grpc``, raw tensors). ``body``: an HTTP server's body,
    "raw", "json" or "oip". ``wait_ms``: its batch wait (None: the run's common wait);
    ``adaptive``: tfsupervisor with ``batch_timeout_ms`` unset, so the wait adapts.
    """

    name: str
    label: str
    server: str = "tfsupervisor"
    front: str = "zmq"
    modules: tuple[str, ...] = ()  # must import (as must tensorflow, for every server)
    script: str = ""
    # {python} {bin} (its directory) {script} {module} (the script's) {port} substituted
    command: tuple[str, ...] = ("{python}", "{script}")
    args: tuple[str, ...] = ()  # after command
    path: str = "/"  # an HTTP server's route
    body: str = "raw"
    wait_ms: float | None = None
    adaptive: bool = False

    def wait(self, common: float) -> float:
        return common if self.wait_ms is None else self.wait_ms


def skipped(variant: Variant) -> str | None:
    """Why ``variant`` cannot run here (its packages, or the HTTP front), else None."""
    if variant.front in ("http", "grpc") and not http_front():
        return NO_HTTP_FRONT
    if variant.front == "grpc" and not installed(("grpc", "tritonclient.grpc")):
        return SKIPPED
    if variant.server != "ceiling" and not installed(variant.modules):
        return SKIPPED
    return None


def http_front() -> bool:
    """Whether this tfsupervisor's config takes ``supervisor.http`` (its HTTP front)."""
    from supervisor.config.loading import parse_config
    from supervisor.config.settings import ConfigErrors

    config = {"supervisor": {"http": {"listen": "127.0.0.1:1"}},
              "models": {"m": {"handler": "worker.handlers:echo"}}}
    try:
        parse_config(json.dumps(config))
    except ConfigErrors:
        return False
    return True


@dataclass(frozen=True)
class Workload:
    """A model, its traffic and its answers, and how each kind of server serves it.

    ``requests(seed)``: an endless stream of one request's inputs (as tfsupervisor takes
    them; an HTTP body carries the first input). ``check``: raises unless an answer's values
    are right. ``loader``: the peers' script head (``scripts.LOAD`` plus this workload's
    forward_raw, from_json, predict_rows, to_json). ``config(model, wait_ms, adaptive)``:
    tfsupervisor's config. ``json_in``/``json_out``: the JSON body's fields.
    """

    model: str  # its name in tfsupervisor's config
    output: str  # the output answered
    requests: Callable[[int], Iterator[Inputs]]
    check: Callable[[np.ndarray], None]
    probe: Inputs
    loader: str
    config: Callable[[Path, float, bool], dict[str, Any]]
    json_in: str
    json_out: str
    env: dict[str, str] = field(default_factory=dict)  # the scripts' $PEERS_INPUTS, ...

    def codec(self, body: str) -> Codec:
        if body == "oip":
            return oip_codec(self.output)
        return json_codec(self.json_in, self.json_out) if body == "json" else raw_codec()

    def load(self, transport: Transport, clients: int = CLIENTS,
             processes: int = PROCESSES) -> Load:
        return Load(transport, self.requests, self.check, clients, processes)

    def script_env(self, model: Path, port: int = 0, wait_ms: float = 0.0) -> dict[str, str]:
        return {**os.environ, "PEERS_MODEL": str(model), "PEERS_PORT": str(port),
                "PEERS_WAIT_MS": f"{wait_ms:g}", "TF_CPP_MIN_LOG_LEVEL": "2",
                "PYTHONUNBUFFERED": "1", "RAY_USAGE_STATS_ENABLED": "0", **self.env}

    def write_script(self, workdir: Path, name: str, script: str) -> Path:
        """``loader`` + ``script`` as workdir/NAME.py (NAME made an importable module name)."""
        path = workdir / f"{re.sub(r'[^0-9A-Za-z_]', '_', name)}.py"
        path.write_text(textwrap.dedent(self.loader) + textwrap.dedent(script))
        return path

    def start(self, variant: Variant, model: Path, workdir: Path, wait_ms: float) -> Server:
        """``variant`` started on ``model``, once it answers a real request right."""
        if variant.server == "tfsupervisor":
            server = self._start_tfsupervisor(variant, model, variant.wait(wait_ms))
            server.wait_answering(self.probe, self.check)
            return server
        port = free_port()
        script = self.write_script(workdir, f"{self.model}_{variant.name}", variant.script)
        names = {"python": sys.executable, "bin": str(Path(sys.executable).parent),
                 "script": str(script), "module": script.stem, "port": port}
        command = [c.format(**names) for c in (*variant.command, *variant.args)]
        transport = Http(port, variant.path, self.codec(variant.body))
        server, proc = start_process(script.stem, command, workdir,
                                     self.script_env(model, port, variant.wait(wait_ms)),
                                     transport)
        server.name = variant.name
        server.wait_answering(self.probe, self.check, proc.poll)
        return server

    def _start_tfsupervisor(self, variant: Variant, model: Path, wait_ms: float) -> Server:
        config = self.config(model, wait_ms, variant.adaptive)
        if variant.front == "http":
            port = free_port()
            config["supervisor"] = {**config.get("supervisor", {}),
                                    "http": {"listen": f"127.0.0.1:{port}"}}

            def transport(sup: Supervisor) -> Transport:
                return Http(port, f"/v2/models/{self.model}/infer", self.codec("oip"))
        elif variant.front == "grpc":
            port = free_port()
            config["supervisor"] = {**config.get("supervisor", {}),
                                    "grpc": {"listen": f"127.0.0.1:{port}"}}

            def transport(sup: Supervisor) -> Transport:
                return Grpc(port, self.model)
        else:
            def transport(sup: Supervisor) -> Transport:
                return Zmq(sup.endpoint, self.model, self.output)
        return start_tfsupervisor(variant.name, config, transport)


def failed(exc: BaseException) -> dict[str, Any]:
    return {"error": f"{type(exc).__name__}: {exc}"[:2000]}


def interleaved(variants: list[Variant], rounds: int,
                one: Callable[[Variant, int], dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each round, each variant in turn, once the machine is idle: ``one(variant, round)``'s
    row (or the error it raised), with how busy the machine was before it."""
    results: dict[str, list[dict[str, Any]]] = {v.name: [] for v in variants}
    for r in range(rounds):
        for variant in variants:
            print(f"round {r + 1}/{rounds}: {variant.name}", flush=True)
            busy = settle()
            try:
                row = one(variant, r)
            except Exception as exc:
                row = failed(exc)
            results[variant.name].append({**row, "machine_busy_before_pct": busy})
    return results
