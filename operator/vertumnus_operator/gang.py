"""Gang-scheduling backends: all of a pool's domain pods bind, or none does.

One small interface (:class:`GangBackend`) with three implementations, chosen by
``spec.gang.backend``:

- :class:`NativeGang` — Kubernetes' own ``scheduling.k8s.io/v1beta1`` PodGroup (1.37,
  beta, gate ``GenericWorkload``): ``spec.schedulingPolicy.gang.minCount`` = the domain
  count, each pod names it in ``spec.schedulingGroup.podGroupName``;
- :class:`VolcanoGang` — Volcano's ``scheduling.volcano.sh/v1beta1`` PodGroup
  (``minMember``, ``minResources``), pods with ``schedulerName: volcano`` and the
  annotation ``scheduling.k8s.io/group-name``;
- :class:`NoGang` — plain pods (each binds on its own; the pool may be left partly
  placed, which the status then says).

A backend renders its group object and its part of each pod, says which API it needs
(checked by discovery before any pod is created), checks that a pod read back from the
API server still carries its gang fields (a cluster with the gate off *silently drops*
``spec.schedulingGroup``; the operator creates pods with a dry run first and refuses to go
on rather than let them schedule one by one), and reads its group object's status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "GangBackend",
    "GangStatus",
    "NativeGang",
    "NoGang",
    "VolcanoGang",
    "backend_for",
]


@dataclass(frozen=True)
class GangStatus:
    """What the group object says: scheduled (True/False/None = not known yet), why."""

    scheduled: bool | None
    reason: str
    message: str


class GangBackend(Protocol):
    name: str
    api_version: str | None
    """The group/version the backend needs served (None: nothing)."""
    plural: str | None

    def group(
        self,
        name: str,
        namespace: str,
        domains: int,
        gpus: int,
        gpu_resource: str,
        labels: Mapping[str, str],
    ) -> dict[str, Any] | None:
        """The group object (None: this backend has none)."""
        ...

    def pod_fields(self, group_name: str) -> tuple[dict[str, Any], dict[str, str]]:
        """(fields merged into the pod's spec, annotations added to the pod)."""
        ...

    def dropped(self, pod: Mapping[str, Any], group_name: str) -> str | None:
        """Why a pod read back lacks its gang fields (None: it has them)."""
        ...

    def status(self, group: Mapping[str, Any] | None) -> GangStatus: ...


class NativeGang:
    name = "native"
    api_version: str | None = "scheduling.k8s.io/v1beta1"
    plural: str | None = "podgroups"

    def group(
        self,
        name: str,
        namespace: str,
        domains: int,
        gpus: int,
        gpu_resource: str,
        labels: Mapping[str, str],
    ) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {"schedulingPolicy": {"gang": {"minCount": domains}}},
        }

    def pod_fields(self, group_name: str) -> tuple[dict[str, Any], dict[str, str]]:
        return {"schedulingGroup": {"podGroupName": group_name}}, {}

    def dropped(self, pod: Mapping[str, Any], group_name: str) -> str | None:
        got = (pod.get("spec") or {}).get("schedulingGroup") or {}
        if got.get("podGroupName") == group_name:
            return None
        return (
            "the API server dropped spec.schedulingGroup from the pool's pods (feature gate "
            "GenericWorkload is off on kube-apiserver): they would be scheduled one by one"
        )

    def status(self, group: Mapping[str, Any] | None) -> GangStatus:
        if group is None:
            return GangStatus(None, "GroupMissing", "the PodGroup does not exist yet")
        for c in (group.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodGroupInitiallyScheduled":
                return GangStatus(
                    c.get("status") == "True", c.get("reason") or "", c.get("message") or ""
                )
        return GangStatus(None, "Pending", "the scheduler has not reported on the PodGroup yet")


class VolcanoGang:
    name = "volcano"
    api_version: str | None = "scheduling.volcano.sh/v1beta1"
    plural: str | None = "podgroups"
    ANNOTATION = "scheduling.k8s.io/group-name"

    def __init__(self, queue: str = "default") -> None:
        self.queue = queue

    def group(
        self,
        name: str,
        namespace: str,
        domains: int,
        gpus: int,
        gpu_resource: str,
        labels: Mapping[str, str],
    ) -> dict[str, Any]:
        return {
            "apiVersion": self.api_version,
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
            "spec": {
                "minMember": domains,
                "minResources": {gpu_resource: str(gpus)},
                "queue": self.queue,
            },
        }

    def pod_fields(self, group_name: str) -> tuple[dict[str, Any], dict[str, str]]:
        return {"schedulerName": "volcano"}, {self.ANNOTATION: group_name}

    def dropped(self, pod: Mapping[str, Any], group_name: str) -> str | None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if annotations.get(self.ANNOTATION) == group_name and (
            (pod.get("spec") or {}).get("schedulerName") == "volcano"
        ):
            return None
        return f"the pods lost schedulerName volcano or the {self.ANNOTATION} annotation"

    def status(self, group: Mapping[str, Any] | None) -> GangStatus:
        if group is None:
            return GangStatus(None, "GroupMissing", "the Volcano PodGroup does not exist yet")
        st = group.get("status") or {}
        phase = st.get("phase") or ""
        if phase in ("Running", "Completed"):
            return GangStatus(True, phase, f"Volcano PodGroup {phase}")
        for c in st.get("conditions") or []:
            if c.get("type") == "Unschedulable" and c.get("status") == "True":
                return GangStatus(False, c.get("reason") or "Unschedulable", c.get("message") or "")
        return GangStatus(None, phase or "Pending", f"Volcano PodGroup {phase or 'Pending'}")


class NoGang:
    name = "none"
    api_version: str | None = None
    plural: str | None = None

    def group(
        self,
        name: str,
        namespace: str,
        domains: int,
        gpus: int,
        gpu_resource: str,
        labels: Mapping[str, str],
    ) -> None:
        return None

    def pod_fields(self, group_name: str) -> tuple[dict[str, Any], dict[str, str]]:
        return {}, {}

    def dropped(self, pod: Mapping[str, Any], group_name: str) -> str | None:
        return None

    def status(self, group: Mapping[str, Any] | None) -> GangStatus:
        return GangStatus(
            False,
            "GangDisabled",
            "spec.gang.backend is none: the domain pods are scheduled one by one",
        )


def backend_for(name: str, queue: str = "default") -> GangBackend:
    if name == "native":
        return NativeGang()
    if name == "volcano":
        return VolcanoGang(queue)
    if name == "none":
        return NoGang()
    raise ValueError(f"spec.gang.backend: unknown backend {name!r} (native, volcano, none)")
