"""The optional C extensions (everything else is in pyproject.toml). Each is optional: without a C compiler
or Python's headers the build goes on and each has a pure-Python fallback with the same behaviour.

- `proctor._provtok` tokenises tool results and computes their keyed digests for the provenance index
  (proctor/provenance.py): indexing a 100 KB result in <= 2 ms (issue #19) needs the per-token work out
  of the interpreter. Without it the index uses its pure-Python tokeniser (the same tokens, slower). A plain
  C file beat the alternatives: mypyc still pays a Python object per token and per regex pass, and no
  maintained library tokenises the way the index does.
- `proctor._pipeio` reads and writes the host's end of a worker's channel (non-blocking pipes) without
  releasing the GIL: with several Interpreters in threads of one process, every release around a call that
  cannot wait hands the GIL to another thread and costs two context switches (bench/concurrency.py: 8 runs
  in threads). Without it the host uses os.read / os.write (the same bytes, more switches).
"""

from setuptools import Extension, setup

setup(ext_modules=[
    Extension("proctor._provtok", ["proctor/_provtok.c"], optional=True),
    Extension("proctor._pipeio", ["proctor/_pipeio.c"], optional=True),
])
