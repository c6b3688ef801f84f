"""Config validation: every error names its path and what was expected."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jsonschema
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.config.loading import config_schema, load_config, parse_config
from supervisor.config.settings import ConfigErrors

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
        'models.demo.workers: expected an integer from 1 to 256, got "two"']


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
    assert error == ("models.m.batching.max_batch_size: expected an integer from 1 to "
                     "4096, got 5000")


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
    assert 'models.demo.workers: expected an integer from 1 to 256, got "two"' in out.stderr
    out = _cli("check", "-c", str(tmp_path / "missing.yaml"))
    assert out.returncode == 1 and "cannot read" in out.stderr


def test_schema_command_prints_json() -> None:
    out = _cli("schema")
    assert out.returncode == 0
    assert "max_growth_per_1k_jobs" in json.loads(out.stdout)["properties"]["defaults"][
        "properties"]["policy"]["properties"]


def test_output_piped_to_a_reader_that_stops_is_not_an_error() -> None:
    """`tfsupervisor schema --markdown | head -1`: the reader goes away before the end."""
    cli = subprocess.Popen([sys.executable, "-m", "supervisor", "schema", "--markdown"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO)
    assert cli.stdout is not None and cli.stderr is not None
    cli.stdout.close()  # before the command (seconds to import) writes its first line
    assert cli.wait(60) == 0
    assert "BrokenPipeError" not in cli.stderr.read().decode()


def test_configuration_reference_is_current() -> None:
    from supervisor.config.loading import config_reference

    doc = (REPO / "docs" / "configuration.md").read_text()
    assert doc.strip() == config_reference().strip(), \
        "regenerate: tfsupervisor schema --markdown > docs/configuration.md"


# --- hostile files: only ConfigErrors, with the path where one can be named ----------------

NAN, INF = ".nan", ".inf"
BIG = "9" * 400


@pytest.mark.parametrize(("setting", "value", "fragment"), [
    ("supervisor: {max_queue_bytes: %s}", INF, "supervisor.max_queue_bytes: expected a finite "
     "size, got inf"),
    ("supervisor: {max_message_size: %s}", "-" + INF, "supervisor.max_message_size: expected "
     "a finite size"),
    ("supervisor: {max_header_size: %s}", NAN, "supervisor.max_header_size: expected a finite"),
    ("supervisor: {max_queue_bytes: %s}", BIG, "supervisor.max_queue_bytes: expected a size of "
     "at most 2**63-1 bytes (8 EiB), got an integer of 400 digits"),
    ("supervisor: {max_queue_bytes: '%s'}", BIG, "supervisor.max_queue_bytes: expected a size"),
    ("supervisor: {max_queue_bytes: 8388608TiB}", "", "at most 2**63-1 bytes"),
    ("supervisor: {poll_interval: %s}", NAN, "supervisor.poll_interval: expected a finite "
     "duration, got nan"),
    ("supervisor: {start_timeout: %s}", INF, "supervisor.start_timeout: expected a finite"),
    ("supervisor: {shutdown_timeout: %s}", BIG, "supervisor.shutdown_timeout: expected a "
     "duration of at most 10 years"),
    ("supervisor: {shutdown_timeout: 3651d}", "", "at most 10 years"),
    ("supervisor: {max_queue: %s}", BIG, "supervisor.max_queue: expected a positive integer of "
     "at most 2**63-1, got an integer of 400 digits"),
    ("defaults: {policy: {jitter: %s}}", NAN, "defaults.policy.jitter: expected a finite number"),
    ("defaults: {policy: {max_memory: %s}}", INF, "defaults.policy.max_memory: expected a "
     "finite size"),
    ("supervisor: {runtime_dir: \"run\\0dir\"}", "", "supervisor.runtime_dir: must not contain "
     "a NUL character"),
    ("supervisor: {endpoints: [\"ipc://x\\0y\"]}", "", "supervisor.endpoints[0]: must not "
     "contain a NUL"),
    ("supervisor: {metrics: \"\\0\"}", "", "supervisor.metrics: must not contain a NUL"),
    # past these a value is a typo: a busy loop, a stuck queue, more TF processes than a host
    ("supervisor: {poll_interval: 1ms}", "", "supervisor.poll_interval: expected at least "
     "0.05s, got \"1ms\""),
    ("models: {m: {handler: a:b, batching: {batch_timeout_ms: 1.0e+300}}}", "",
     "models.m.batching.batch_timeout_ms: expected a number >= 0.0 and <= 60000.0"),
    ("models: {m: {handler: a:b, workers: 100000}}", "", "models.m.workers: expected an "
     "integer from 1 to 256, got 100000"),
    ("defaults: {policy: {max_memory: \"1e3\"}}", "", "defaults.policy.max_memory: expected "
     "a size such as 512MiB, 2GB or a number of bytes, got \"1e3\": YAML 1.1 reads a number "
     "with an exponent as text unless it has a dot and a signed exponent; write 1.0e+03"),
    ("defaults: {policy: {warmup_seconds: 2.5E2}}", "", "write 2.5e+02, or the number in full"),
])
def test_hostile_values_name_their_path(setting: str, value: str, fragment: str) -> None:
    text = MINIMAL + (setting % value if "%s" in setting else setting)
    assert fragment in "\n".join(errors_of(text))


@pytest.mark.parametrize(("model", "fragment"), [
    ("{saved_model: \"m\\0\"}", "models.demo.saved_model: must not contain a NUL"),
    ("{handler: \"a:b\\0\"}", "models.demo.handler: must not contain a NUL"),
    ("{handler: 'a:b', batching: {batch_timeout_ms: .inf}}",
     "models.demo.batching.batch_timeout_ms: expected a finite number, got inf"),
    ("{handler: 'a:b', batching: {batch_timeout_ms: " + BIG + "}}",
     "models.demo.batching.batch_timeout_ms: expected a number >= 0.0"),
    ("{handler: 'a:b', env: {A: \"x\\0y\"}}", "models.demo.env.A: must not contain a NUL"),
    ("{handler: 'a:b', env: {\"A\\0\": x}}", "models.demo.env.'A\\x00': must not contain"),
    ("{handler: 'a:b', env: {\"A=B\": x}}", "models.demo.env.A=B: an environment variable "
     "name must be non-empty and without '='"),
    ("{handler: 'a:b', env: {A: " + BIG + "}}", "models.demo.env.A: expected a string, got an "
     "integer of 400 digits"),
    ("{handler: 'a:b', workers: " + BIG + "}", "models.demo.workers: expected an integer "
     "from 1 to 256, got an integer of 400 digits"),
])
def test_hostile_model_values(model: str, fragment: str) -> None:
    assert fragment in "\n".join(errors_of(f"models: {{demo: {model}}}"))


@pytest.mark.parametrize(("text", "fragment"), [
    ("a: " + "1" * 5000, "not valid YAML: Exceeds the limit (4300 digits)"),
    ("a: 2024-13-45", "not valid YAML: month must be in 1..12"),
    # libyaml stops it itself ("exceeded maximum nesting depth"); Python's parser would
    # run out of stack ("nested too deeply"): either way a clear refusal, no traceback
    ("a: " + "[" * 5000, "not valid YAML: "),
    ("a: \x00", "not valid YAML"),
    ("{" + BIG + ": 1}", "unknown key"),
])
def test_yaml_that_python_cannot_build(text: str, fragment: str) -> None:
    assert fragment in "\n".join(errors_of(text))


def test_non_utf8_and_oversized_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    file = tmp_path / "latin1.yaml"
    file.write_bytes("models: {démo: {handler: 'a:b'}}".encode("latin-1"))
    with pytest.raises(ConfigErrors) as info:
        load_config(file)
    assert str(info.value) == f"{file} is not UTF-8 text: byte 0xe9 at offset 10"
    file.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())  # a UTF-8 BOM is fine
    assert load_config(file).models["demo"].workers == 1
    big = tmp_path / "big.yaml"  # the limit in its own unit: it said "larger than 0 MiB"
    big.write_bytes(b"#" * (300 * 1024))
    with pytest.raises(ConfigErrors, match=r"larger than 256\.0KiB: not a config file"):
        load_config(big)
    monkeypatch.setattr("supervisor.config.loading.MAX_CONFIG_BYTES", 16)
    with pytest.raises(ConfigErrors, match="larger than 16B: not a config file"):
        load_config(file)
    with pytest.raises(ConfigErrors, match="cannot read"):
        load_config(tmp_path)  # a directory


def test_unexpected_errors_become_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: object) -> None:
        raise KeyError("surprise")

    monkeypatch.setattr("supervisor.config.loading._resolve_paths", broken)
    with pytest.raises(ConfigErrors) as info:
        parse_config(MINIMAL)
    assert str(info.value) == ("the configuration could not be checked: unexpected KeyError: "
                               "'surprise'")


def test_max_queue_bytes() -> None:
    assert parse_config(MINIMAL).supervisor.max_queue_bytes == 256 * 1024**2
    config = parse_config(MINIMAL + "supervisor: {max_queue_bytes: 1GiB}")
    assert config.supervisor.max_queue_bytes == 1024**3
    assert "supervisor.max_queue_bytes: expected a size" in \
        "\n".join(errors_of(MINIMAL + "supervisor: {max_queue_bytes: lots}"))


def test_integers_in_the_schema_fit_int64() -> None:
    props = config_schema()["properties"]["supervisor"]["properties"]
    assert props["max_queue"]["maximum"] == 2**63 - 1


SPECIAL_VALUES = st.sampled_from([
    float("inf"), float("-inf"), float("nan"), 10**400, -(10**400), 2**63, 2**63 - 1, -1, 0,
    1e308, -0.0, "\0", "a\0b", "ipc://x\0", "1.5GiB", "30s", "8388608TiB", "3651d", "9" * 400,
    "", "a:b", "=", True, None, [], {}])
yaml_values = st.recursive(
    SPECIAL_VALUES | SPECIAL_VALUES | st.none() | st.booleans() | st.integers() | st.floats()
    | st.text(max_size=12) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=6) | st.integers() | SPECIAL_VALUES.filter(lambda v: isinstance(v, str)),
        inner, max_size=3),
    max_leaves=8)


def _setting_paths() -> list[tuple[str, ...]]:
    from supervisor.config.keys import (
        BatchingConfig,
        CurveConfig,
        ModelConfig,
        PolicyConfig,
        SupervisorSection,
        TfConfig,
    )
    from supervisor.config.settings import section_fields

    def names(cls: type) -> list[str]:
        return [f.name for f in section_fields(cls)]

    paths = [("supervisor", n) for n in names(SupervisorSection)]
    paths += [("supervisor", "curve", n) for n in names(CurveConfig)]
    paths += [("models", "m", n) for n in names(ModelConfig)]
    for section, cls in (("policy", PolicyConfig), ("tf", TfConfig),
                         ("batching", BatchingConfig)):
        paths += [("models", "m", section, n) for n in names(cls)]
    paths += [("defaults", "policy", n) for n in names(PolicyConfig)]
    paths += [("models",), ("models", "m"), ("supervisor",), ("defaults",), ("x",)]
    return paths


def _only_config_errors(text: str) -> None:
    try:
        parse_config(text)
    except ConfigErrors as errors:
        assert errors.errors and all(isinstance(e.message, str) for e in errors.errors)


@settings(max_examples=600, deadline=None)
@given(st.sampled_from(_setting_paths()), yaml_values)
def test_fuzzed_setting_values_raise_only_config_errors(path: tuple[str, ...],
                                                        value: object) -> None:
    doc: dict[str, object] = {"models": {"m": {"handler": "a:b"}}}
    node = doc
    for key in path[:-1]:
        child = node.get(key)
        node[key] = child = dict(child) if isinstance(child, dict) else {}
        node = child
    node[path[-1]] = value
    try:
        text = yaml.safe_dump(doc)
    except (yaml.YAMLError, ValueError):  # a value yaml itself cannot write
        return
    _only_config_errors(text)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_fuzzed_text_raises_only_config_errors(text: str) -> None:
    _only_config_errors(text)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200) | st.text(max_size=100).map(lambda t: (MINIMAL + t).encode()))
def test_fuzzed_files_raise_only_config_errors(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        file = Path(folder) / "config.yaml"
        file.write_bytes(data)
        try:
            load_config(file)
        except ConfigErrors as errors:
            assert errors.errors


def test_job_timeout_of_zero_is_refused() -> None:
    with pytest.raises(ConfigErrors) as err:
        parse_config("models: {m: {handler: 'a:b', policy: {job_timeout: 0}}}")
    assert "models.m.policy.job_timeout: must be more than 0" in str(err.value)


def test_reload_plan_names_changed_supervisor_settings() -> None:
    from supervisor.core import reload_plan as reloading

    old = parse_config("models: {m: {handler: 'a:b'}}\nsupervisor: {max_queue: 50}")
    new = parse_config("models: {m: {handler: 'a:b'}}\nsupervisor: {max_queue: 3}")
    assert reloading.plan(old, new).summary() == {"settings": ["supervisor.max_queue"]}


def test_a_lead_shorter_than_one_start_up_is_refused() -> None:
    for lead in (0.01, 0.5, 0.99):
        with pytest.raises(ConfigErrors) as raised:
            parse_config(f"defaults: {{policy: {{trend_lead: {lead}}}}}\nmodels: {{m: "
                         "{handler: 'a:b'}}", Path("/tmp/c.yaml"))
        assert "trend_lead" in str(raised.value)
    for lead in (0, 1, 3.5):
        parse_config(f"defaults: {{policy: {{trend_lead: {lead}}}}}\nmodels: {{m: "
                     "{handler: 'a:b'}}", Path("/tmp/c.yaml"))


@pytest.mark.parametrize(("text", "message"), [
    ("supervisor: {start_timeout: 0}", "supervisor.start_timeout: expected at least 1s, got 0"),
    ("supervisor: {shutdown_timeout: 0s}", "supervisor.shutdown_timeout: expected at least 1s"),
    ("supervisor: {shutdown_timeout: 0.5}", "supervisor.shutdown_timeout: expected at least 1s"),
    ("supervisor: {max_header_size: 0}", "supervisor.max_header_size: expected at least 128"),
    ("supervisor: {max_message_size: 0}", "supervisor.max_message_size: expected at least "
     "1024 bytes"),
    ("supervisor: {max_message_size: 1000B}", "supervisor.max_message_size: expected at least"),
    ("supervisor: {max_queue_bytes: 0}", "supervisor.max_queue_bytes: expected at least 1 byte"),
    ("models: {m: {handler: 'a:b', policy: {drain_timeout: 0}}}",
     "models.m.policy.drain_timeout: expected at least 1s"),
])
def test_values_that_could_never_serve_are_refused(text: str, message: str) -> None:
    """0 parsed as a size or a duration, then every worker was killed at start or every
    job refused: each bound says its floor, under the setting's path."""
    base = "" if text.startswith("models") else MINIMAL
    errors = "\n".join(errors_of(base + text))
    assert message in errors


def test_aliases_that_expand_past_any_config_are_refused_at_once() -> None:
    """A 500-byte file of aliases nested seven deep is ten million values: each worker
    spawn expanded it (its options travel as JSON), froze the daemon's loop for seconds and
    failed with E2BIG. check and reload refuse it, without expanding it."""
    levels = ["      a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    levels += [f"      a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 7)]
    text = "models:\n  m:\n    handler: worker.handlers:echo\n    options:\n" + \
        "\n".join(levels) + "\n"
    started = time.monotonic()
    with pytest.raises(ConfigErrors, match="holds more than 100,000 values"):
        parse_config(text)
    assert time.monotonic() - started < 5
    shared = "models:\n  m:\n    handler: worker.handlers:echo\n    options:\n" + \
        "\n".join(levels[:3]) + "\n"  # a thousand values through aliases: fine
    parse_config(shared)


def test_options_that_could_never_reach_a_worker_are_refused_by_check() -> None:
    """Options travel to the worker as JSON in its environment. check used to pass what
    every spawn then failed on: a long string aliased 90,000 times (900 MB expanded, the
    daemon stalled seconds per spawn, then E2BIG), a 1 MiB string, a date or NaN."""
    head = "models:\n  m:\n    handler: worker.handlers:echo\n    options:\n"
    aliased = head + f"      s: &s \"{'x' * 10_000}\"\n      l: [" + \
        ", ".join(["*s"] * 9_000) + "]\n"
    started = time.monotonic()
    with pytest.raises(ConfigErrors, match=r"models\.m\.options: about .* KiB travel to a worker"):
        parse_config(aliased)
    assert time.monotonic() - started < 5
    with pytest.raises(ConfigErrors, match="KiB travel to a worker"):
        parse_config(head + f"      big: \"{'y' * 70_000}\"\n")
    for value, said in (("2024-01-01", "is a date"), (".nan", "is nan"), ("!!binary aGVsbG8=",
                                                                       "is a bytes")):
        with pytest.raises(ConfigErrors, match=f"models.m.options: options.v {said}"):
            parse_config(head + f"      v: {value}\n")
    parse_config(head + "      v: [1, 2.5, text, null, true, {k: v}]\n")  # JSON values: fine


def test_a_yaml_error_names_the_config_file(tmp_path: Path) -> None:
    """Not '<unicode string>': the file is read first, then parsed as text."""
    path = tmp_path / "config.yaml"
    path.write_text('models:\n  m: {handler: "x:y"\n  n: 3\n')
    with pytest.raises(ConfigErrors) as caught:
        load_config(path)
    message = str(caught.value.errors[0])
    assert f'in "{path}", line 2' in message and "unicode string" not in message, message
