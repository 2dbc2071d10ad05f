"""The optional C extensions (everything else is in pyproject.toml). Each is optional: without a C compiler
or Python's headers the build goes on and each has a pure-Python fallback with the same behaviour.

- `proctor._provtok` tokenises tool results and computes their keyed digests for the provenance index
  (proctor/provenance.py): indexing a 100 KB result in <= 2 ms (issue #19) needs the per-token work out
  of the interpreter. Without it the index uses its pure-Python tokeniser (the same tokens, slower). A plain
  C file beat the alternatives: mypyc still pays a Python object per token and per regex pass, and no
  maintained library tokenises the way the index does.
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("proctor._provtok", ["proctor/_provtok.c"], optional=True),
])
