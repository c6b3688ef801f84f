"""deploy/kubernetes/, rendered and checked offline (no cluster, no network).

- Both renderings (the base, the GPU overlay) come from tests/kustomize.py, a pure-Python
  kustomize of the features the manifests use; where kubectl exists, `kubectl kustomize`
  renders them too and must give the same objects.
- Every object validates against the Kubernetes OpenAPI schemas bundled in
  kubernetes-validate (strict: an unknown field is an error), for the oldest and newest
  Kubernetes these manifests claim; the two custom resources (ServiceMonitor, ScaledObject)
  against a schema of the fields they use, with their metadata checked as ObjectMeta.
- The ConfigMap's config.yaml is loaded with the daemon's own loader and passes `check`
  with the pod's volumes laid out as the kubelet mounts them (Secrets as symlinks).
- The Deployment cannot drift from it: memory requests and limits against max_memory and
  kill_memory x workers (one replacement included: the rule `check` applies), the grace
  period against the daemon's own drain deadline, probes (httpGet on the metrics port)
  against the daemon's answers, preStop against the CLI, the config's endpoints, ports,
  selectors, and the KEDA triggers against the metrics the daemon exports.
- The KServe example (deploy/kubernetes/kserve/: a ServingRuntime and an InferenceService)
  validates against the schemas of KServe's own CRDs (tests/data/kserve/), strictly, and its
  config against the runtime's container: the HTTP port, probes, memory, grace period.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import jsonschema
import kubernetes_validate
import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from supervisor.cli.commands import build_parser
from supervisor.cli.commands import main as cli_main
from supervisor.config.keys import Config
from supervisor.config.loading import load_config, parse_config
from supervisor.core.budget import Budget, CgroupMemory, sizing_problem
from supervisor.core.core import EXIT_MARGIN, Core
from supervisor.core.lifecycle import STOP_GRACE
from supervisor.daemon.health import Health
from supervisor.daemon.metrics import Metrics
from supervisor.daemon.security import keygen, read_clients
from supervisor.shared.certificates import load_certificate
from tests.conftest import stand_in_saved_model
from tests.kustomize import render

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "kubernetes"
VARIANTS = {"base": DEPLOY / "base", "gpu": DEPLOY / "overlays" / "gpu"}
# The Kubernetes versions the manifests are checked against: the oldest we claim (policy/v1
# PDBs, no beta APIs) and the newest kubernetes-validate knows.
KUBERNETES = ("1.29", kubernetes_validate.utils.latest_version())
# What the container needs besides its workers: the supervisor (tens of MB), the preStop
# hook's `tfsupervisor drain` and an operator's `kubectl exec ... tfsupervisor` (~60 MB
# each; the probes are HTTP and start nothing) and the in-memory emptyDir of the sockets
# (16 MiB at most).
SUPERVISOR_ALLOWANCE = 384 * 1024**2
# Time for the preStop's own `tfsupervisor drain` to start and poll, on a busy node.
PRESTOP_MARGIN = 10.0
CONTAINER = "tfsupervisor"
# How often docs/deployment.md tells clients to resolve the headless Service again.
RESOLVE_EVERY = 10
MODELS_IN_IMAGE = "/opt/tfsupervisor/models"


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def rendered(variant: str) -> list[dict[str, Any]]:
    return render(VARIANTS[variant])


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, (kind, [o["metadata"]["name"] for o in found])
    return found[0]


def container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (found,) = [c for c in pod["containers"] if c["name"] == CONTAINER]
    result: dict[str, Any] = found
    return result


def config_text(objects: list[dict[str, Any]]) -> str:
    text: str = one(objects, "ConfigMap")["data"]["config.yaml"]
    return text


def config_of(objects: list[dict[str, Any]]) -> Config:
    """The ConfigMap's config.yaml through the daemon's own loader, as the pod reads it."""
    return parse_config(config_text(objects), Path(f"{config_mount(objects)}/config.yaml"))


def config_mount(objects: list[dict[str, Any]]) -> str:
    """Where the container mounts the ConfigMap."""
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v["name"] for v in pod["volumes"] if "configMap" in v]
    (mount,) = [m["mountPath"] for m in container(objects)["volumeMounts"]
                if m["name"] == volume]
    return str(mount)


def http_enabled(text: str) -> tuple[str, dict[str, Any]]:
    """(the config's text with its supervisor.http block on, that block). A config may carry
    the block commented out (`  # http:` and its `  #   key: value` lines) until the daemon
    knows the key: it is uncommented here, so that it is checked all the same."""
    http = (yaml.safe_load(text).get("supervisor") or {}).get("http")
    if http is not None:
        return text, dict(http)
    found = re.search(r"^  # http:\n(?:  #   .*\n)+", text, flags=re.M)
    assert found, "no supervisor.http block, not even commented out"
    block = re.sub(r"^  # ?", "  ", found.group(0), flags=re.M)
    text = text[:found.start()] + block + text[found.end():]
    return text, dict(yaml.safe_load(text)["supervisor"]["http"])


def parse_with_http(text: str, file: Path | None = None) -> Config:
    """The config through the daemon's own loader, supervisor.http included."""
    return parse_config(text, file)


def quantity(text: str | int) -> float:
    """A Kubernetes quantity (memory or CPU) as a number."""
    units = {"Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "k": 1e3, "M": 1e6,
             "G": 1e9, "m": 1e-3, "": 1}
    found = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(text))
    assert found and found.group(2) in units, text
    return float(found.group(1)) * units[found.group(2)]


# --- rendering ------------------------------------------------------------------------------

def test_the_manifests_hold_what_a_platform_engineer_expects(variant: str) -> None:
    objects = rendered(variant)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(["Namespace", "ConfigMap", "Deployment", "Service",
                            "PodDisruptionBudget", "ServiceMonitor", "ScaledObject"]), kinds
    namespace = one(objects, "Namespace")["metadata"]["name"]
    assert all(o["metadata"].get("namespace") == namespace for o in objects
               if o["kind"] != "Namespace")
    # The ConfigMap's name carries a hash of its content (a new config rolls the pods), and
    # the Deployment mounts that very name.
    name = one(objects, "ConfigMap")["metadata"]["name"]
    assert re.fullmatch(r"tfsupervisor-config-[a-z0-9]{10}", name), name
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v] == [name]
    assert render(VARIANTS[variant]) == objects  # deterministic


def normalized(objects: list[dict[str, Any]]) -> dict[tuple[str, str], Any]:
    """Objects by kind and name, the ConfigMap's hash suffix left out (see configmap_hash)."""
    text = re.sub(r"(tfsupervisor-config)-[a-z0-9]{10}\b", r"\1-HASH", json.dumps(objects))
    return {(o["kind"], o["metadata"]["name"]): o for o in json.loads(text)}


def test_kubectl_kustomize_renders_the_same_where_kubectl_exists(variant: str) -> None:
    """The pure-Python rendering is what the tests check everywhere; where kubectl exists
    (developers' machines) it must agree with `kubectl kustomize`, object for object.
    Without kubectl, the rendering is still checked for using only what tests/kustomize.py
    implements: it refuses any other kustomization field."""
    ours = normalized(rendered(variant))
    for kustomization in DEPLOY.rglob("kustomization.yaml"):
        fields = set(yaml.safe_load(kustomization.read_text()))
        assert fields <= {"apiVersion", "kind", "namespace", "resources",
                          "configMapGenerator", "images", "patches"}, kustomization
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        return
    out = subprocess.run([kubectl, "kustomize", str(VARIANTS[variant])], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    theirs = normalized([o for o in yaml.safe_load_all(out.stdout) if o])
    assert ours.keys() == theirs.keys()
    for key, obj in ours.items():
        assert obj == theirs[key], key


# --- schemas --------------------------------------------------------------------------------

@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation must not fetch anything: any connection attempt fails the test."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("schema validation tried to reach the network")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


OBJECT_META = {"type": "object", "required": ["name"], "properties": {
    "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
             "maxLength": 253},
    "namespace": {"type": "string"},
    "labels": {"type": "object", "additionalProperties": {"type": "string"}}},
    "additionalProperties": False}
SELECTOR = {"type": "object", "required": ["matchLabels"], "additionalProperties": False,
            "properties": {"matchLabels": {"type": "object",
                                           "additionalProperties": {"type": "string"}}}}


def custom(api_version: str, kind: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": ["apiVersion", "kind", "metadata", "spec"],
            "additionalProperties": False, "properties": {
                "apiVersion": {"const": api_version}, "kind": {"const": kind},
                "metadata": OBJECT_META, "spec": spec}}


# The custom resources' fields these manifests use, typed as the Prometheus Operator
# (monitoring.coreos.com/v1) and KEDA (keda.sh/v1alpha1) API references define them;
# anything else is refused, so a misspelt field fails here rather than being dropped by the
# API server.
CUSTOM_SCHEMAS = {
    "ServiceMonitor": custom("monitoring.coreos.com/v1", "ServiceMonitor", {
        "type": "object", "required": ["selector", "endpoints"], "additionalProperties": False,
        "properties": {
            "selector": SELECTOR,
            "endpoints": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["port"], "additionalProperties": False,
                "properties": {"port": {"type": "string"}, "path": {"type": "string"},
                               "interval": {"type": "string",
                                            "pattern": r"^(0|([0-9]+(ms|s|m|h))+)$"}}}}}}),
    "ScaledObject": custom("keda.sh/v1alpha1", "ScaledObject", {
        "type": "object", "required": ["scaleTargetRef", "triggers"],
        "additionalProperties": False, "properties": {
            "scaleTargetRef": {"type": "object", "required": ["name"],
                               "additionalProperties": False,
                               "properties": {"name": {"type": "string"},
                                              "kind": {"type": "string"},
                                              "apiVersion": {"type": "string"}}},
            "minReplicaCount": {"type": "integer", "minimum": 0},
            "maxReplicaCount": {"type": "integer", "minimum": 1},
            "pollingInterval": {"type": "integer", "minimum": 1},
            "cooldownPeriod": {"type": "integer", "minimum": 0},
            "fallback": {"type": "object", "required": ["failureThreshold", "replicas"],
                         "additionalProperties": False,
                         "properties": {"failureThreshold": {"type": "integer", "minimum": 1},
                                        "replicas": {"type": "integer", "minimum": 1}}},
            "advanced": {"type": "object", "additionalProperties": False, "properties": {
                "horizontalPodAutoscalerConfig": {
                    "type": "object", "additionalProperties": False,
                    "properties": {"behavior": {"type": "object"}}}}},
            "triggers": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["type", "metadata"],
                "additionalProperties": False, "properties": {
                    "type": {"const": "prometheus"}, "name": {"type": "string"},
                    "metadata": {"type": "object", "additionalProperties": False,
                                 "required": ["serverAddress", "query", "threshold"],
                                 "properties": {
                                     "serverAddress": {"type": "string",
                                                       "pattern": "^https?://"},
                                     "query": {"type": "string"},
                                     "threshold": {"type": "string",
                                                   "pattern": r"^[0-9]+(\.[0-9]+)?$"},
                                     "ignoreNullValues": {"enum": ["true", "false"]}}}}}}}}),
}


def test_every_object_validates_against_the_kubernetes_schemas(
        variant: str, no_network: None) -> None:
    objects = rendered(variant)
    for obj in objects:
        if obj["kind"] in CUSTOM_SCHEMAS:
            jsonschema.validate(obj, CUSTOM_SCHEMAS[obj["kind"]])
            continue
        for version in KUBERNETES:
            kubernetes_validate.validate(obj, version, strict=True)
    # The HPA behaviour KEDA hands to the HorizontalPodAutoscaler it creates: validated as
    # part of a real autoscaling/v2 object.
    scaled = one(objects, "ScaledObject")
    hpa = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
           "metadata": {"name": "keda-hpa"},
           "spec": {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment",
                                       "name": scaled["spec"]["scaleTargetRef"]["name"]},
                    "maxReplicas": scaled["spec"]["maxReplicaCount"],
                    "behavior": scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"][
                        "behavior"]}}
    for version in KUBERNETES:
        kubernetes_validate.validate(hpa, version, strict=True)


def test_schema_validation_catches_mistakes(no_network: None) -> None:
    """The checks above bite: a misspelt field, a wrong type, a missing required field."""
    objects = rendered("base")
    deployment = copy.deepcopy(one(objects, "Deployment"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES[0], strict=True)
    pdb = copy.deepcopy(one(objects, "PodDisruptionBudget"))
    pdb["spec"]["maxUnavailable"] = [1]
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pdb, KUBERNETES[-1], strict=True)
    scaled = copy.deepcopy(one(objects, "ScaledObject"))
    scaled["spec"]["triggers"][0]["metadata"]["threshold"] = 16
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, CUSTOM_SCHEMAS["ScaledObject"])
    monitor = copy.deepcopy(one(objects, "ServiceMonitor"))
    monitor["spec"]["endpoints"][0]["targetport"] = "metrics"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(monitor, CUSTOM_SCHEMAS["ServiceMonitor"])


# --- the config, as the pod sees it ---------------------------------------------------------

def mounts(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The container's mount paths -> the volume mounted there."""
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    return {m["mountPath"]: volumes[m["name"]] for m in container(objects)["volumeMounts"]}


def mount_of(objects: list[dict[str, Any]], path: str) -> str | None:
    """The mount path holding ``path`` (the deepest), else None."""
    found = [m for m in mounts(objects) if path == m or path.startswith(m.rstrip("/") + "/")]
    return max(found, key=len) if found else None


def atomic_writer_dir(directory: Path, files: dict[str, bytes]) -> None:
    """A directory laid out as the kubelet writes a Secret or ConfigMap volume: the files in
    a timestamped directory, `..data` linking to it, and each name a link through `..data`."""
    stamp = directory / "..2026_01_01_00_00_00.000000001"
    stamp.mkdir(parents=True)
    for name, content in files.items():
        (stamp / name).write_bytes(content)
    (directory / "..data").symlink_to(stamp.name)
    for name in files:
        (directory / name).symlink_to(f"..data/{name}")


@pytest.fixture
def pod_root(variant: str, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """The pod's filesystem under a temporary root: the ConfigMap, the two CURVE Secrets
    (keys from `tfsupervisor keygen`, laid out as the kubelet does), the image's model
    directory and the emptyDir volumes; and the config's text with every absolute path
    moved under that root."""
    objects = rendered(variant)
    root = Path(f"/tmp/tfs-k8s-{os.getpid()}-{variant}")  # short: ipc paths are bounded
    shutil.rmtree(root, ignore_errors=True)
    keys = keygen(tmp_path / "keys")
    text = config_text(objects)
    for path, volume in mounts(objects).items():
        target = root / path.lstrip("/")
        if "secret" in volume:
            name = volume["secret"]["secretName"]
            files = {"tfsupervisor-curve-server": {
                         "server.key_secret": keys["server_secret"].read_bytes()},
                     "tfsupervisor-curve-clients": {
                         "app.key": keys["client_public"].read_bytes()}}[name]
            atomic_writer_dir(target, files)
        elif "configMap" in volume:
            atomic_writer_dir(target, {"config.yaml": b"placeholder"})
        else:
            target.mkdir(parents=True, exist_ok=True)
    for model in config_of(objects).models.values():
        if model.saved_model:
            assert model.saved_model.startswith(MODELS_IN_IMAGE + "/")
            stand_in_saved_model(root / model.saved_model.lstrip("/"))
    prefixes = sorted({*mounts(objects), MODELS_IN_IMAGE}, key=len, reverse=True)
    pattern = "|".join(re.escape(p) for p in prefixes)
    text = re.sub(rf"(?<![\w/])({pattern})(?=[/\s\"']|$)", lambda m: f"{root}{m.group(1)}",
                  text, flags=re.M)
    try:
        yield root, text
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_configs_paths_are_what_the_pod_mounts(variant: str) -> None:
    objects = rendered(variant)
    config = config_of(objects)
    sup = config.supervisor
    emptydirs = [p for p, v in mounts(objects).items() if "emptyDir" in v]
    runtime = str(config.runtime_dir)
    # Under an emptyDir but not its mount point: the daemon sets the runtime directory's
    # mode, which only its owner may, and a volume's mount point is root's.
    holder = mount_of(objects, runtime)
    assert holder in emptydirs and holder != runtime, (runtime, emptydirs)
    assert sup.curve.server_secret_key and sup.curve.authorized_clients
    for path, secret in ((sup.curve.server_secret_key, "tfsupervisor-curve-server"),
                         (sup.curve.authorized_clients, "tfsupervisor-curve-clients")):
        holder = mount_of(objects, path)
        assert holder is not None, path
        assert mounts(objects)[holder]["secret"]["secretName"] == secret
    for model in config.models.values():  # built into the image (Dockerfile)
        assert model.saved_model and model.saved_model.startswith(MODELS_IN_IMAGE + "/")
        assert mount_of(objects, model.saved_model) is None  # not hidden by a volume
    assert f"demo-model {MODELS_IN_IMAGE}/demo" in (REPO / "Dockerfile").read_text()
    # The daemon reads the config where the ConfigMap is mounted.
    args = container(objects)["args"]
    assert args[args.index("-c") + 1] == f"{config_mount(objects)}/config.yaml"
    for mount in container(objects)["volumeMounts"]:  # only the emptyDirs are written
        assert mount.get("readOnly") or "emptyDir" in mounts(objects)[mount["mountPath"]]


def test_the_configmaps_config_passes_check_in_the_pods_layout(
        variant: str, pod_root: tuple[Path, str], capsys: pytest.CaptureFixture[str]) -> None:
    """`tfsupervisor check` on the ConfigMap's config: it validates, the key files and the
    client key directory (Secrets, as the kubelet lays them out) are read whole, the model
    directory holds a saved_model.pb, the runtime directory can be created."""
    root, text = pod_root
    config_file = root / config_mount(rendered(variant)).lstrip("/") / "config.yaml"
    config_file.resolve().write_text(text)  # through ..data, as the kubelet wrote it
    assert cli_main(["check", "-c", str(config_file)]) == 0, capsys.readouterr().err
    assert "OK" in capsys.readouterr().out
    config = load_config(config_file)
    assert str(config.runtime_dir).startswith(str(root))  # every path was moved
    # The daemon's own readers accept the Secret layout (links through ..data).
    _, secret = load_certificate(config.supervisor.curve.server_secret_key or "")
    assert secret is not None
    keys = read_clients(config.supervisor.curve)
    assert sum(len(v) for v in keys.values()) == 1  # app.key; ..data and its target skipped


# --- resources, grace period, probes ---------------------------------------------------------

def memory_problems(config: Config, resources: dict[str, Any]) -> list[str]:
    """Why the container's memory does not fit the policy (empty when it does).

    The limit: the rule `tfsupervisor check` and the daemon's start apply to the cgroup they
    run in (supervisor/core/budget.py), with the pod's allowance for what runs beside the
    workers: every worker at its kill_memory (the most the policy lets it hold), one
    replacement of the largest beside them, the kill buffer and the allowance. The daemon
    starts a replacement beside a worker only when it fits the limit it reads (else it
    drains the worker first), so a limit sized so keeps recycles replacement-first and no
    recycle meets the OOM killer. The request must hold every worker at max_memory (the
    steady state at its worst before recycles start) and the allowance."""
    problems = []
    steady = 0
    for name, model in config.models.items():
        policy = model.policy
        if policy.kill_memory is None or policy.max_memory is None:
            problems.append(f"{name}: kill_memory and max_memory must be set in a pod")
            continue
        steady += model.workers * policy.max_memory
    limit = quantity(resources["limits"]["memory"])
    request = quantity(resources["requests"]["memory"])
    budget = Budget()
    budget.update(CgroupMemory(2, "/pod", limit, 0, 0), None)
    problem = sizing_problem(config.models, budget, config.supervisor.min_available_memory,
                             SUPERVISOR_ALLOWANCE)
    if problem is not None:
        problems.append(f"memory limit: {problem}")
    if request < steady + SUPERVISOR_ALLOWANCE:
        problems.append(f"memory request {request / 2**20:.0f}MiB < "
                        f"{(steady + SUPERVISOR_ALLOWANCE) / 2**20:.0f}MiB")
    if request > limit:
        problems.append("memory request over the limit")
    return problems


def test_memory_requests_and_limits_match_the_policy(variant: str) -> None:
    objects = rendered(variant)
    config = config_of(objects)
    resources = container(objects)["resources"]
    assert memory_problems(config, resources) == []
    # The check bites: one more worker, or a higher kill_memory, and the limit is short.
    more = parse_config(config_text(objects).replace("workers: 2", "workers: 3"))
    assert any("limit" in p for p in memory_problems(more, resources))
    raised = re.sub(r"kill_memory: \S+", "kill_memory: 8GiB", config_text(objects))
    assert any("limit" in p for p in memory_problems(parse_config(raised), resources))
    assert memory_problems(parse_config(re.sub(r"\n +kill_memory: \S+", "",
                                               config_text(objects))), resources)


def test_the_grace_period_covers_the_drain(variant: str) -> None:
    """terminationGracePeriodSeconds covers the preStop hook and the daemon's whole drain,
    as the daemon itself computes it: shutdown_timeout for jobs, STOP_GRACE for workers,
    EXIT_MARGIN for itself (the deadline it gives systemd too)."""
    objects = rendered(variant)
    config = config_of(objects)
    core = Core(config)
    core.shutdown(0.0, "SIGTERM")
    deadline = core.shutdown_deadline()
    assert deadline == config.supervisor.shutdown_timeout + STOP_GRACE + EXIT_MARGIN
    grace = one(objects, "Deployment")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"]
    assert grace >= deadline + PRESTOP_MARGIN, (grace, deadline)
    # The preStop hook gives up at its own default (shutdown_timeout + STOP_GRACE), which
    # leaves the daemon its EXIT_MARGIN before the kubelet's SIGKILL.
    hook = container(objects)["lifecycle"]["preStop"]["exec"]["command"]
    args = build_parser().parse_args(hook[1:])
    assert hook[0] == "tfsupervisor" and args.command == "drain" and args.timeout is None
    assert args.config == f"{config_mount(objects)}/config.yaml"
    assert config.supervisor.shutdown_timeout + STOP_GRACE + EXIT_MARGIN + PRESTOP_MARGIN \
        <= grace
    # The rollout never takes a pod away before its replacement is ready.
    strategy = one(objects, "Deployment")["spec"]["strategy"]["rollingUpdate"]
    assert strategy == {"maxSurge": 1, "maxUnavailable": 0}
    # Clients re-resolve the Service every RESOLVE_EVERY seconds (docs/deployment.md): a new
    # pod is known to them before the next old one drains.
    assert one(objects, "Deployment")["spec"]["minReadySeconds"] >= RESOLVE_EVERY + 5


def probe(objects: list[dict[str, Any]], kind: str) -> tuple[dict[str, Any], int, str, str]:
    """(the probe, the container port it asks, its path, its query): an httpGet, never a
    process started in the container."""
    spec = container(objects)[kind]
    assert not {"exec", "grpc", "tcpSocket"} & set(spec), (kind, spec)
    get = spec["httpGet"]
    assert get.get("scheme", "HTTP") == "HTTP" and "host" not in get, get  # the pod's own IP
    ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    port = ports[get["port"]] if isinstance(get["port"], str) else get["port"]
    path, _, query = get["path"].partition("?")
    return spec, port, path, query


def test_probes_ask_the_daemon_itself(variant: str) -> None:
    """Every probe is an httpGet on the port supervisor.metrics listens on, on an address
    the kubelet reaches (the pod's IP, not loopback), at a path the daemon answers as the
    probe means it."""
    objects = rendered(variant)
    config = config_of(objects)
    required = sorted(m for m, c in config.models.items() if c.required)
    assert config.supervisor.metrics
    host, _, port = config.supervisor.metrics.rpartition(":")
    assert host in ("0.0.0.0", "[::]"), host  # a probe comes from the node, to the pod's IP
    health = Health(0.0, lambda: 0.0)
    health.publish({"serving": True, "ready": True, "stopping": False, "models": {
        m: {"required": c.required, "workers": [{"state": "ready"}]}
        for m, c in config.models.items()}})
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        spec, probed, path, query = probe(objects, kind)
        assert probed == int(port), kind
        assert health.answer(path, query) == (200, "alive" if path == "/livez" else "ready")
        assert 1 <= spec["timeoutSeconds"] < spec["periodSeconds"], kind
        if kind == "livenessProbe":
            assert (path, query) == ("/livez", "")  # alive: the loop turns, whatever the models do
            # A wedged loop is restarted within a minute of /livez failing; a busy one is not.
            assert 30 <= spec["periodSeconds"] * spec["failureThreshold"] <= 90
        else:  # per model: each one the pod serves needs a ready worker
            assert path == "/readyz", kind
            assert sorted(parse_qs(query)["model"]) == required, (kind, query)
    # No probe anywhere starts a process (the preStop hook is not a probe).
    for c in one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]:
        assert not any("exec" in c.get(k, {}) for k in
                       ("startupProbe", "readinessProbe", "livenessProbe")), c["name"]
    startup, *_ = probe(objects, "startupProbe")
    # Loading may take the daemon's own start_timeout before it gives up on a worker.
    assert startup["periodSeconds"] * startup["failureThreshold"] >= \
        config.supervisor.start_timeout


def test_ports_and_selectors_line_up(variant: str) -> None:
    objects = rendered(variant)
    config = config_of(objects)
    ports = {p["name"]: p["containerPort"] for p in container(objects)["ports"]}
    # The HTTP front: the config's listen address (its block, commented out until the
    # daemon knows supervisor.http) is the container's `http` port, 8080 as KServe has it,
    # on the pod's IP, and plain HTTP there only by an explicit insecure (else TLS files).
    live, http = http_enabled(config_text(objects))
    parse_with_http(live, Path(f"{config_mount(objects)}/config.yaml"))  # valid, the block on
    host, _, port = http["listen"].rpartition(":")
    assert host == "0.0.0.0" and ports["http"] == int(port) == 8080, http
    assert http.get("insecure") is True or (http.get("tls_cert") and http.get("tls_key"))
    (endpoint,) = config.supervisor.endpoints
    assert endpoint.startswith("tcp://0.0.0.0:") and config.supervisor.curve.enabled
    assert ports["jobs"] == int(endpoint.rpartition(":")[2])
    assert config.supervisor.metrics and ports["metrics"] == int(
        config.supervisor.metrics.rpartition(":")[2])
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert "replicas" not in deployment["spec"]  # the ScaledObject owns the count
    service = one(objects, "Service")
    assert service["spec"]["clusterIP"] == "None"  # headless: every pod's address
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {
        "jobs": "jobs", "metrics": "metrics", "http": "http", "grpc": "grpc"}
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["http"] == ports["http"]
    # the gRPC front on the container's `grpc` port, 8081 as KServe has it, same rule
    grpc = config.supervisor.grpc
    assert grpc.listen == f"0.0.0.0:{ports['grpc']}" and ports["grpc"] == 8081
    assert grpc.insecure or (grpc.tls_cert and grpc.tls_key)
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    monitor = one(objects, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        service["metadata"]["labels"].items()
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    scaled = one(objects, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] >= 2  # one pod drains while another serves
    assert quantity(pdb["spec"]["maxUnavailable"]) < scaled["spec"]["minReplicaCount"]


def exported(config: Config) -> dict[str, set[str]]:
    """Sample names the daemon's metrics registry exports for this config -> their labels."""
    metrics = Metrics()
    core = Core(config)
    metrics.publish(core.pool, core.router)
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(metrics.registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(
                f"{k}={v}" for k, v in sample.labels.items())
    return found


def test_scaling_triggers_read_queue_depth_the_daemon_exports(variant: str) -> None:
    objects = rendered(variant)
    config = config_of(objects)
    series = exported(config)
    namespace = one(objects, "Namespace")["metadata"]["name"]
    service = one(objects, "Service")["metadata"]["name"]
    models = []
    for trigger in one(objects, "ScaledObject")["spec"]["triggers"]:
        query = trigger["metadata"]["query"]
        found = re.fullmatch(r"sum\((\w+)\{(.*)\}\)", query)
        assert found, query
        name, selector = found.groups()
        labels = dict(re.findall(r'(\w+)="([^"]*)"', selector))
        assert name == "tfsupervisor_queue_depth"  # the queue, as the daemon counts it
        assert f"model={labels['model']}" in series[name], (name, series.get(name))
        # The labels Prometheus adds for the ServiceMonitor's targets.
        assert labels["namespace"] == namespace and labels["service"] == service
        assert set(labels) == {"model", "namespace", "service"}
        assert float(trigger["metadata"]["threshold"]) > 0
        # An empty answer (nothing scraped: a ServiceMonitor Prometheus does not select) is
        # an error that makes KEDA hold the fallback, not a 0 that holds the minimum.
        assert trigger["metadata"]["ignoreNullValues"] == "false"
        assert one(objects, "ScaledObject")["spec"]["fallback"]["replicas"] > \
            one(objects, "ScaledObject")["spec"]["minReplicaCount"]
        models.append(labels["model"])
    assert sorted(models) == sorted(config.models)  # one trigger per model


def test_the_gpu_overlay_asks_for_a_gpu_its_workers_fit_on() -> None:
    objects = rendered("gpu")
    config = config_of(objects)
    resources = container(objects)["resources"]
    assert quantity(resources["limits"]["nvidia.com/gpu"]) == 1
    assert container(objects)["image"].endswith("-gpu")
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        pod["tolerations"]
    (term,) = pod["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    (expression,) = term["matchExpressions"]
    assert expression["key"] == "nvidia.com/gpu.memory" and expression["operator"] == "Gt"
    card = (int(expression["values"][0]) + 1) * 1024**2  # MiB, as GPU feature discovery says
    pools = 0
    for model in config.models.values():
        assert model.tf.gpu_memory_limit is not None  # a fixed pool per worker
        pools += model.workers * model.tf.gpu_memory_limit * (2 if model.policy.surge else 1)
    assert pools <= card, (pools, card)
    base = rendered("base")
    assert "nvidia.com/gpu" not in container(base)["resources"]["limits"]


# --- the image's name, once the registry is set ---------------------------------------------

REGISTRY = "registry.example.com:5000/team"


def edit_set_image(directory: Path, argument: str) -> None:
    """`kustomize edit set image ARGUMENT` in ``directory``, as kustomize does it: NAME=NEW:TAG
    sets the entry NAME's newName and newTag, NAME:TAG its newTag only; an entry that is not
    there is added."""
    file = directory / "kustomization.yaml"
    spec = yaml.safe_load(file.read_text())
    name, sep, new = argument.partition("=")
    new_name, _, tag = (new if sep else name).rpartition(":")
    if not sep:
        name = new_name
    images = spec.setdefault("images", [])
    entry = next((i for i in images if i["name"] == name), None)
    if entry is None:
        entry = {"name": name}
        images.append(entry)
    if sep:
        entry["newName"] = new_name
    entry["newTag"] = tag
    file.write_text(yaml.safe_dump(spec, sort_keys=False))


def documented_image_edits() -> list[tuple[str, str]]:
    """(directory, argument) of every `kustomize edit set image` docs/deployment.md gives."""
    text = (REPO / "docs" / "deployment.md").read_text()
    found = re.findall(r"cd (deploy/kubernetes/[\w/]+) && kustomize edit set image (\S+?)\)",
                       text)
    return [(d, a.replace("$REGISTRY", REGISTRY)) for d, a in found]


def image_of(objects: list[dict[str, Any]]) -> str:
    image: str = container(objects)["image"]
    return image


def test_the_registry_set_as_documented_keeps_each_variants_image(tmp_path: Path) -> None:
    """The docs' commands run on a copy of the manifests: the base gets the CPU image from
    the registry, the GPU overlay the -gpu one. (An overlay's images entry sees the image as
    the base left it: setting the registry in the base alone made GPU pods run the CPU
    image.)"""
    edits = documented_image_edits()
    assert {d for d, _ in edits} == {"deploy/kubernetes/base",
                                     "deploy/kubernetes/overlays/gpu"}, edits
    copy_root = tmp_path / "repo"
    shutil.copytree(DEPLOY, copy_root / "deploy" / "kubernetes")
    for directory, argument in edits:
        edit_set_image(copy_root / directory, argument)
    variants = {"base": copy_root / "deploy/kubernetes/base",
                "gpu": copy_root / "deploy/kubernetes/overlays/gpu"}
    want = {"base": f"{REGISTRY}/tfsupervisor:0.1.0", "gpu": f"{REGISTRY}/tfsupervisor:0.1.0-gpu"}
    kubectl = shutil.which("kubectl")
    for variant, directory in variants.items():
        assert image_of(render(directory)) == want[variant], variant
        if kubectl is not None:  # and kustomize itself agrees
            out = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True,
                                 text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            assert image_of([o for o in yaml.safe_load_all(out.stdout) if o]) == want[variant]
    # The base alone, as the docs said before: the overlay's tag matches nothing.
    only_base = tmp_path / "only-base"
    shutil.copytree(DEPLOY, only_base)
    edit_set_image(only_base / "base", f"tfsupervisor={REGISTRY}/tfsupervisor:0.1.0")
    assert image_of(render(only_base / "overlays" / "gpu")).endswith(":0.1.0")


def test_the_gpu_overlays_image_entry_matches_what_the_base_names() -> None:
    """In the repository as it is: the overlay's entry names the base's newName, so its tag
    applies."""
    def images(directory: Path) -> list[dict[str, str]]:
        entries: list[dict[str, str]] = yaml.safe_load(
            (directory / "kustomization.yaml").read_text())["images"]
        return entries

    (base,) = images(VARIANTS["base"])
    assert base["newName"] in {i["name"] for i in images(VARIANTS["gpu"])}
    assert image_of(rendered("gpu")) == f"{base['newName']}:{base['newTag']}-gpu"


# --- the docs' failover client ----------------------------------------------------------------

def test_the_documented_pods_client_keeps_its_client_when_a_resolve_fails() -> None:
    """The `Pods` class of docs/deployment.md, run with a stand-in resolver and Client: a
    failed re-resolve (a DNS blip, no pod ready for a moment) keeps the old client serving,
    a new list replaces it (the old one closed), the same list keeps it, and a first
    resolve that fails raises (nothing to fall back on)."""
    text = (REPO / "docs" / "deployment.md").read_text()
    section = text[text.index("### The failover client over the headless Service"):]
    code = section[section.index("```python\n") + len("```python\n"):]
    code = code[:code.index("```")]
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/deployment.md", "exec"), namespace)
    assert namespace["RESOLVE_EVERY"] == RESOLVE_EVERY

    class Clock:
        now = 1000.0

        def monotonic(self) -> float:
            return self.now

    class FakeClient:
        made: list[FakeClient] = []

        def __init__(self, endpoints: list[str], **kwargs: Any) -> None:
            self.endpoints, self.closed = endpoints, False
            FakeClient.made.append(self)

        def infer(self, model: str, inputs: Any) -> list[str]:
            assert not self.closed
            return self.endpoints

        def close(self) -> None:
            self.closed = True

    answers: list[Any] = []

    def resolve(service: str) -> list[str]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        result: list[str] = answer
        return result

    clock = Clock()
    namespace.update(time=clock, Client=FakeClient, resolve_endpoints=resolve)
    pods = namespace["Pods"]()
    answers.append(socket.gaierror(-2, "Name or service not known"))
    with pytest.raises(OSError):
        pods.infer("demo", {})
    answers.append(["tcp://10.0.0.1:5555"])
    assert pods.infer("demo", {}) == ["tcp://10.0.0.1:5555"]
    clock.now += RESOLVE_EVERY + 1
    answers.append(socket.gaierror(-2, "Name or service not known"))
    assert pods.infer("demo", {}) == ["tcp://10.0.0.1:5555"]  # the old client serves on
    assert pods.infer("demo", {}) == ["tcp://10.0.0.1:5555"]  # no resolve on every job
    assert answers == [] and len(FakeClient.made) == 1
    clock.now += RESOLVE_EVERY + 1
    answers.append(["tcp://10.0.0.1:5555"])  # the same pods: the same connections
    assert pods.infer("demo", {}) == ["tcp://10.0.0.1:5555"] and len(FakeClient.made) == 1
    clock.now += RESOLVE_EVERY + 1
    answers.append(["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"])
    assert pods.infer("demo", {}) == ["tcp://10.0.0.2:5555", "tcp://10.0.0.3:5555"]
    assert FakeClient.made[0].closed and not FakeClient.made[1].closed


# --- the KServe example ------------------------------------------------------------------------

KSERVE = DEPLOY / "kserve"
# openAPIV3Schema of KServe's CRDs, descriptions stripped (tests/data/kserve/README.md).
KSERVE_SCHEMAS = {
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime-v1alpha1.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice-v1beta1.json"}
# KServe's protocol versions (InferenceServiceProtocol, pkg/constants/constants.go): the CRDs
# type protocolVersions and protocolVersion as plain strings, so the schema lets a typo by.
KSERVE_PROTOCOLS = {"v1", "v2", "grpc-v1", "grpc-v2"}
KSERVE_CONTAINER = "kserve-container"  # the predictor's container, by KServe's name


def strict(node: Any) -> Any:
    """A CRD schema as the API server applies it under strict field validation (kubectl's
    default): a field the schema does not declare is an error, not silently pruned. Every
    object schema with properties refuses others, unless it preserves unknown fields."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in ("properties", "$defs"):
                out[key] = {k: strict(v) for k, v in value.items()}
            elif key in ("items", "additionalProperties", "not"):
                out[key] = strict(value)
            elif key in ("allOf", "anyOf", "oneOf"):
                out[key] = [strict(v) for v in value]
            else:
                out[key] = value
        if "properties" in out and "additionalProperties" not in out and \
                not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    return node


def kserve_validator(api_version: str, kind: str) -> jsonschema.Draft202012Validator:
    file = REPO / "tests" / "data" / "kserve" / KSERVE_SCHEMAS[(api_version, kind)]
    schema = strict(json.loads(file.read_text()))
    schema["properties"]["apiVersion"] = {"const": api_version}
    schema["properties"]["kind"] = {"const": kind}
    schema["properties"]["metadata"] = OBJECT_META  # the CRD says only `type: object`
    schema["required"] = ["apiVersion", "kind", "metadata", "spec"]
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def validate_kserve(obj: dict[str, Any]) -> None:
    if (obj["apiVersion"], obj["kind"]) in KSERVE_SCHEMAS:
        kserve_validator(obj["apiVersion"], obj["kind"]).validate(obj)
    else:
        for version in KUBERNETES:
            kubernetes_validate.validate(obj, version, strict=True)


def kserve_problems(objects: list[dict[str, Any]]) -> list[str]:
    """What KServe's controller would refuse or mismatch that the CRD schema lets by."""
    runtime = one(objects, "ServingRuntime")
    service = one(objects, "InferenceService")
    model = service["spec"]["predictor"]["model"]
    problems = []
    unknown = set(runtime["spec"]["protocolVersions"]) - KSERVE_PROTOCOLS
    if unknown:
        problems.append(f"unknown protocolVersions {sorted(unknown)}")
    if model.get("protocolVersion") not in runtime["spec"]["protocolVersions"]:
        problems.append(f"protocolVersion {model.get('protocolVersion')!r} not the runtime's")
    if model.get("runtime") != runtime["metadata"]["name"]:
        problems.append(f"runtime {model.get('runtime')!r} is not {runtime['metadata']['name']}")
    formats = {(f["name"], f.get("version")) for f in runtime["spec"]["supportedModelFormats"]}
    wanted = (model["modelFormat"]["name"], model["modelFormat"].get("version"))
    if wanted not in formats:
        problems.append(f"modelFormat {wanted} not in the runtime's {sorted(formats)}")
    if [c["name"] for c in runtime["spec"]["containers"]] != [KSERVE_CONTAINER]:
        problems.append(f"the runtime's container is not named {KSERVE_CONTAINER}")
    return problems


def test_the_kserve_example_validates_against_kserves_crds(no_network: None) -> None:
    objects = render(KSERVE)
    assert sorted(o["kind"] for o in objects) == [
        "ConfigMap", "InferenceService", "ServingRuntime"]
    for obj in objects:
        validate_kserve(obj)
    assert kserve_problems(objects) == []
    assert one(objects, "InferenceService")["spec"]["predictor"]["model"][
        "protocolVersion"] == "v2"


def test_kserve_validation_catches_mistakes(no_network: None) -> None:
    """The CRD schemas bite: a port as a string, a misspelt field, a missing required
    field; and an unknown protocol version (a plain string in the CRDs) is caught by the
    cross-checks."""
    objects = render(KSERVE)
    runtime, service = one(objects, "ServingRuntime"), one(objects, "InferenceService")
    broken: list[tuple[dict[str, Any], str, Any]] = [
        (runtime, "spec.containers.0.ports.0.containerPort", "8080"),
        (runtime, "spec.supportedModelFormats.0", {"version": "2"}),
        (runtime, "spec.containers.0.readinessprobe", {}),
        (service, "spec.predictor.model.protocolversion", "v2"),
        (service, "spec.predictor.model.modelFormat", {"version": "2"}),
        (service, "spec.predictor.minReplicas", "1"),
        (service, "spec.predictor.model.protocolVersion", ["v2"]),
    ]
    for obj, path, value in broken:
        changed = copy.deepcopy(obj)
        *parents, last = path.split(".")
        node: Any = changed
        for part in parents:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node[int(last) if isinstance(node, list) else last] = value
        with pytest.raises(jsonschema.ValidationError) as refused:
            validate_kserve(changed)
        where = [str(part) for part in refused.value.absolute_path]
        assert where in (parents, [*parents, last]), (path, where)  # refused for that field
    no_spec = copy.deepcopy(runtime)
    del no_spec["spec"]["containers"]
    with pytest.raises(jsonschema.ValidationError):
        validate_kserve(no_spec)
    for field, value in (("protocolVersion", "v3"), ("runtime", "kserve-tritonserver"),
                         ("modelFormat", {"name": "onnx"})):
        changed = copy.deepcopy(service)
        changed["spec"]["predictor"]["model"][field] = value
        validate_kserve(changed)  # the schema takes it...
        assert kserve_problems([runtime, changed])  # ...the cross-checks do not
    grpc = copy.deepcopy(runtime)
    grpc["spec"]["protocolVersions"] = ["v2", "v3"]
    assert kserve_problems([grpc, service])


def test_the_kserve_runtime_serves_what_its_config_says() -> None:
    """The runtime's container against its config.yaml, read with the daemon's own loader:
    the HTTP front listens on the one container port (8080, KServe's) on the pod's IP, the
    probes ask the front there, the model is named as the InferenceService (its v2 URL), and
    the memory, grace period and metrics port line up as in the base Deployment."""
    objects = render(KSERVE)
    runtime, service = one(objects, "ServingRuntime"), one(objects, "InferenceService")
    (serving,) = runtime["spec"]["containers"]
    # The image's ENTRYPOINT is `tfsupervisor run`; the config where the ConfigMap is mounted.
    args = build_parser().parse_args(["run", *serving["args"]])
    assert args.command == "run"
    config_dir, _, config_name = args.config.rpartition("/")
    (mount,) = [m for m in serving["volumeMounts"] if m["mountPath"] == config_dir]
    (volume,) = [v for v in runtime["spec"]["volumes"] if v["name"] == mount["name"]]
    configmap = one(objects, "ConfigMap")
    assert volume["configMap"]["name"] == configmap["metadata"]["name"]
    config = parse_with_http(configmap["data"][config_name], Path(args.config))
    _, http = http_enabled(configmap["data"][config_name])
    (port,) = serving["ports"]
    host, _, listen = http["listen"].rpartition(":")
    assert host == "0.0.0.0" and int(listen) == port["containerPort"] == 8080, http
    assert port.get("name") in (None, "http1", "h2c")  # Knative's names for the one port
    assert http.get("insecure") is True or (http.get("tls_cert") and http.get("tls_key"))
    for kind in ("readinessProbe", "livenessProbe"):
        get = serving[kind]["httpGet"]
        assert get["port"] == port["containerPort"] and "host" not in get, kind
        assert get["path"].startswith("/v2/health/"), kind
        assert 1 <= serving[kind]["timeoutSeconds"] < serving[kind]["periodSeconds"], kind
    assert serving["livenessProbe"]["initialDelaySeconds"] >= config.supervisor.start_timeout
    assert list(config.models) == [service["metadata"]["name"]]
    for model in config.models.values():
        assert model.saved_model and model.saved_model.startswith(
            (MODELS_IN_IMAGE + "/", "/mnt/models"))
    predictor = service["spec"]["predictor"]
    assert memory_problems(config, predictor["model"]["resources"]) == []
    assert predictor["terminationGracePeriodSeconds"] >= \
        config.supervisor.shutdown_timeout + STOP_GRACE + EXIT_MARGIN
    assert predictor["minReplicas"] >= 1  # a cold start warms every worker first
    assert config.supervisor.metrics and runtime["spec"]["annotations"][
        "prometheus.kserve.io/port"] == config.supervisor.metrics.rpartition(":")[2]
    assert serving["image"].partition(":")[0] == image_of(rendered("base")).partition(":")[0]
