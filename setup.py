"""Only the one C extension lives here (everything else is in pyproject.toml).

`proctor.audit._syncer` is the native half of the audit log's group commit: an fdatasync loop that
runs without the GIL (proctor/audit/_syncer.c). It is optional: without a C compiler or Python's
headers the build goes on and AuditLog uses its pure-Python group commit, with the same guarantees.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("proctor.audit._syncer", ["proctor/audit/_syncer.c"], optional=True)])
