"""The audit trail: a write-ahead, hash-chained, checkpointed JSON Lines log, and its verifier.

`AuditLog` is the `AuditSink` the gate writes to; `verify` checks a log end to end
(`proctor audit verify` on the command line). Format and guarantees: docs/audit.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import proctor._lazy as _lazy

if TYPE_CHECKING:
    from proctor.audit.base import KINDS, AuditResult, AuditSink
    from proctor.audit.keys import generate_keypair, key_id, load_private_key, load_public_key
    from proctor.audit.log import AuditLog
    from proctor.audit.merkle import EMPTY_ROOT, MerkleFrontier, merkle_root
    from proctor.audit.records import CODES, GENESIS
    from proctor.audit.scan import Failure
    from proctor.audit.verify import VerifyReport, verify

__all__ = [
    "CODES",
    "EMPTY_ROOT",
    "GENESIS",
    "KINDS",
    "AuditLog",
    "AuditResult",
    "AuditSink",
    "Failure",
    "MerkleFrontier",
    "VerifyReport",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "merkle_root",
    "verify",
]

_lazy.install(__name__, {
    "KINDS": "proctor.audit.base",
    "AuditResult": "proctor.audit.base",
    "AuditSink": "proctor.audit.base",
    "generate_keypair": "proctor.audit.keys",
    "key_id": "proctor.audit.keys",
    "load_private_key": "proctor.audit.keys",
    "load_public_key": "proctor.audit.keys",
    "AuditLog": "proctor.audit.log",
    "EMPTY_ROOT": "proctor.audit.merkle",
    "MerkleFrontier": "proctor.audit.merkle",
    "merkle_root": "proctor.audit.merkle",
    "CODES": "proctor.audit.records",
    "GENESIS": "proctor.audit.records",
    "Failure": "proctor.audit.scan",
    "VerifyReport": "proctor.audit.verify",
    "verify": "proctor.audit.verify",
})
