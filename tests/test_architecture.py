"""Architecture rules that keep the layers honest (docs/architecture.md).

- The policy core (``vertumnus.core``) does no I/O and reads no clock: it
  imports none of the shells' packages (gRPC, Redis, kopf, Kubernetes, torch)
  nor the standard library's I/O, process, clock or thread modules.
- **The layer contract**, over the whole import graph (every ``import``,
  including those inside functions): the core imports nothing of the
  shells; the shells — simulator, worker, router, operator — import the core
  (and the profile files) but not each other; only the command line and the
  local-pool launcher compose them. The graph is built from the source
  files with the package mapping of ``pyproject.toml`` (``worker/`` is
  ``vertumnus.worker``, ...), so a mapped folder is checked like any other.
- Nothing is importable as a bare top-level ``operator`` (the stdlib module).
- The wheel builds and imports on its own.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "src" / "vertumnus" / "core"

SHELLS = ("vertumnus.sim", "vertumnus.worker", "vertumnus.router", "vertumnus.operator")
"""Independent of each other: each is a different way to run the core."""
COMPOSERS = (
    "vertumnus.cli",
    "vertumnus.__main__",
    "vertumnus.local",
    "vertumnus.demo",
    "vertumnus.loadgen",
    "vertumnus.admin",
    "vertumnus.plan",
)
"""May import any shell: the command line and the local pool put them together."""
SHARED = ("vertumnus.core", "vertumnus.profiles", "vertumnus._proto", "vertumnus.data", "vertumnus")
"""What every shell may import."""

SHELL_PACKAGES = {"grpc", "redis", "kopf", "kubernetes", "torch", "zmq", "safetensors"}
IMPURE_STDLIB = {
    "os",
    "io",
    "sys",
    "socket",
    "time",
    "datetime",
    "pathlib",
    "subprocess",
    "threading",
    "asyncio",
    "multiprocessing",
    "logging",
    "shutil",
    "tempfile",
    "urllib",
    "http",
    "json",
    "csv",
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
    assert not bad, (
        f"{path.relative_to(ROOT)} imports {sorted(bad)}: the policy core must stay pure"
    )


def test_importing_the_core_pulls_in_no_shell_package():
    mods = [
        "vertumnus.core." + p.relative_to(CORE).with_suffix("").as_posix().replace("/", ".")
        for p in CORE.rglob("*.py")
        if p.name != "__init__.py"
    ]
    code = (
        "import sys\n"
        + "".join(f"import {m}\n" for m in mods)
        + (
            f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(SHELL_PACKAGES)!r})\n"
            "print(','.join(bad))\n"
        )
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert out == "", f"importing the core loaded {out}"


def _package_dirs() -> dict[str, Path]:
    """Import name -> folder, from pyproject's package-dir mapping."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = {"vertumnus": ROOT / "src" / "vertumnus"}
    for name, folder in config["package-dir"].items():
        if name:
            dirs[name] = ROOT / folder
    return dirs


def _import_graph() -> dict[str, set[str]]:
    """Every module of the distribution -> the vertumnus modules it imports (anywhere in it)."""
    dirs = _package_dirs()
    # A file belongs to the most specific mapped package whose folder holds it.
    owners = sorted(dirs.items(), key=lambda kv: -len(kv[1].parts))
    modules: dict[str, Path] = {}
    for package, folder in dirs.items():
        for path in folder.rglob("*.py"):
            owner, base = next((n, d) for n, d in owners if path.is_relative_to(d))
            if owner != package or "_proto" in path.parts:
                continue
            rel = path.relative_to(base).with_suffix("").parts
            name = ".".join((package, *rel))
            modules[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                found.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = name.split(".")[
                        : len(name.split(".")) - node.level + (1 if is_pkg else 0)
                    ]
                    base = ".".join(parts)
                    mod = f"{base}.{node.module}" if node.module else base
                else:
                    mod = node.module or ""
                found.add(mod)
                found.update(f"{mod}.{a.name}" for a in node.names)
        graph[name] = {m for m in found if m == "vertumnus" or m.startswith("vertumnus.")}
    return graph


def _in(module: str, packages: tuple[str, ...]) -> str | None:
    return next((p for p in packages if module == p or module.startswith(p + ".")), None)


def test_the_import_graph_covers_every_mapped_package():
    graph = _import_graph()
    for package in (
        "vertumnus.core.routing",
        "vertumnus.sim.engine",
        "vertumnus.worker.engine",
        "vertumnus.router",
    ):
        assert package in graph, f"{package} missing from the import graph: the mapping is wrong"


def test_layers_core_imports_no_shell_and_shells_not_each_other():
    bad = []
    for module, imports in sorted(_import_graph().items()):
        for imported in sorted(imports):
            if _in(module, ("vertumnus.core",)):
                if not _in(imported, ("vertumnus.core",)) and imported != "vertumnus":
                    bad.append(f"{module} -> {imported}: the core imports only the core")
                continue
            shell = _in(module, SHELLS)
            if shell is None:
                continue  # a composer or a shared module
            other = _in(imported, SHELLS)
            if other is not None and other != shell:
                bad.append(f"{module} -> {imported}: shells are independent ({shell} / {other})")
            if _in(imported, COMPOSERS):
                bad.append(f"{module} -> {imported}: a shell must not import the command line")
    assert not bad, "layer contract broken:\n" + "\n".join(bad)


def test_shared_modules_import_no_shell():
    bad = [
        f"{module} -> {imported}"
        for module, imports in _import_graph().items()
        if _in(module, ("vertumnus.profiles", "vertumnus.data")) or module == "vertumnus"
        for imported in imports
        if _in(imported, SHELLS + COMPOSERS)
    ]
    assert not bad, bad


def test_no_top_level_operator_package():
    assert not (ROOT / "operator" / "__init__.py").exists()
    code = "import sys; sys.path.insert(0, '.'); import operator; assert hasattr(operator, 'itemgetter')"
    subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, check=True)


@pytest.mark.slow
def test_wheel_builds_and_imports_alone(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "build",
            "--wheel",
            "--no-isolation",
            "--outdir",
            str(tmp_path / "dist"),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = (tmp_path / "dist").glob("vertumnus-*.whl")
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    # -I -S: no site processing, so the editable install of the checkout is invisible;
    # numpy/scipy come from site-packages added by hand (no .pth files run).
    site = sysconfig.get_paths()["purelib"]
    code = (
        f"import sys; sys.path[:0] = [{str(target)!r}, {site!r}]\n"
        "import vertumnus, vertumnus.core.placement, vertumnus.sim.engine, vertumnus.profiles, vertumnus.worker\n"
        f"assert vertumnus.__file__.startswith({str(target)!r}), vertumnus.__file__\n"
        "from vertumnus.profiles import load_model; print(load_model().name)\n"
        "from vertumnus.operator.__main__ import main as operator_main\n"
        "assert operator_main(['crds']) == 0\n"
        "from vertumnus.cli import main; raise SystemExit(main(['profiles']))\n"
    )
    p = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, cwd=tmp_path
    )
    assert p.returncode == 0, p.stderr
    assert "qwen3-30b-a3b/h200" in p.stdout
    # The CRDs come from the wheel's package data (there is no crds/ beside an install).
    assert "name: cppools.vertumnus.io" in p.stdout and "clusterkopfpeerings.kopf.dev" in p.stdout
