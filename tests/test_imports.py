"""House rules on imports: the supervisor never imports TensorFlow, its six role packages
import downwards only (cli → daemon → core → config → shared; client → shared), no module
circle, and the client loads neither yaml nor the config stack."""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
from pathlib import Path

import supervisor
import worker

ROOT = Path(__file__).resolve().parent.parent
ROLES = ("shared", "config", "core", "daemon", "client", "front", "cli")
# What each role may import (itself included). Top-level modules (supervisor.aclient,
# supervisor.testing, __main__) are public re-exports and may import anything.
ALLOWED: dict[str, set[str]] = {
    "shared": {"shared"},
    "config": {"config", "shared"},
    "core": {"core", "config", "shared"},
    "daemon": {"daemon", "core", "config", "shared"},
    "client": {"client", "shared"},
    # The HTTP and gRPC fronts are clients: they may use the client, never a decision.
    "front": {"front", "client", "shared"},
    "cli": set(ROLES),
    "worker": {"worker", "shared", "config"},
}


def _modules(package: object, prefix: str) -> list[str]:
    path = package.__path__  # type: ignore[attr-defined]
    return sorted(m.name for m in pkgutil.walk_packages(path, prefix)
                  if not m.name.endswith("__main__"))


def _file(module: str) -> Path:
    path = ROOT / module.replace(".", "/")
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def _imports(module: str) -> set[str]:
    """Every supervisor/worker module this one names in an import, at any depth of the file
    (inside functions and TYPE_CHECKING blocks too: a typing-only import is still an arrow)."""
    tree = ast.parse(_file(module).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    known = set(ALL_MODULES)
    return {name for name in found if name in known}


# The public re-exports stand for the role they re-export: a core module importing
# supervisor.testing imports the client.
REEXPORTS = {"supervisor.aclient": "client", "supervisor.testing": "client",
             "supervisor.protocol": "shared"}


def _role(module: str) -> str | None:
    if module in REEXPORTS:
        return REEXPORTS[module]
    parts = module.split(".")
    if parts[0] == "worker":
        return "worker"
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ROLES) else None


ALL_MODULES = ["supervisor", "worker", *_modules(supervisor, "supervisor."),
               *_modules(worker, "worker.")]


def test_every_role_package_exists_and_holds_modules() -> None:
    for role in ROLES:
        inside = [m for m in ALL_MODULES if m.startswith(f"supervisor.{role}.")]
        assert inside, role
    flat = [m for m in ALL_MODULES if m.startswith("supervisor.") and m.count(".") == 1
            and m.split(".")[1] not in ROLES]
    # Only the public re-exports stay at the top (users import supervisor.aclient/testing).
    assert sorted(flat) == ["supervisor.aclient", "supervisor.protocol", "supervisor.testing"]


def test_arrows_point_down_only() -> None:
    wrong = []
    for module in ALL_MODULES:
        role = _role(module)
        if role is None or module in REEXPORTS:  # a re-export may name its role's modules
            continue
        for target in _imports(module):
            target_role = _role(target)
            if target_role is not None and target_role not in ALLOWED[role]:
                wrong.append(f"{module} ({role}) imports {target} ({target_role})")
    assert wrong == []


def test_no_import_circle() -> None:
    """Every import, at any depth of the file (TYPE_CHECKING and function-level ones too):
    a circle between two modules is a circle even when Python happens to resolve it."""
    graph = {m: {t for t in _imports(m) if t != m} for m in ALL_MODULES}
    # A package's __init__ is imported by its submodules: that edge is not a circle.
    for m, targets in graph.items():
        graph[m] = {t for t in targets if not m.startswith(t + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*stack[stack.index(nxt):], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for module in ALL_MODULES:
        if module not in state:
            visit(module)
    assert circles == []


def _loaded_after(statement: str) -> set[str]:
    code = (f"import sys\n{statement}\n"
            "print('\\n'.join(sorted(m for m in sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return set(out.stdout.split())


def test_client_loads_no_yaml_nor_config_nor_tensorflow() -> None:
    for statement in ("import supervisor.client", "from supervisor.client import Client",
                      "from supervisor.aclient import AsyncClient",
                      "from supervisor.protocol import TensorSpec"):
        loaded = _loaded_after(statement)
        assert "supervisor.client" in loaded or "TensorSpec" in statement
        heavy = sorted(m for m in loaded if m.split(".")[0] in ("yaml", "tensorflow", "keras")
                       or m.split(".")[:2] in (["supervisor", "config"], ["supervisor", "core"],
                                               ["supervisor", "daemon"], ["supervisor", "cli"]))
        assert heavy == [], statement


def test_core_loads_no_yaml() -> None:
    loaded = _loaded_after("import supervisor.core.core")
    assert "supervisor.core.router" in loaded
    assert sorted(m for m in loaded if m.split(".")[0] == "yaml"
                  or m.startswith(("supervisor.config.loading", "supervisor.daemon"))) == []


def test_public_imports_keep_working() -> None:
    from supervisor.aclient import AsyncClient
    from supervisor.client import Client, JobError, control
    from supervisor.protocol import TensorSpec
    from supervisor.testing import start_supervisor
    assert all(callable(x) for x in (AsyncClient, Client, JobError, control, start_supervisor,
                                     TensorSpec))


def test_supervisor_never_imports_tensorflow() -> None:
    modules = [m for m in ALL_MODULES if m.startswith("supervisor")]
    assert len(modules) > 40
    code = ("import sys\n"
            f"for name in {modules!r}: __import__(name)\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "('tensorflow', 'keras', 'tf_keras'))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_pyproject_core_dependencies_exclude_tensorflow() -> None:
    import tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    core = " ".join(meta["project"]["dependencies"]).lower()
    assert "tensorflow" not in core and "keras" not in core
    extras = meta["project"]["optional-dependencies"]
    assert any(d.startswith("tensorflow-cpu") for d in extras["tensorflow-cpu"])
    assert any(d.startswith("tensorflow>") for d in extras["tensorflow"])


def test_logger_names_follow_their_modules() -> None:
    """Every logger is ``logs.get(__name__)``: a name typed by hand drifts when a file moves."""
    typed = []
    for module in ALL_MODULES:
        for node in ast.walk(ast.parse(_file(module).read_text())):
            is_get = (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                      and node.func.attr == "get" and isinstance(node.func.value, ast.Name)
                      and node.func.value.id == "logs")
            if is_get and not (len(node.args) == 1 and isinstance(node.args[0], ast.Name)
                               and node.args[0].id == "__name__"):
                typed.append(f"{module}:{node.lineno}")
    assert typed == []
