"""The operator's Admin secrets, from their files: its key (each pool's Admin token is
derived from it, :mod:`vertumnus.admintoken`) and its CA (which issues the routers' Admin
certificates, :mod:`vertumnus.admintls`).

One loader for every way the operator starts: ``python -m vertumnus.operator run`` and
``render`` (flags, defaulting to the environment) and ``kopf run -m
vertumnus.operator.kopf_entry`` (the environment alone). Imports no kopf.
"""

from __future__ import annotations

from vertumnus.admintls import read_ca
from vertumnus.admintoken import read_key
from vertumnus.operator import envnames

__all__ = ["load"]


def load(
    key_file: str, ca_file: str, ca_key_file: str, *, need_key: bool = True
) -> tuple[bytes | None, tuple[bytes, bytes] | None]:
    """(the key, the CA's certificate and key) from their files; a path left empty gives
    None (a key is refused missing when ``need_key``: the operator does not run pools
    whose Admin API anyone could call).

    Raises ValueError saying what is missing or wrong, and how to mend it."""
    if need_key and not key_file:
        raise ValueError(
            f"no admin key: set --admin-key-file or ${envnames.ADMIN_KEY_FILE} to a file of "
            "at least 16 random bytes (the chart mounts its Secret "
            "<release>-vertumnus-operator-admin-key), e.g. "
            "head -c 32 /dev/urandom | base64 > admin.key"
        )
    key = read_key(key_file) if key_file else None
    if bool(ca_file) != bool(ca_key_file):
        raise ValueError(
            "the admin CA's certificate and key go together (--admin-ca-file and "
            f"--admin-ca-key-file, or ${envnames.ADMIN_CA_FILE} and "
            f"${envnames.ADMIN_CA_KEY_FILE})"
        )
    return key, read_ca(ca_file, ca_key_file) if ca_file else None
