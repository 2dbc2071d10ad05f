"""RFC 6962 Merkle hashing: known answers from the Certificate Transparency test vectors, and the frontier."""

from __future__ import annotations

import hashlib

import pytest

from proctor.audit.merkle import EMPTY_ROOT, MerkleFrontier, leaf_hash, merkle_root, node_hash

# The eight leaves and the tree heads for sizes 1..8 published with the Certificate
# Transparency / transparency-dev merkle test data (RFC 6962 hashing).
CT_LEAVES = ["", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f"]
CT_ROOTS = [
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]


def test_empty_tree_root_is_sha256_of_nothing() -> None:
    """The empty tree's root is sha256 of the empty string."""
    assert EMPTY_ROOT == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    assert MerkleFrontier().root_hex() == EMPTY_ROOT
    assert merkle_root([]).hex() == EMPTY_ROOT


@pytest.mark.parametrize("size", range(1, 9))
def test_ct_known_answers(size: int) -> None:
    """Both the incremental frontier and the recursive reference give the published root for each size."""
    leaves = [leaf_hash(bytes.fromhex(x)) for x in CT_LEAVES[:size]]
    frontier = MerkleFrontier()
    for leaf in leaves:
        frontier.append(leaf)
    assert frontier.root_hex() == CT_ROOTS[size - 1]
    assert merkle_root(leaves).hex() == CT_ROOTS[size - 1]
    assert frontier.size == size


def test_frontier_matches_the_reference_for_every_size_up_to_70() -> None:
    """Appending one leaf at a time gives the RFC 6962 root at every size, including non-powers of two."""
    leaves = [hashlib.sha256(bytes([i])).digest() for i in range(70)]
    frontier = MerkleFrontier()
    for n, leaf in enumerate(leaves, start=1):
        frontier.append_hex(leaf.hex())
        assert frontier.root() == merkle_root(leaves[:n]), n


def test_interior_nodes_are_prefixed_with_one() -> None:
    """Interior nodes hash 0x01 ‖ left ‖ right, so a leaf can never pass for a node."""
    a, b = leaf_hash(b""), leaf_hash(b"\x00")
    assert node_hash(a, b) == hashlib.sha256(b"\x01" + a + b).digest()
    assert node_hash(a, b).hex() == CT_ROOTS[1]
