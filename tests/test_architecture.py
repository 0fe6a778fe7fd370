"""Architecture rules that keep the layers honest.

- The policy core (``vertumnus.core``) does no I/O and reads no clock: it
  imports none of the shells' packages (gRPC, Redis, kopf, Kubernetes, torch)
  nor the standard library's I/O, process, clock or thread modules.
- Nothing is importable as a bare top-level ``operator`` (the stdlib module).
- The wheel builds and imports on its own.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "src" / "vertumnus" / "core"

SHELL_PACKAGES = {"grpc", "redis", "kopf", "kubernetes", "torch", "zmq", "safetensors"}
IMPURE_STDLIB = {
    "os", "io", "sys", "socket", "time", "datetime", "pathlib", "subprocess", "threading",
    "asyncio", "multiprocessing", "logging", "shutil", "tempfile", "urllib", "http", "json", "csv",
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("path", sorted(CORE.rglob("*.py")), ids=lambda p: str(p.relative_to(CORE)))
def test_core_module_imports_no_io(path):
    bad = _imports(path) & (SHELL_PACKAGES | IMPURE_STDLIB)
    assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}: the policy core must stay pure"


def test_importing_the_core_pulls_in_no_shell_package():
    mods = [
        "vertumnus.core." + p.relative_to(CORE).with_suffix("").as_posix().replace("/", ".")
        for p in CORE.rglob("*.py")
        if p.name != "__init__.py"
    ]
    code = "import sys\n" + "".join(f"import {m}\n" for m in mods) + (
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(SHELL_PACKAGES)!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "", f"importing the core loaded {out}"


def test_no_top_level_operator_package():
    assert not (ROOT / "operator" / "__init__.py").exists()
    code = "import sys; sys.path.insert(0, '.'); import operator; assert hasattr(operator, 'itemgetter')"
    subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, check=True)


@pytest.mark.slow
def test_wheel_builds_and_imports_alone(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path / "dist"), str(ROOT)],
        check=True, capture_output=True, text=True,
    )
    (wheel,) = (tmp_path / "dist").glob("vertumnus-*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True, capture_output=True, text=True,
    )
    # -I -S: no site processing, so the editable install of the checkout is invisible;
    # numpy/scipy come from site-packages added by hand (no .pth files run).
    site = sysconfig.get_paths()["purelib"]
    code = (
        f"import sys; sys.path[:0] = [{str(target)!r}, {site!r}]\n"
        "import vertumnus, vertumnus.core.placement, vertumnus.sim.engine, vertumnus.profiles, vertumnus.worker\n"
        f"assert vertumnus.__file__.startswith({str(target)!r}), vertumnus.__file__\n"
        "from vertumnus.profiles import load_model; print(load_model().name)\n"
        "from vertumnus.cli import main; raise SystemExit(main(['profiles']))\n"
    )
    p = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "qwen3-30b-a3b/h200" in p.stdout
