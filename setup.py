"""The optional C extensions (everything else is in pyproject.toml). Each is optional: without a C compiler
or Python's headers the build goes on and each has a pure-Python fallback with the same behaviour.

- `proctor.audit._syncer` is the native half of the audit log's group commit: an fdatasync loop that
  runs without the GIL (proctor/audit/_syncer.c); without it AuditLog uses its pure-Python group commit,
  with the same guarantees.
- `proctor._provtok` tokenises tool results and computes their keyed digests for the provenance index
  (proctor/provenance.py): indexing a 100 KB result in <= 2 ms (issue #19) needs the per-token work out
  of the interpreter. Without it the index uses its pure-Python tokeniser (the same tokens, slower). A plain
  C file beat the alternatives: mypyc still pays a Python object per token and per regex pass, and no
  maintained library tokenises the way the index does.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("proctor.audit._syncer", ["proctor/audit/_syncer.c"], optional=True),
    Extension("proctor._provtok", ["proctor/_provtok.c"], optional=True),
])
