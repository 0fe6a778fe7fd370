"""Build hooks: compile proto/ into vertumnus._proto, and the placement hot
path, the what-if replay, the shadow pools and the prefix index's node into
optional C extensions.

The generated modules are build outputs, never committed: ``build_py`` writes
them into ``src/vertumnus/_proto/`` (gitignored) before setuptools collects
the package, so editable installs and wheels both carry them. protoc emits
imports by the proto's path (``from vertumnus.worker.v1 import worker_pb2``,
``from vertumnus.v1 import pool_pb2``); they are rewritten to the package the
modules actually live in. After editing a .proto, re-run
``pip install -e . --no-deps``.

The C extensions are optional: where no C compiler is available the build
goes on without them and placement, the what-if replay and the shadow pools run
their pure-Python twins (same results, slower; ``HOT_PATH`` in
``vertumnus.core.placement``, ``vertumnus.core.whatif`` and
``vertumnus.core.shadow`` says which one runs),
and the prefix index's nodes stay in the cyclic garbage collector's walks
(``vertumnus.core._trienode``; ``UNTRACKED`` in ``vertumnus.core.trie``).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py
from setuptools.command.egg_info import egg_info

ROOT = Path(__file__).parent
PROTO_ROOT = ROOT / "proto"
OUT = ROOT / "src" / "vertumnus" / "_proto"


def compile_protos() -> None:
    import tempfile

    from grpc_tools import protoc

    protos = sorted(PROTO_ROOT.rglob("*.proto"))
    if not protos:
        raise RuntimeError(f"no .proto files under {PROTO_ROOT}")
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "__init__.py").write_text('"""Generated from proto/ at build time; do not edit."""\n')
    include = str(Path(protoc.__file__).parent / "_proto")
    with tempfile.TemporaryDirectory() as tmp:
        for proto in protos:
            rel = proto.relative_to(PROTO_ROOT)
            args = [
                "protoc",
                f"-I{PROTO_ROOT}",
                f"-I{include}",
                f"--python_out={tmp}",
                f"--grpc_python_out={tmp}",
                f"--pyi_out={tmp}",
                str(rel),
            ]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {rel}")
        for generated in Path(tmp).rglob("*_pb2*.py*"):
            text = generated.read_text()
            text = re.sub(
                r"^from vertumnus(?:\.\w+)*\.v1 import",
                "from vertumnus._proto import",
                text,
                flags=re.M,
            )
            (OUT / generated.name).write_text(text)


class BuildPyWithProtos(build_py):
    def run(self) -> None:
        compile_protos()
        super().run()


class EggInfoWithProtos(egg_info):
    """egg_info lists package files before build_py runs, so the package must exist first."""

    def run(self) -> None:
        compile_protos()
        super().run()


# Identical floats to the Python path need no fused multiply-add contraction.
_FP_STRICT = [] if sys.platform == "win32" else ["-O2", "-ffp-contract=off"]

setup(
    cmdclass={"build_py": BuildPyWithProtos, "egg_info": EggInfoWithProtos},
    ext_modules=[
        Extension(
            "vertumnus.core._placement",
            ["src/vertumnus/core/_placement.c"],
            extra_compile_args=_FP_STRICT,
            optional=True,
        ),
        Extension(
            "vertumnus.core._whatif",
            ["src/vertumnus/core/_whatif.c"],
            depends=["src/vertumnus/core/_minheap.h"],
            extra_compile_args=_FP_STRICT,
            optional=True,
        ),
        Extension(
            "vertumnus.core._shadow",
            ["src/vertumnus/core/_shadow.c"],
            depends=["src/vertumnus/core/_minheap.h"],
            extra_compile_args=_FP_STRICT,
            optional=True,
        ),
        Extension("vertumnus.core._trienode", ["src/vertumnus/core/_trienode.c"], optional=True),
    ],
)
