"""RFC 6962 Merkle tree hashing, kept incrementally as a frontier of complete subtrees.

Leaves are already-hashed: an audit record's `h` *is* its RFC 6962 leaf hash
(``sha256(0x00 ‖ canonical record without h)``). Interior nodes are
``sha256(0x01 ‖ left ‖ right)`` and the tree over ``n`` leaves splits at the largest
power of two below ``n``. Keeping one hash per complete subtree (at most log2 n of
them, like the bits of a binary counter) makes appending O(1) amortised and the
root O(log n), so checkpoints stay cheap however long the log grows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = ["EMPTY_ROOT", "MerkleFrontier", "leaf_hash", "merkle_root", "node_hash"]

_sha256 = hashlib.sha256

#: Root of the empty tree: sha256 of the empty string (RFC 6962 §2.1).
EMPTY_ROOT = hashlib.sha256(b"").hexdigest()


def leaf_hash(data: bytes) -> bytes:
    """RFC 6962 leaf hash of raw entry bytes."""
    return hashlib.sha256(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash."""
    return hashlib.sha256(b"\x01" + left + right).digest()


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    """Reference (recursive) root over leaf hashes; used by tests and auditors' snippets."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return leaves[0]
    k = 1
    while k * 2 < n:
        k *= 2
    return node_hash(merkle_root(leaves[:k]), merkle_root(leaves[k:]))


class MerkleFrontier:
    """The complete subtrees of a growing tree, largest first: enough to append and to get the root.

    Subtree *i* from the right has 2**k leaves where k is the i-th set bit of `size`
    counted from the low end, so the heights need not be stored.
    """

    __slots__ = ("_nodes", "size")

    def __init__(self) -> None:
        self._nodes: list[bytes] = []
        self.size = 0

    @classmethod
    def restored(cls, nodes: Sequence[bytes], size: int) -> MerkleFrontier:
        """A frontier saved earlier as its `nodes` and `size` (a PostgreSQL log keeps it in its head row)."""
        frontier = cls()
        frontier._nodes = list(nodes)
        frontier.size = size
        return frontier

    @property
    def nodes(self) -> tuple[bytes, ...]:
        """The complete subtrees' roots, largest first: what `restored` takes back."""
        return tuple(self._nodes)

    def append(self, leaf: bytes) -> None:
        """Add one leaf hash (32 bytes) at the right edge."""
        nodes, n, node = self._nodes, self.size, leaf
        # Merge equal-size neighbours, exactly as a carry ripples through a binary counter.
        while n & 1:
            node = _sha256(b"\x01" + nodes.pop() + node).digest()
            n >>= 1
        nodes.append(node)
        self.size += 1

    def extend(self, leaves: Sequence[bytes]) -> None:
        """`append` each of `leaves`, hashing aligned runs of leaves pairwise (fewer Python steps).

        Same tree, same frontier: a run of 2**k leaves that starts where the frontier's size
        is a multiple of 2**k is a complete subtree, so its root is computed level by level
        and then merged like one appended node of height k.
        """
        nodes, size, i, total = self._nodes, self.size, 0, len(leaves)
        while i < total:
            # The largest complete subtree that can start here: bounded by the alignment of size
            # and by the leaves left.
            k = (total - i).bit_length() - 1
            if size:
                k = min(k, (size & -size).bit_length() - 1)
            level = leaves[i : i + (1 << k)]
            while len(level) > 1:
                pairs = iter(level)
                level = [_sha256(b"\x01" + left + right).digest() for left, right in zip(pairs, pairs, strict=False)]
            node, n = level[0], size >> k
            while n & 1:
                node = _sha256(b"\x01" + nodes.pop() + node).digest()
                n >>= 1
            nodes.append(node)
            size += 1 << k
            i += 1 << k
        self.size = size

    def append_hex(self, leaf_hex: str) -> None:
        """Add one leaf hash given as hex (an audit record's `h`)."""
        self.append(bytes.fromhex(leaf_hex))

    def root(self) -> bytes:
        """The RFC 6962 root of the tree so far."""
        if not self._nodes:
            return hashlib.sha256(b"").digest()
        acc = self._nodes[-1]
        for node in reversed(self._nodes[:-1]):
            acc = _sha256(b"\x01" + node + acc).digest()
        return acc

    def root_hex(self) -> str:
        return self.root().hex()
