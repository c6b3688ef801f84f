"""A newcomer's first minutes (issue 47, item 6): the README says what is a default, how to
send sequences of different lengths works as docs/batching.md shows it, and the one-command
leak demo of the README's tour does what it says within a bounded time."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from dataclasses import MISSING
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from supervisor.client import Client
from supervisor.config.keys import ModelConfig, PolicyConfig, SupervisorSection, TfConfig
from supervisor.config.settings import section_fields
from tests.conftest import short_tmpdir

REPO = Path(__file__).resolve().parent.parent
SOURCES = ("saved_model", "keras", "handler")  # what to serve: no default to tell


def _block(text: str, after: str, language: str) -> str:
    start = text.index(f"```{language}\n", text.index(after)) + len(language) + 4
    return text[start:text.index("```", start)]


def _defaults(section: type) -> dict[str, Any]:
    return {f.name: (f.metadata["kind"], f.default_factory() if f.default is MISSING
                     else f.default) for f in section_fields(section)}


def test_the_readme_config_block_says_which_values_are_defaults() -> None:
    """A value shown that is not the default says so: on its line ("default X"), or under
    a comment that says it is off by default. A newcomer read `max_memory: 2GiB` under
    "defaults are safe for TF" as a cap that was on."""
    block = _block((REPO / "README.md").read_text(), "## What the config means", "yaml")
    config = yaml.safe_load(block)
    sections = {"supervisor": (_defaults(SupervisorSection), config["supervisor"]),
                "model": (_defaults(ModelConfig), config["models"]["demo"]),
                "policy": (_defaults(PolicyConfig), config["models"]["demo"]["policy"])}
    lines = block.splitlines()
    checked = 0
    for section, (declared, values) in sections.items():
        for name, value in values.items():
            if name not in declared or name in SOURCES or \
                    (isinstance(value, dict) and name != "tf"):
                continue
            kind, default = declared[name]
            line_no = next(i for i, line in enumerate(lines)
                           if re.match(rf"\s*{name}:", line))
            line = lines[line_no]
            is_default = name != "tf" and default is not None and \
                kind.parse(value, name) == kind.parse(default, name)
            said = "# default" in line or (section == "supervisor" and
                                           "every value here is the default" in lines[0])
            if name == "tf":  # a flow mapping: its values are not TfConfig's defaults
                is_default = all(kind_default[1] == value[k]
                                 for k, kind_default in _defaults(TfConfig).items()
                                 if k in value)
            if is_default:
                assert said or "default" in line, (name, line)
            else:
                earlier = "\n".join(lines[:line_no])
                off = earlier.rfind("Off by default") > earlier.rfind("On by default")
                assert re.search(r"default \S", line) or off, (name, line)
                assert not line.rstrip().endswith("# default"), (name, line)
            checked += 1
    assert checked >= 9
    assert "defaults are safe for TF" not in block


def test_sequences_of_different_lengths_are_sent_as_the_docs_say(
        supervisor_factory: Any) -> None:
    """docs/batching.md's snippet, run as written: each sequence its own job, sent at
    once, each padded with a mask of its own and cut back to its own length; and the
    pitfall it names: rows padded by the client into one job are all marked real."""
    specs = {"input_ids": {"dtype": "int32", "shape": [None, None]},
             "attention_mask": {"dtype": "int32", "shape": [None, None]}}
    sup = supervisor_factory({"models": {"text": {
        "handler": "worker.handlers:echo", "workers": 1, "options": {"inputs": specs},
        "batching": {"max_batch_size": 8},
        "padding": {"seq": {"inputs": {"input_ids": 1}, "sizes": [4, 8, 16], "value": 0,
                            "mask_input": "attention_mask",
                            "outputs": {"input_ids": 1, "attention_mask": 1}}}}}})
    snippet = _block((REPO / "docs" / "batching.md").read_text(),
                     "### Several sequences of different lengths", "python")
    assert '"ipc://run/frontend.sock"' in snippet
    sequences = [[101, 7592, 102], [101, 2088, 2003, 102], list(range(1, 12)), [5]]
    scope: dict[str, Any] = {"sequences": sequences}
    exec(snippet.replace("ipc://run/frontend.sock", sup.endpoint), scope)
    for ids, out in zip(sequences, scope["outputs"], strict=True):
        assert out["input_ids"].tolist() == [ids]
        assert out["attention_mask"].tolist() == [[1] * len(ids)]
    padded = np.array([[101, 7592, 102, 0], [101, 2088, 2003, 102]], dtype=np.int32)
    with Client(sup.endpoint, timeout=30) as client:
        out = client.infer("text", {"input_ids": padded})
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1]] * 2  # the client's 0 "real"
    readme = (REPO / "README.md").read_text()
    assert "send sequences of different lengths as separate jobs" in readme


def test_the_readme_leak_demo_recycles_the_leak_and_loses_no_job() -> None:
    """The tour's one command, as written (its own copy of the config, so that its sockets
    do not meet a demo run by hand): within the README's "under a minute" (with slack for
    a loaded machine) the leaking workers are recycled for their trend, with its named
    cause, their replacements serve, and every job sent is answered."""
    readme = (REPO / "README.md").read_text()
    assert "\n.venv/bin/python examples/leak_demo.py\n" in readme
    workdir = short_tmpdir()
    try:
        config = workdir / "leak.yaml"
        shutil.copy(REPO / "examples" / "leak.yaml", config)
        started = time.monotonic()
        out = subprocess.run([sys.executable, str(REPO / "examples" / "leak_demo.py"),
                              "-c", str(config), "--limit", "100"],
                             capture_output=True, text=True, timeout=150)
        took = time.monotonic() - started
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "worker_recycling: worker=leaky-1, reason=growth_per_1k_jobs" in text, text
    assert "cause=python_objects" in text
    assert re.search(r"leaky-\d .*\+1\d\d\.\dMiB .*growing: Python objects", text), text
    assert "worker_ready: worker=leaky-3" in text
    assert re.search(r"worker_exited: worker=leaky-1, reason=growth_per_1k_jobs.*exit 0", text)
    summary = re.search(r"jobs: (\d+) sent, (\d+) answered, 0 failed; recycles: "
                        r"\{'growth_per_1k_jobs': [2-9]\}; daemon exit 0", text)
    assert summary and summary[1] == summary[2] and int(summary[1]) > 300, text[-2000:]
    assert took < 100, took
