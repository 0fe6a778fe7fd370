"""Client channels to a router's port: plaintext, or TLS verified against a CA file.

``vertumnus admin`` (the Admin port, whose certificate the operator issues) and
``vertumnus load`` (the public port, when the router serves it with
``--tls-cert-file``) open theirs here. ``server_name`` is the name the certificate was
issued for, where it differs from the target (a port-forward to 127.0.0.1 reaches
``NAME-router.NAMESPACE.svc``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["channel"]


def channel(target: str, ca_file: str = "", server_name: str = "", aio: bool = False) -> Any:
    """A gRPC channel to ``target`` (``grpc.aio`` with ``aio``): TLS with ``ca_file``'s
    certificates as the roots, else plaintext. Raises ValueError naming a CA file that
    cannot be read."""
    import grpc

    kind = grpc.aio if aio else grpc
    if not ca_file:
        return kind.insecure_channel(target)
    try:
        with open(ca_file, "rb") as f:
            ca = f.read()
    except OSError as e:
        raise ValueError(f"--tls-ca-file {ca_file}: {e.strerror or e}") from None
    options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
    creds = grpc.ssl_channel_credentials(root_certificates=ca)
    return kind.secure_channel(target, creds, options=options)
