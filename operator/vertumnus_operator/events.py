"""Kubernetes Events on the CPPool: the story ``kubectl describe cppool`` tells.

Every decision of the controller and every step of a transition is one Event (reason
``Split``/``Merge`` for decisions, ``Draining``, ``Switching``, ``Committed`` for steps,
``Resumed`` after a restart, ``NeedsNewPods`` / ``RouterConfigUpdated`` for spec changes,
``GangUnavailable`` for the gang scheduler...). Events are posted by the operator itself
(core/v1, ``create`` only), not through kopf's own posting, so they are in order and a
unit test can read them back from a :class:`MemoryEvents`.
"""

from __future__ import annotations

import datetime
import itertools
import logging
import os
from typing import Any, Protocol

from vertumnus.operator import envnames
from vertumnus.operator.crd import API_VERSION, KIND
from vertumnus.operator.kube import KubeClient, KubeError, object_path

__all__ = ["EventSink", "KubeEvents", "MemoryEvents"]

log = logging.getLogger(__name__)
COMPONENT = "vertumnus-operator"


class EventSink(Protocol):
    async def post(self, type_: str, reason: str, message: str) -> None: ...


class MemoryEvents:
    """Events kept in a list (unit tests)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    async def post(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def reasons(self) -> list[str]:
        return [r for _, r, _ in self.events]


class KubeEvents:
    """core/v1 Events about one CPPool."""

    _seq = itertools.count()

    def __init__(self, kube: KubeClient, name: str, namespace: str, uid: str) -> None:
        self.kube = kube
        self.involved = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": name,
            "namespace": namespace,
            "uid": uid,
        }
        self.namespace = namespace
        self.name = name
        self.instance = os.environ.get(envnames.POD_NAME) or os.uname().nodename

    async def post(self, type_: str, reason: str, message: str) -> None:
        now = datetime.datetime.now(datetime.UTC)
        stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                # Unique and sortable: kubectl describe lists them by time anyway.
                "name": f"{self.name}.{now.strftime('%Y%m%d%H%M%S%f')}{next(self._seq):04d}",
                "namespace": self.namespace,
            },
            "involvedObject": self.involved,
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.instance,
        }
        log.info("event %s %s: %s", type_, reason, message)
        try:
            await self.kube.create(object_path("v1", "events", self.namespace), body)
        except KubeError as e:  # an Event is never worth failing a transition for
            log.warning("could not post event %s: %s", reason, e)
