"""Client channels to a router's port: plaintext, or TLS verified against a CA file.

``vertumnus admin`` (the Admin port, whose certificate the operator issues) and
``vertumnus load`` (the public port, when the router serves it with
``--tls-cert-file``) open theirs here. ``server_name`` is the name the certificate was
issued for, where it differs from the target (a port-forward to 127.0.0.1 reaches
``NAME-router.NAMESPACE.svc``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["add_tls_flags", "channel"]


def add_tls_flags(p: Any, ca_hint: str) -> None:
    """``--tls-ca-file`` and ``--tls-server-name`` of a client command (``ca_hint``: where
    its CA comes from), for :func:`channel`."""
    p.add_argument(
        "--tls-ca-file",
        default="",
        metavar="PATH",
        help=f"dial over TLS, verifying the router against this CA (PEM; {ca_hint})",
    )
    p.add_argument(
        "--tls-server-name",
        default="",
        metavar="NAME",
        help="the name the router's certificate must carry, when --target does not (a "
        "port-forward to 127.0.0.1; an operator's pool: NAME-router.NAMESPACE.svc)",
    )


def channel(target: str, ca_file: str = "", server_name: str = "", aio: bool = False) -> Any:
    """A gRPC channel to ``target`` (``grpc.aio`` with ``aio``): TLS with ``ca_file``'s
    certificates as the roots, else plaintext. Raises ValueError naming a CA file that
    cannot be read."""
    import grpc

    from vertumnus.admintls import AdminTLS

    kind = grpc.aio if aio else grpc
    if not ca_file:
        return kind.insecure_channel(target)
    try:
        with open(ca_file, "rb") as f:
            tls = AdminTLS(f.read(), server_name)
    except OSError as e:
        raise ValueError(f"--tls-ca-file {ca_file}: {e.strerror or e}") from None
    return kind.secure_channel(target, tls.credentials(), options=tls.options())
