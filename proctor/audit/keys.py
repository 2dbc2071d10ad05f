"""Ed25519 keys for checkpoints: loading in every form we accept, key ids, key generation.

A signing key may be an `Ed25519PrivateKey`, 32 raw bytes, PEM bytes, or a path to a
file holding either (what `proctor audit keygen` writes). A public key for
verification may be the same forms, a 64-character hex string, or the private key
(its public half is used).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from proctor.errors import AuditError

__all__ = [
    "KeySource",
    "PublicKeySource",
    "generate_keypair",
    "key_id",
    "load_private_key",
    "load_public_key",
    "public_raw",
    "verify_signature",
]

KeySource = Union[Ed25519PrivateKey, bytes, str, "os.PathLike[str]"]
PublicKeySource = Union[Ed25519PublicKey, Ed25519PrivateKey, bytes, str, "os.PathLike[str]"]


def public_raw(key: Ed25519PublicKey) -> bytes:
    """The 32 raw bytes of a public key."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """A short stable name for a key: ``ed25519:`` and the first 16 hex digits of sha256(raw public key)."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return "ed25519:" + hashlib.sha256(public_raw(pub)).hexdigest()[:16]


def _read(source: str | os.PathLike[str]) -> bytes:
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise AuditError(f"cannot read key file {os.fspath(source)}: {exc.strerror or exc}") from exc


def load_private_key(source: KeySource) -> Ed25519PrivateKey:
    """An Ed25519 private key from an object, raw or PEM bytes, or a key file path."""
    if isinstance(source, Ed25519PrivateKey):
        return source
    data = source if isinstance(source, bytes) else _read(source)
    try:
        if data.lstrip().startswith(b"-----BEGIN"):
            key = serialization.load_pem_private_key(data, password=None)
            if not isinstance(key, Ed25519PrivateKey):
                raise AuditError(f"signing key is a {type(key).__name__}, not an Ed25519 key")
            return key
        if len(data) == 32:
            return Ed25519PrivateKey.from_private_bytes(data)
    except (ValueError, TypeError) as exc:
        raise AuditError(f"signing key is not a usable Ed25519 private key: {exc}") from exc
    raise AuditError("signing key must be an Ed25519 PEM key or 32 raw bytes")


def load_public_key(source: PublicKeySource) -> Ed25519PublicKey:
    """An Ed25519 public key from an object, raw/PEM bytes, a 64-hex-digit string or a key file path."""
    if isinstance(source, Ed25519PublicKey):
        return source
    if isinstance(source, Ed25519PrivateKey):
        return source.public_key()
    if isinstance(source, str) and len(source) == 64 and not Path(source).exists():
        try:
            return Ed25519PublicKey.from_public_bytes(bytes.fromhex(source))
        except ValueError as exc:
            raise AuditError(f"public key {source!r} is neither a file nor 64 hex digits") from exc
    data = source if isinstance(source, bytes) else _read(source)
    try:
        stripped = data.strip()
        if stripped.startswith(b"-----BEGIN") and b"PRIVATE" in stripped.split(b"\n", 1)[0]:
            return load_private_key(data).public_key()
        if stripped.startswith(b"-----BEGIN"):
            key = serialization.load_pem_public_key(data)
            if not isinstance(key, Ed25519PublicKey):
                raise AuditError(f"public key is a {type(key).__name__}, not an Ed25519 key")
            return key
        if len(data) == 32:
            return Ed25519PublicKey.from_public_bytes(data)
        if len(stripped) == 64:
            return Ed25519PublicKey.from_public_bytes(bytes.fromhex(stripped.decode("ascii")))
    except (ValueError, TypeError, UnicodeDecodeError) as exc:
        raise AuditError(f"not a usable Ed25519 public key: {exc}") from exc
    raise AuditError("public key must be an Ed25519 PEM key, 32 raw bytes or 64 hex digits")


def verify_signature(key: Ed25519PublicKey, signature: bytes, message: bytes) -> bool:
    """True when `signature` is `key`'s Ed25519 signature of `message`."""
    try:
        key.verify(signature, message)
    except InvalidSignature:
        return False
    return True


def generate_keypair(out: str | os.PathLike[str], *, force: bool = False) -> tuple[Path, Path, str]:
    """Write a new private key to `out` (PEM, mode 0600) and its public key to `out.pub`; return paths and key id."""
    priv_path = Path(out)
    pub_path = Path(os.fspath(out) + ".pub")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    pub_pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    if not force:
        for path in (priv_path, pub_path):
            if path.exists():
                raise AuditError(f"{path} exists; pass --force to overwrite it")
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    for path, data, mode in ((priv_path, pem, 0o600), (pub_path, pub_pem, 0o644)):
        try:
            fd = os.open(path, flags, mode)
        except FileExistsError as exc:
            raise AuditError(f"{path} exists; pass --force to overwrite it") from exc
        except OSError as exc:
            raise AuditError(f"cannot write {path}: {exc.strerror or exc}") from exc
        try:
            os.fchmod(fd, mode)  # O_CREAT's mode is masked by umask; a private key must be 0600 regardless
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    return priv_path, pub_path, key_id(key)
