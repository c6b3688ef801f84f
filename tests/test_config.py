"""Config validation: every error names its path and what was expected."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from supervisor.config import config_schema, load_config, parse_config
from supervisor.settings import ConfigErrors

REPO = Path(__file__).resolve().parent.parent
MINIMAL = "models: {demo: {handler: 'worker.handlers:echo'}}\n"


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigErrors) as info:
        parse_config(text)
    return [str(e) for e in info.value.errors]


def test_minimal_config_has_safe_defaults() -> None:
    config = parse_config(MINIMAL)
    demo = config.models["demo"]
    assert demo.workers == 1
    assert demo.policy.memory_metric == "rss"
    assert demo.policy.max_concurrent_recycles == 1 and demo.policy.surge is True
    assert demo.policy.max_attempts == 2
    assert config.supervisor.poll_interval == 1.0
    assert config.supervisor.endpoints[0].startswith("ipc://")
    assert config.supervisor.endpoints[0].endswith("/run/frontend.sock")


def test_the_shipped_config_is_valid() -> None:
    config = load_config(REPO / "config.yaml")
    assert config.models["demo"].workers == 2
    assert config.models["demo"].saved_model == str(REPO / "models" / "demo")


def test_error_names_path_and_expectation() -> None:
    assert errors_of("models: {demo: {handler: 'a:b', workers: two}}") == [
        'models.demo.workers: expected a positive integer, got "two"']


def test_unknown_key_suggests() -> None:
    (error,) = errors_of(MINIMAL + "supervisor: {pol_interval: 2s}")
    assert error.startswith("supervisor.pol_interval: unknown key (did you mean "
                            "'poll_interval'?)")
    (error,) = errors_of("models: {demo: {handler: 'a:b', polciy: {}}}")
    assert "did you mean 'policy'" in error


def test_all_errors_reported_together() -> None:
    errors = errors_of("""
supervisor: {max_queue: 0, poll_interval: fast}
defaults: {policy: {jitter: 2}}
models:
  a: {saved_model: x, keras: y}
  b: {handler: nocolon}
  c: {handler: 'm:f', policy: {max_memory: 2GiB, kill_memory: 1GiB, memory_metric: vss}}
""")
    text = "\n".join(errors)
    assert "supervisor.max_queue: expected a positive integer, got 0" in text
    assert "supervisor.poll_interval: expected a duration" in text
    assert "defaults.policy.jitter: expected a number >= 0.0 and <= 0.5, got 2" in text
    assert "models.a: expected exactly one of saved_model, keras, handler; got saved_model, " \
           "keras" in text
    assert 'models.b.handler: expected "module:factory", got "nocolon"' in text
    assert "models.c.policy.memory_metric: expected one of rss, uss, pss" in text
    assert len(errors) == 6


def test_kill_memory_must_exceed_max_memory() -> None:
    (error,) = errors_of("models: {m: {handler: 'a:b', policy: {max_memory: 2GiB, "
                         "kill_memory: 1GiB}}}")
    assert error == "models.m.policy.kill_memory: must be larger than max_memory"


def test_batch_size_is_bounded_by_what_one_message_may_list() -> None:
    (error,) = errors_of("models: {m: {handler: 'a:b', batching: {max_batch_size: 5000}}}")
    assert error == ("models.m.batching.max_batch_size: expected a positive integer and "
                     "<= 4096, got 5000")


def test_defaults_policy_lies_under_model_policy() -> None:
    config = parse_config("defaults: {policy: {max_jobs: 500, jitter: 0.2}}\n"
                          "models: {a: {handler: 'm:f', policy: {max_jobs: 10}}, "
                          "b: {handler: 'm:f'}}")
    assert config.models["a"].policy.max_jobs == 10
    assert config.models["a"].policy.jitter == 0.2
    assert config.models["b"].policy.max_jobs == 500


def test_units_in_values() -> None:
    config = parse_config("models: {a: {handler: 'm:f', policy: {max_memory: 1.5GiB, "
                          "max_age: 24h, drain_timeout: 90}}}")
    policy = config.models["a"].policy
    assert policy.max_memory == 3 * 2**29
    assert policy.max_age == 86400.0
    assert policy.drain_timeout == 90.0


@pytest.mark.parametrize(("text", "fragment"), [
    ("", "models: expected at least one model"),
    ("[1, 2]", "expected a mapping at the top"),
    ("models: {demo: {handler: 'a:b'}}\nsupervisor: {endpoints: ['http://x']}",
     "supervisor.endpoints[0]: expected an ipc:// or tcp:// endpoint"),
    ("models: {demo: {handler: 'a:b'}}\nsupervisor: {runtime_dir: '/tmp/" + "x" * 120 + "'}",
     "longer than the 107"),
    ("models: {'bad name!': {handler: 'a:b'}}", "expected a name of letters"),
    ("models: {demo: {handler: 'a:b', env: {A: [1]}}}", "models.demo.env.A: expected a string"),
    ("models: {demo: {handler: 'a:b'}}\nsupervisor: {heartbeat_timeout: 1s}",
     "more than twice heartbeat_interval"),
    ("models: {demo: {}}", "got none"),
    ("{{{", "not valid YAML"),
])
def test_invalid_configs(text: str, fragment: str) -> None:
    assert fragment in "\n".join(errors_of(text))


def test_relative_paths_resolve_beside_the_config(tmp_path: Path) -> None:
    file = tmp_path / "conf.yaml"
    file.write_text("models: {m: {saved_model: models/m}}")
    config = load_config(file)
    assert config.models["m"].saved_model == str(tmp_path / "models" / "m")
    assert config.runtime_dir == tmp_path / "run"


def test_runtime_directory_from_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNTIME_DIRECTORY", "/run/tfsupervisor:/run/other")
    config = parse_config(MINIMAL)
    assert config.supervisor.control == "ipc:///run/tfsupervisor/control.sock"


def test_schema_validates_the_shipped_config_and_rejects_typos() -> None:
    schema = config_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    shipped = yaml.safe_load((REPO / "config.yaml").read_text())
    jsonschema.validate(shipped, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"models": {"m": {"handler": "a:b", "wokers": 2}}}, schema)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "supervisor", *args], capture_output=True,
                          text=True, timeout=60)


def test_check_command_exit_codes(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(MINIMAL)
    out = _cli("check", "-c", str(good))
    assert out.returncode == 0
    assert out.stdout.count("\n") == 1 and "OK" in out.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: {demo: {handler: 'a:b', workers: two}}")
    out = _cli("check", "-c", str(bad))
    assert out.returncode == 1
    assert 'models.demo.workers: expected a positive integer, got "two"' in out.stderr
    out = _cli("check", "-c", str(tmp_path / "missing.yaml"))
    assert out.returncode == 1 and "cannot read" in out.stderr


def test_schema_command_prints_json() -> None:
    out = _cli("schema")
    assert out.returncode == 0
    assert "max_growth_per_1k_jobs" in json.loads(out.stdout)["properties"]["defaults"][
        "properties"]["policy"]["properties"]


def test_configuration_reference_is_current() -> None:
    from supervisor.config import config_reference

    doc = (REPO / "docs" / "configuration.md").read_text()
    assert doc.strip() == config_reference().strip(), \
        "regenerate: tfsupervisor schema --markdown > docs/configuration.md"
