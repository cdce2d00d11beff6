"""The node credential: what executors and scheduler replicas present to a served registry.

Client tokens (admin, submit, read) are for the REST API; only processes that hold the
cluster secret may write the registry, because a registry entry says where a job's data
is read from. Rather than ship a second secret, each such process derives the credential
from the cluster secret it already has: ``HMAC-SHA256(secret, b"triplane-node-credential")``
in hex. The derivation is one-way, so a leaked node credential does not reveal the secret
that signs packets and data-port requests (docs/security.md).
"""

from __future__ import annotations

import hashlib
import hmac
import os

__all__ = ["NODE_CREDENTIAL_LABEL", "node_credential", "node_credential_from_env"]

NODE_CREDENTIAL_LABEL = b"triplane-node-credential"


def node_credential(secret: bytes | str) -> str:
    """The node credential of the cluster whose secret is ``secret`` (hex, 64 characters)."""
    key = secret.encode("utf-8") if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("the node credential is derived from the cluster secret, which is empty")
    return hmac.new(key, NODE_CREDENTIAL_LABEL, hashlib.sha256).hexdigest()


def node_credential_from_env(env: dict[str, str] | None = None) -> str | None:
    """The node credential derived from ``$TRIPLANE_SECRET``, or None where it is not set."""
    secret = (os.environ if env is None else env).get("TRIPLANE_SECRET", "").strip()
    return node_credential(secret) if secret else None
