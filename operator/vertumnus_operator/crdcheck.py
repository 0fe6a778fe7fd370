"""Is the installed CPPool CRD the one this operator ships?

Helm installs a chart's ``crds/`` once and never upgrades them. After ``helm upgrade``
the cluster can hold an older CPPool CRD than the operator's, and the API server then
drops, without a word, every field the old schema does not know (a CPPool's
``spec.router.tls`` vanishes on ``kubectl apply``). So the operator compares the installed
CRD's schemas with its own at start and every :data:`CHECK_EVERY_S`: a difference is
logged as a warning with the first path that differs and what to run, and exported as
``vertumnus_operator_crd_current`` 0 (alert ``VertumnusCRDOutdated``).

It reads the CRD by listing CustomResourceDefinitions with a field selector: kopf's
discovery already needs ``list`` on them, and the operator gets no more.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from vertumnus.operator.crd import GROUP, PLURAL
from vertumnus.operator.kube import KubeClient

__all__ = ["CHECK_EVERY_S", "FIX", "check", "difference", "packaged_crds", "shipped_cppool"]

CHECK_EVERY_S = 300.0
"""How often the operator compares the installed CRD with its own (and at start)."""
NAME = f"{PLURAL}.{GROUP}"
FIX = (
    "python -m vertumnus.operator crds | kubectl apply --server-side -f - (or kubectl apply "
    "--server-side -f deploy/helm/vertumnus/crds/ of the chart's version; helm upgrade "
    "does not upgrade CRDs)"
)


def packaged_crds() -> list[tuple[str, str]]:
    """(file name, YAML) of every CRD the package ships, by name."""
    folder = resources.files("vertumnus.operator") / "crds"
    return sorted(
        (f.name, f.read_text(encoding="utf-8"))
        for f in folder.iterdir()
        if f.name.endswith(".yaml")
    )


def shipped_cppool() -> dict[str, Any]:
    """The CPPool CRD this package ships."""
    for _, text in packaged_crds():
        doc = yaml.safe_load(text)
        if doc.get("metadata", {}).get("name") == NAME:
            return dict(doc)
    raise RuntimeError(f"the installed package ships no {NAME} CRD")


def _schemas(crd: dict[str, Any]) -> dict[str, Any]:
    """Each version's schema and printer columns, by version name."""
    return {
        v["name"]: {
            "schema": (v.get("schema") or {}).get("openAPIV3Schema"),
            "additionalPrinterColumns": v.get("additionalPrinterColumns") or [],
        }
        for v in crd.get("spec", {}).get("versions") or []
    }


def difference(installed: Any, shipped: Any, path: str = "") -> str | None:
    """The first path where ``installed`` differs from ``shipped`` (None: the same)."""
    if isinstance(installed, dict) and isinstance(shipped, dict):
        for key in sorted(set(installed) | set(shipped)):
            where = f"{path}.{key}" if path else str(key)
            if key not in installed:
                return f"{where}: missing in the installed CRD"
            if key not in shipped:
                return f"{where}: in the installed CRD, not in this operator's"
            found = difference(installed[key], shipped[key], where)
            if found is not None:
                return found
        return None
    if isinstance(installed, list) and isinstance(shipped, list) and len(installed) == len(shipped):
        for i, (a, b) in enumerate(zip(installed, shipped, strict=True)):
            found = difference(a, b, f"{path}[{i}]")
            if found is not None:
                return found
        return None
    if installed != shipped:
        return f"{path}: {installed!r} in the installed CRD, {shipped!r} in this operator's"
    return None


async def check(kube: KubeClient) -> str | None:
    """What is wrong with the installed CPPool CRD (None: it is this operator's)."""
    got = await kube.request(
        "GET",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
        params={"fieldSelector": f"metadata.name={NAME}"},
    )
    items = got.get("items") or []
    if not items:
        return f"the {NAME} CRD is not installed: {FIX}"
    found = difference(_schemas(items[0]), _schemas(shipped_cppool()))
    if found is None:
        return None
    return f"the installed {NAME} CRD is not this operator's ({found}): {FIX}"
