"""Answer seals: an approval's answer is believed only when an answerer sealed it under a key the store lacks.

A run store is not trusted (docs/durable.md, "Who can do what"). Whoever can write its approvals table
could otherwise write ``approve by bob`` into a pending approval, and the gate, which re-checks that bob
may answer, could not tell that row from one the inbox wrote. So the answerers — the inbox
(`proctor serve`, its pages and API) and ``proctor approvals approve|deny|edit --store`` — seal every
answer they store: an HMAC-SHA256 over its canonical JSON together with the approval it answers (id,
run, call, binding, deadline, and the tool and arguments the answerer was shown) and everything the
answer says (verdict, approver, how the approver was
proven, groups, OS account, address, edited arguments, grant, reason, when). The gate
(`InboxApprover`, for a run waiting in its process and for a resumed one) checks the seal before it
believes the answer; one missing, wrong, made with another key, or copied from another approval is
refused (``approval_refused``, code ``seal``), taken back (the approval is pending again, for a real
approver, until its deadline), and nothing runs on it.

**The key** is the run's audit trail's secret derived for one purpose, ``approval-answers``
(`AuditSink.key_for`), as the store's own seals use ``run-store`` (`proctor.store.seal`):

- no new configuration: the gate has its trail, and an answerer on the same host derives the same key
  from the trail it records refusals in (``--audit``, the default `proctor run` writes);
- the store never holds it (a file log keeps its secret in ``LOG.redact-key``; a PostgreSQL log in its
  row of ``proctor_audit_logs``: give the store's users no access to that table);
- an answerer that should not hold the trail's secret gets only the derived key, as a file
  (``proctor approvals answer-key --audit LOG --out FILE``, then ``--answer-key FILE`` or
  ``$PROCTOR_ANSWER_KEY``). HMAC derivation is one-way: that key cannot give back the trail's secret,
  so its holder can neither seal the run's store entries (``run-store``), compute the trail's redaction
  digests, nor sign its checkpoints (an Ed25519 key of its own). It can seal answers, which is what an
  answerer does;
- rotating it is rotating the trail's secret (a new trail: its runs verify answers under the new
  key) — an answer sealed under another key is refused, saying whose key it was sealed with.

Why not one key per approver: the inbox authenticates approvers (tokens, sessions, a proxy) and writes
their answers; it can answer as any of them whatever the key scheme, so per-approver keys held by the
inbox would prove nothing more, and approvers' browsers hold no keys. The seal's job is narrower and
exact: a row only the store's writers wrote is not an answer.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from pathlib import Path

from proctor.canonical import canonical_bytes, json_shaped
from proctor.errors import ConfigurationError, ProctorError
from proctor.store.base import ApprovalAnswer, PendingApproval
from proctor.store.refusals import RefusalSink, refusal_fields, write_refusal

__all__ = ["ENV", "PURPOSE", "AnswerCheck", "AnswerSeal"]

#: What the audit sink's key is derived for (`AuditSink.key_for`).
PURPOSE = "approval-answers"
#: The environment variable naming an answer key file (what ``--answer-key`` gives).
ENV = "PROCTOR_ANSWER_KEY"
_VERSION = "v1"


class AnswerSeal:
    """Seals answers and checks their seals, with one key (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ConfigurationError(f"an answer key needs at least 16 bytes, got {len(key)}")
        self._key = key
        #: A name for the key that gives nothing of it away: says which key sealed an answer.
        self.key_id = hashlib.sha256(b"proctor answer key id\x00" + key).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"AnswerSeal(key {self.key_id})"

    # -- where the key comes from ----------------------------------------------------------------

    @classmethod
    def of_secret(cls, secret: bytes) -> AnswerSeal:
        """The answer seal of an audit trail whose secret is `secret` (what its `key_for(PURPOSE)` gives)."""
        from proctor.audit.base import derive_key

        return cls(derive_key(secret, PURPOSE))

    @classmethod
    def of_trail(cls, url: str, *, create: bool = False) -> AnswerSeal:
        """The answer seal of the audit trail at `url` (a file log, or ``postgresql://…?log=NAME``), read
        without opening the trail for writing; `ConfigurationError` naming the fix when it cannot be read.
        With `create`, a file trail no run has written yet gets its secret now (the first run reads it)."""
        if url.startswith(("postgresql://", "postgres://")):
            try:
                from proctor.audit.postgres import redaction_secret
            except ImportError as exc:
                raise ConfigurationError(f"the audit trail {url.split('?')[0]} needs {exc.name or 'psycopg'}: "
                                         "pip install 'proctor[postgres]'") from None
            try:
                try:
                    return cls.of_secret(redaction_secret(url))
                except ProctorError:
                    if not create:
                        raise
                # No run has written the log yet: opened as a writer opens it (its row made), then let go.
                from proctor.backends import load_audit

                sink, _, _ = load_audit(url)
                if sink is None:
                    raise ConfigurationError(f"cannot open the audit trail {url.split('?')[0]}") from None
                try:
                    return cls(sink.key_for(PURPOSE))
                finally:
                    sink.close()
            except ProctorError as exc:
                raise ConfigurationError(f"cannot read the answer key of the audit trail: {exc}") from None
        key_file = Path(os.fspath(url) + ".redact-key")
        try:
            if create:
                from proctor.audit.storage import read_or_create_secret

                key_file.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
                return cls.of_secret(read_or_create_secret(key_file))
            secret = key_file.read_bytes()
        except FileNotFoundError:
            raise ConfigurationError(
                f"no audit trail at {url} (no {key_file.name} beside it): answers are sealed with the key of the "
                "run's trail; give --audit the trail the run writes, or --answer-key FILE (`proctor approvals "
                "answer-key --audit RUN_TRAIL --out FILE` on its host)") from None
        except OSError as exc:
            raise ConfigurationError(f"cannot read {key_file}: {exc.strerror or exc} (answers are sealed with the "
                                     "key of the run's trail; or give --answer-key FILE)") from None
        return cls.of_secret(secret)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> AnswerSeal:
        """An answer key file (`write`: 64 hex digits); `ConfigurationError` naming what is wrong."""
        try:
            text = Path(path).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigurationError(f"cannot read the answer key file {os.fspath(path)}: {exc}") from None
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = b""
        if len(key) != 32:
            raise ConfigurationError(f"{os.fspath(path)} is not an answer key (64 hex digits, as `proctor approvals "
                                     "answer-key` writes)")
        return cls(key)

    @classmethod
    def for_answerer(cls, answer_key: str | None, audit: str, *, create: bool = False) -> AnswerSeal:
        """What an answerer seals with: `answer_key` (or ``$PROCTOR_ANSWER_KEY``), a key file, when given;
        else the key of the audit trail `audit` (`of_trail`)."""
        path = answer_key or os.environ.get(ENV, "")
        return cls.from_file(path) if path else cls.of_trail(audit, create=create)

    def write(self, path: str | os.PathLike[str]) -> None:
        """Write this key as an answer key file (64 hex digits and a newline), readable by its owner only, for
        an answerer that should hold this key and not the trail's secret; refuses to replace a file."""
        target = Path(path)
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            raise ConfigurationError(f"{target} exists already: remove it first to write a new answer key") from None
        except OSError as exc:
            raise ConfigurationError(f"cannot write {target}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "w", encoding="ascii") as out:
            out.write(self._key.hex() + "\n")

    # -- sealing and checking ---------------------------------------------------------------------

    def _mac(self, approval: PendingApproval, answer: ApprovalAnswer) -> str:
        body = canonical_bytes({
            "kind": "approval-answer",
            "approval": {"id": approval.id, "run_id": approval.run_id, "call_id": approval.call_id,
                         "binding": approval.binding, "expires_at_ns": approval.expires_at_ns,
                         # what the answerer was shown of the call: the gate compares it with the call itself
                         "tool": approval.tool, "args": json_shaped(approval.args),
                         "shown_args": json_shaped(approval.shown_args)},
            "answer": {"verdict": answer.verdict, "approver": answer.approver, "method": answer.method,
                       "groups": json_shaped(answer.groups), "os_user": answer.os_user, "address": answer.address,
                       "args": json_shaped(answer.args), "grant": json_shaped(answer.grant), "reason": answer.reason,
                       "answered_at_ns": answer.answered_at_ns},
        })
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()

    def seal(self, approval: PendingApproval, answer: ApprovalAnswer) -> str:
        """The seal of `answer` to `approval`: ``v1:KEY_ID:HMAC``."""
        return f"{_VERSION}:{self.key_id}:{self._mac(approval, answer)}"

    def sealed(self, approval: PendingApproval, answer: ApprovalAnswer) -> ApprovalAnswer:
        """`answer` with its seal (and the time it was given, when it says none: the store would stamp it, after
        the seal)."""
        import time
        from dataclasses import replace

        stamped = replace(answer, seal="", answered_at_ns=answer.answered_at_ns or time.time_ns())
        return replace(stamped, seal=self.seal(approval, stamped))

    def problem(self, approval: PendingApproval) -> str | None:
        """Why the answer `approval` holds is not believed, in one line naming the approval; None when its
        seal holds (or it holds no answer)."""
        answer = approval.answer
        if answer is None:
            return None
        what = f"approval {approval.id} ({approval.tool} of run {approval.run_id}): the answer " \
               f"{answer.verdict!s:.20} by {answer.approver!s:.80}"
        seal = answer.seal if isinstance(answer.seal, str) else ""
        if not seal:
            return (f"{what} carries no seal: it was not given through the inbox or `proctor approvals` (written "
                    "into the store by hand?); refused, the approval waits for a real answer")
        version, _, rest = seal.partition(":")
        key_id, _, mac = rest.partition(":")
        if version != _VERSION or not key_id or not mac or not seal.isascii():
            return f"{what} carries a malformed seal; refused, the approval waits for a real answer"
        if not hmac.compare_digest(key_id.encode(), self.key_id.encode()):
            return (f"{what} was sealed with answer key {key_id:.16}, not this run's ({self.key_id}): answer "
                    "through an inbox or CLI given the run's audit trail (--audit) or its answer key; refused, "
                    "the approval waits for a real answer")
        try:
            expected = self._mac(approval, answer)
        except (TypeError, ValueError, RecursionError):  # a value no answerer writes (not JSON data)
            expected = ""
        if not hmac.compare_digest(mac.encode(), expected.encode()):
            return (f"{what}: its seal does not hold (the answer, or the arguments the approval showed its "
                    "answerer, were written or changed outside the inbox and `proctor approvals`, or it was copied "
                    "from another approval); refused, the approval waits for a real answer")
        return None


class AnswerCheck:
    """What a gate hands its inbox for one request: the seal answers must carry (None: the gate has no
    audit trail to derive it from, and believes no answer), and where a refused one is recorded."""

    def __init__(self, seal: AnswerSeal | None, refusals: RefusalSink | None) -> None:
        self.seal = seal
        self.refusals = refusals

    def problem(self, approval: PendingApproval) -> str | None:
        """Why the answer `approval` holds is not believed (None: it is)."""
        if approval.answer is None:
            return None
        if self.seal is None:
            return (f"approval {approval.id}: cannot check who answered it: the gate has no audit trail whose key "
                    "proves answers (give the gate or agent audit=...)")
        return self.seal.problem(approval)

    def refuse(self, approval: PendingApproval, problem: str) -> str:
        """Record the refusal of `approval`'s answer (``approval_refused``, code ``seal``); "" when recorded,
        else why not (as `write_refusal` says it)."""
        answer = approval.answer
        assert answer is not None
        groups = tuple(str(g) for g in answer.groups) if isinstance(answer.groups, list) else None
        return write_refusal(self.refusals, refusal_fields(
            approval, approval.id, code="seal", reason=problem, approver=str(answer.approver),
            method=str(answer.method or "unknown"), address=str(answer.address), os_user=str(answer.os_user),
            decision=str(answer.verdict), binding=approval.binding, words=str(answer.reason), groups=groups))


