"""A gRPC port's TLS certificate and key, read again when they change.

The router serves TLS on its Admin port with the certificate the operator issues
(:mod:`vertumnus.admintls`), and on its public port with one the user provides (in
Kubernetes a ``kubernetes.io/tls`` Secret, e.g. cert-manager's, which renews it in place).
"""

from __future__ import annotations

import logging
import os
import ssl

import grpc

from vertumnus.admintoken import read_bytes

__all__ = ["CertFiles"]

_log = logging.getLogger("vertumnus.router")


class CertFiles:
    """A port's certificate and key, read again when either file changes: each new
    connection's handshake asks (:meth:`credentials`), so a certificate issued anew (the
    operator's for the admin port, cert-manager's for the public one) takes effect
    without a restart. A pair that cannot be read or does not match keeps the one before
    (and says so); at start it is refused. ``port`` names the port in messages."""

    def __init__(self, cert_file: str, key_file: str, port: str) -> None:
        self.cert_file, self.key_file, self.port = cert_file, key_file, port
        self._seen = self._stamp()
        self._pair = self._read()

    def _stamp(self) -> tuple[tuple[int, int, int] | None, ...]:
        out: list[tuple[int, int, int] | None] = []
        for path in (self.cert_file, self.key_file):
            try:
                st = os.stat(path)
            except OSError:
                out.append(None)
            else:
                out.append((st.st_ino, st.st_mtime_ns, st.st_size))
        return tuple(out)

    def _read(self) -> tuple[bytes, bytes]:
        """(key, certificate chain) PEM, checked to belong together.

        Raises ValueError naming the file."""
        pems = [
            read_bytes(f"{self.port} TLS file", path) for path in (self.key_file, self.cert_file)
        ]
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as e:
            raise ValueError(
                f"{self.port} TLS files {self.cert_file}, {self.key_file}: not a PEM certificate and "
                f"its key ({e})"
            ) from None
        return pems[0], pems[1]

    def credentials(self) -> grpc.ServerCredentials:
        config = grpc.ssl_server_certificate_configuration([self._pair])
        return grpc.dynamic_ssl_server_credentials(config, self._fetch)

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = self._stamp()
        if stamp == self._seen:
            return None
        try:
            pair = self._read()
        except ValueError as e:
            _log.error("keeping the %s port's certificate: %s", self.port, e)
            return None
        self._seen, self._pair = stamp, pair
        _log.info("the %s port's certificate changed: serving the new one", self.port)
        return grpc.ssl_server_certificate_configuration([pair])
