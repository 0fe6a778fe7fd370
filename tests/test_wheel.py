"""The wheel, installed where no checkout is, runs what the images run.

``deploy/docker/Dockerfile`` builds the wheel and installs it into a bare Python; the
chart's operator, the routers and the domain pods then run ``python -m vertumnus.operator``,
``vertumnus router``, ``vertumnus serve`` and ``vertumnus worker`` from it. Here the same
wheel is built from a copy of what the Dockerfile copies, installed into a directory of its
own, and run with the site machinery off (so neither this checkout nor its editable
install can stand in for it): what a wheel lacks (the compiled protos, the CRDs, the
bundled profiles, the C extensions) fails here instead of in a pod. The installed
dependencies are borrowed from this environment's site-packages.

The Dockerfiles themselves are not built (no container engine here); the last test holds
them to what the chart and pyproject.toml say.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCKER = ROOT / "deploy" / "docker"
COPIED = ["pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "proto", "src", "router",
          "worker", "operator"]  # fmt: skip
"""What the Dockerfile's wheel stage copies (and .dockerignore lets through)."""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from a copy of what the Dockerfile copies, installed (no deps)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.so", "_proto", "*.egg-info")
    for name in COPIED:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=skip)
        else:
            shutil.copy2(path, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    wheels = tmp / "wheels"
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src)],
        check=True,
        timeout=300,
    )
    (wheel,) = wheels.glob("vertumnus-*.whl")
    target = tmp / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True)
    return target


def _python(target: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``code`` with the wheel first on the path and no site hooks (the editable install's
    path hook is one); the dependencies from this environment's site-packages."""
    deps = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    boot = f"import sys; sys.path[:0] = {[str(target), *deps]!r}; " + code
    return subprocess.run(
        [sys.executable, "-S", "-c", boot, *args],
        capture_output=True,
        text=True,
        cwd=target.parent,  # not the checkout: nothing of it on the path
        timeout=120,
    )


def run(target: Path, module: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the wheel."""
    return _python(
        target,
        f"import runpy; sys.argv = [{module!r}, *sys.argv[1:]]; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)",
        *args,
    )


def test_the_wheel_alone_is_what_runs(installed: Path) -> None:
    out = run(installed, "vertumnus", "--version")
    assert out.returncode == 0 and out.stdout.startswith("vertumnus "), out.stderr
    probe = _python(
        installed,
        "import vertumnus, vertumnus._proto.pool_pb2 as p, vertumnus._proto.worker_pb2_grpc as w; "
        "print(vertumnus.__file__); print(p.__file__); print(w.__file__)",
    )
    assert probe.returncode == 0, probe.stderr
    assert all(line.startswith(str(installed)) for line in probe.stdout.split()), probe.stdout


def test_the_operator_runs_from_the_wheel_with_its_crds(installed: Path) -> None:
    crds = run(installed, "vertumnus.operator", "crds")
    assert crds.returncode == 0, crds.stderr
    assert (ROOT / "crds" / "cppool.yaml").read_text().strip() in crds.stdout
    example = ROOT / "deploy" / "helm" / "vertumnus" / "examples" / "cppool.yaml"
    render = run(installed, "vertumnus.operator", "render", "-f", str(example))
    assert render.returncode == 0, render.stderr
    kinds = {i["kind"] for i in json.loads(render.stdout)["items"]}
    assert {"Deployment", "ConfigMap", "Service", "PodGroup"} <= kinds, kinds
    assert run(installed, "vertumnus.operator", "run", "--help").returncode == 0


@pytest.mark.parametrize("command", ["router", "serve", "worker", "admin"])
def test_the_pods_commands_run_from_the_wheel(installed: Path, command: str) -> None:
    out = run(installed, "vertumnus", command, "--help")
    assert out.returncode == 0 and "usage: vertumnus" in out.stdout, out.stderr


def test_the_simulator_runs_from_the_wheel_on_its_bundled_profile(installed: Path) -> None:
    """The README's first command, on the wheel: bundled profiles and the compiled what-if
    replay (vertumnus-adaptive looks every hop)."""
    out = run(
        installed,
        "vertumnus",
        "simulate",
        "--requests",
        "300",
        "--compare",
        "vertumnus:4xCP4+3xCP8,vertumnus-adaptive",
        "--no-progress",
    )
    assert out.returncode == 0, out.stderr
    assert "vertumnus-adaptive" in out.stdout
    hot = _python(
        installed,
        "from vertumnus.core import whatif, placement, shadow; "
        "print(whatif.HOT_PATH, placement.HOT_PATH, shadow.HOT_PATH)",
    )
    assert hot.stdout.split() == ["c", "c", "c"], hot.stdout + hot.stderr


def test_the_dockerfiles_match_the_chart_and_the_build_requirements() -> None:
    build = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    for name in ("Dockerfile", "Dockerfile.sglang"):
        text = (DOCKER / name).read_text()
        for requirement in build:  # the wheel stage builds with exactly these
            assert f'"{requirement}"' in text, (name, requirement)
        copied = re.findall(r"^COPY (?!--from)(.+?) \S+$", text, re.M)
        assert sorted(" ".join(copied).split()) == sorted(COPIED), (name, copied)
        # The chart and the operator give each container its command.
        assert not re.search(r"^ENTRYPOINT", text, re.M), name
    main = (DOCKER / "Dockerfile").read_text()
    deployment = (ROOT / "deploy/helm/vertumnus/templates/deployment.yaml").read_text()
    uid = re.search(r"runAsUser: (\d+)", deployment)
    assert uid and f"USER {uid.group(1)}" in main
    assert "ARG EXTRAS=worker,router,operator" in main
    sglang = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]["sglang"]
    (pin,) = [r for r in sglang if r.startswith("sglang==")]
    version = pin.split("==")[1]
    assert (
        f"ARG SGLANG_IMAGE=lmsysorg/sglang:v{version}" in (DOCKER / "Dockerfile.sglang").read_text()
    )
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert sorted(p[1:] for p in ignored if p.startswith("!")) == sorted(COPIED)
