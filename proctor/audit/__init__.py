"""The audit trail: a write-ahead, hash-chained, checkpointed JSON Lines log, and its verifier.

`AuditLog` is the `AuditSink` the gate writes to; `verify` checks a log end to end
(`proctor audit verify` on the command line). Format and guarantees: docs/audit.md.
"""

from __future__ import annotations

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
