"""A small async Kubernetes REST client (aiohttp), with the credentials kopf logs in with.

The operator needs a handful of calls: server-side apply, create, get, list, watch, merge
patch (with a resourceVersion precondition for the status), delete, and API discovery.
A full generated client would add a large dependency for that; this is ~150 lines over
aiohttp, which kopf already brings. Credentials come from kopf's own login functions
(:func:`kopf.login_with_kubeconfig` / :func:`kopf.login_with_service_account`), so the
operator's calls and kopf's watches authenticate as the same identity.

Errors are :class:`KubeError` with the HTTP status, the API's reason and message, so a
caller can tell a conflict (409) or a missing API (404) from a real failure.
"""

from __future__ import annotations

import base64
import builtins
import collections
import json
import os
import ssl
import tempfile
from collections.abc import AsyncGenerator, Mapping
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

__all__ = ["Conflict", "KubeClient", "KubeError", "NotFound", "connection_info", "request_kind"]

FIELD_MANAGER = "vertumnus-operator"


class KubeError(RuntimeError):
    """An API call that failed: HTTP ``status``, the Status object's ``reason`` and message."""

    def __init__(self, status: int, reason: str, message: str, method: str, path: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


class NotFound(KubeError):
    pass


class Conflict(KubeError):
    pass


def connection_info() -> Any:
    """kopf's ConnectionInfo for this process: the kubeconfig ($KUBECONFIG, ~/.kube/config)
    if there is one, else the pod's ServiceAccount."""
    import kopf

    settings = kopf.OperatorSettings()
    info = None
    if os.environ.get("KUBECONFIG") or os.path.exists(os.path.expanduser("~/.kube/config")):
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        info = kopf.login_with_service_account(settings=settings)
    if info is None:
        raise kopf.LoginError(
            "no kubeconfig ($KUBECONFIG, ~/.kube/config) and no ServiceAccount token"
        )
    return info


def _pem(data: str | bytes) -> bytes:
    # kubeconfig *-data fields are base64 of PEM; accept PEM as it is too.
    raw = data.encode() if isinstance(data, str) else data
    return raw if raw.lstrip().startswith(b"-----") else base64.b64decode(raw)


class KubeClient:
    """One aiohttp session to the API server. Use ``async with`` or call :meth:`close`."""

    def __init__(self, info: Any, timeout_s: float = 30.0) -> None:
        self.server = str(info.server).rstrip("/")
        self._headers = {"Accept": "application/json"}
        if info.token:
            self._headers["Authorization"] = f"{info.scheme or 'Bearer'} {info.token}"
        ctx = ssl.create_default_context()
        if info.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        if info.ca_path:
            ctx.load_verify_locations(cafile=os.fsdecode(info.ca_path))
        elif info.ca_data:
            ctx.load_verify_locations(cadata=_pem(info.ca_data).decode())
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        cert, key = info.certificate_path, info.private_key_path
        if info.certificate_data or info.private_key_data:
            # ssl can only load a client certificate from files.
            self._tmp = tempfile.TemporaryDirectory(prefix="vertumnus-operator-")
            if info.certificate_data:
                cert = os.path.join(self._tmp.name, "client.crt")
                with open(os.open(cert, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                    f.write(_pem(info.certificate_data))
            if info.private_key_data:
                key = os.path.join(self._tmp.name, "client.key")
                with open(os.open(key, os.O_WRONLY | os.O_CREAT, 0o600), "wb") as f:
                    f.write(_pem(info.private_key_data))
        if cert:
            ctx.load_cert_chain(os.fsdecode(cert), None if key is None else os.fsdecode(key))
        self._ssl = ctx
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self.requests: collections.Counter[tuple[str, str]] = collections.Counter()
        """Requests made, by (verb, resource): what the operator costs the API server
        (exported as ``vertumnus_operator_api_requests_total``)."""

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers=self._headers,
                timeout=self._timeout,
                connector=aiohttp.TCPConnector(ssl=self._ssl),
                trust_env=False,
            )
        return self._session

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:
        url = self.server + path
        if params:
            url += "?" + urlencode(params)
        self.requests[request_kind(method, path)] += 1
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if data is not None else {}
        async with self._sess().request(method, url, data=data, headers=headers) as resp:
            text = await resp.text()
            if resp.status >= 400:
                raise _error(resp.status, text, method, path)
            return json.loads(text) if text else {}

    # ---- verbs -----------------------------------------------------------------------------

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def list(self, path: str, label_selector: str | None = None) -> list[Any]:
        return (await self.list_versioned(path, label_selector))[0]

    async def list_versioned(
        self, path: str, label_selector: str | None = None
    ) -> tuple[builtins.list[Any], str]:
        """The items and the list's resourceVersion (where a watch of them starts)."""
        params = {"labelSelector": label_selector} if label_selector else None
        got = await self.request("GET", path, params=params)
        return list(got.get("items") or []), str(
            (got.get("metadata") or {}).get("resourceVersion", "")
        )

    async def watch(
        self, path: str, label_selector: str | None, resource_version: str, timeout_s: float
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The watch events of a collection from ``resource_version``, with bookmarks, until
        the server ends the watch after ``timeout_s`` (a stream silent for ``timeout_s`` plus
        30 s is taken as broken: :class:`asyncio.TimeoutError`)."""
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": resource_version,
            "timeoutSeconds": str(max(1, int(timeout_s))),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        url = self.server + path + "?" + urlencode(params)
        self.requests["watch", request_kind("GET", path)[1]] += 1
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30.0, sock_read=timeout_s + 30.0)
        async with self._sess().get(url, timeout=timeout) as resp:
            if resp.status >= 400:
                raise _error(resp.status, await resp.text(), "WATCH", path)
            buffer = b""
            # One JSON object per line; a pod can exceed aiohttp's line limit, so split here.
            async for chunk in resp.content.iter_any():
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield json.loads(line)

    async def create(self, path: str, body: Any, *, dry_run: bool = False) -> Any:
        params = (
            {"dryRun": "All", "fieldManager": FIELD_MANAGER}
            if dry_run
            else {"fieldManager": FIELD_MANAGER}
        )
        return await self.request("POST", path, body, params=params)

    async def apply(self, path: str, body: Any) -> Any:
        """Server-side apply of ``body`` at ``path`` (the object's own URL), forcing
        ownership: the operator is the one manager of what it renders."""
        return await self.request(
            "PATCH",
            path,
            body,
            params={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    async def merge_patch(self, path: str, body: Any) -> Any:
        return await self.request("PATCH", path, body, content_type="application/merge-patch+json")

    async def delete(self, path: str, *, grace_seconds: int | None = None) -> Any:
        body = None
        if grace_seconds is not None:
            body = {
                "kind": "DeleteOptions",
                "apiVersion": "v1",
                "gracePeriodSeconds": grace_seconds,
                "propagationPolicy": "Background",
            }
        try:
            return await self.request("DELETE", path, body)
        except NotFound:
            return None

    async def has_api(self, group_version: str) -> bool:
        """Whether the API server serves ``group/version`` (discovery)."""
        path = "/api/v1" if group_version == "v1" else f"/apis/{group_version}"
        try:
            await self.get(path)
        except NotFound:
            return False
        return True


def _error(status: int, text: str, method: str, path: str) -> KubeError:
    try:
        body = json.loads(text)
        reason, message = body.get("reason", ""), body.get("message", text)
    except ValueError:
        reason, message = "", text
    cls = {404: NotFound, 409: Conflict}.get(status, KubeError)
    return cls(status, reason, message, method, path)


_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def request_kind(method: str, path: str) -> tuple[str, str]:
    """The Kubernetes verb and resource of a REST call: ``("list", "pods")`` for a GET of
    ``/api/v1/namespaces/ns/pods``, ``("patch", "cppools/status")`` for a PATCH of a
    CPPool's status, ``("get", "")`` for discovery."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    # /api/v1/... or /apis/GROUP/VERSION/...
    rest = parts[2:] if parts[:1] == ["api"] else parts[3:]
    if len(rest) >= 3 and rest[0] == "namespaces":
        rest = rest[2:]  # a namespaced resource; "namespaces/NAME" alone is the namespace
    resource = "/".join(rest[:1] + rest[2:3])
    if method == "GET":
        return ("list" if len(rest) == 1 else "get"), resource
    return _VERBS.get(method, method.lower()), resource


def object_path(
    api_version: str, plural: str, namespace: str | None, name: str | None = None
) -> str:
    """The REST path of a collection (``name`` None) or of one object."""
    base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    if namespace is not None:
        base += f"/namespaces/{quote(namespace)}"
    base += f"/{plural}"
    return base if name is None else f"{base}/{quote(name)}"
