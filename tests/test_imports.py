"""House rule: the supervisor package never imports TensorFlow, directly or indirectly."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import supervisor


def test_supervisor_never_imports_tensorflow() -> None:
    modules = [m.name for m in pkgutil.iter_modules(supervisor.__path__, "supervisor.")
               if not m.name.endswith("__main__")]
    assert len(modules) > 10
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
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    core = " ".join(meta["project"]["dependencies"]).lower()
    assert "tensorflow" not in core and "keras" not in core
    extras = meta["project"]["optional-dependencies"]
    assert any(d.startswith("tensorflow-cpu") for d in extras["tensorflow-cpu"])
    assert any(d.startswith("tensorflow>") for d in extras["tensorflow"])
