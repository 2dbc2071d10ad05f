"""Authorized data libraries work: their C code's own lazy imports pass, the program's imports stay checked.

numpy's C code imports ``numpy._core._methods`` the first time ``ndarray.sum`` runs, through the
builtins of the Python frame on top (the program's), so it meets the program's import guard; so
does ``time.strptime`` loading ``_strptime``. Those are the package's imports, not the program's.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from interpreter.conftest import ISOLATIONS

from proctor.interpreter import Interpreter
from proctor.interpreter.guard import ImportPolicy

NUMPY = """
import numpy as np
a = np.arange(5)
print(a.sum(), a.mean(), a.std() > 1, np.cumsum(a)[-1], (a * 2.5).max())
"""

PANDAS = """
import pandas as pd
df = pd.DataFrame({"team": ["a", "b", "a", "c"], "points": [3, 4, 5, 10]})
g = df.groupby("team")["points"]
print(df["points"].sum(), df["points"].mean(), g.mean().to_dict(), g.sum()["a"])
print(pd.to_datetime(["2024-01-02"]).year[0], df.describe().loc["max", "points"])
"""

PILLOW = """
from PIL import Image, ImageStat
im = Image.new("L", (4, 2), 7)
im.putpixel((0, 0), 15)
stat = ImageStat.Stat(im)
print(stat.sum[0], stat.mean[0], im.resize((2, 1)).size)
"""


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_numpy_reductions_run_with_numpy_authorized(make: Callable[..., Interpreter], sandbox: str) -> None:
    """`np.arange(5).sum()` works: the lazy import numpy's C code makes is numpy's own."""
    py = make(sandbox=sandbox, authorized_imports=["numpy"])
    r = py.run(NUMPY)
    assert r.error is None, r.error
    assert r.logs == "10 2.0 True 10 10.0\n"


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_pandas_groupby_runs_with_pandas_authorized(make: Callable[..., Interpreter], sandbox: str) -> None:
    """sum, mean and groupby over a DataFrame, with only pandas authorized."""
    py = make(sandbox=sandbox, authorized_imports=["pandas"])
    r = py.run(PANDAS)
    assert r.error is None, r.error
    assert r.logs == "22 5.5 {'a': 4.0, 'b': 4.0, 'c': 10.0} 8\n2024 10.0\n"


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_pillow_statistics_run_with_pil_authorized(make: Callable[..., Interpreter], sandbox: str) -> None:
    """A third C-extension package (Pillow's _imaging) computing sums and means."""
    py = make(sandbox=sandbox, authorized_imports=["PIL.*"])
    r = py.run(PILLOW)
    assert r.error is None, r.error
    assert r.logs == "64 8.0 (2, 1)\n"


@pytest.mark.parametrize("sandbox", ISOLATIONS)
def test_the_standard_librarys_lazy_helpers_load(make: Callable[..., Interpreter], sandbox: str) -> None:
    """`time.strptime` and `datetime.strptime` load `_strptime` from C: allowed with time and datetime."""
    py = make(sandbox=sandbox)
    r = py.run("import time, datetime\nprint(time.strptime('2020', '%Y').tm_year, "
               "datetime.datetime.strptime('2021-03', '%Y-%m').month)")
    assert r.error is None, r.error
    assert r.logs == "2020 3\n"


@pytest.mark.parametrize("program, module", [
    ("import os", "os"),
    ("import numpy._core._methods", "numpy._core._methods"),  # numpy is authorized, its submodules are not
    ("from numpy import _core", None),
    ("import _strptime", "_strptime"),  # a helper C code may load is not the program's to import
    ("def f():\n    import subprocess\nf()", "subprocess"),
    ("x = [__import__ for _ in ()]", None),
])
def test_the_programs_own_imports_stay_checked(make: Callable[..., Interpreter], program: str,
                                               module: str | None) -> None:
    """What the program imports itself is checked as before, in functions too, with numpy authorized."""
    py = make(sandbox="process", authorized_imports=["numpy"])
    py.run("import numpy as np\nnp.arange(3).sum()")  # numpy's lazy modules are loaded: still not the program's
    r = py.run(program)
    assert r.error is not None
    if module is not None:
        assert f"Import of {module!r} is not allowed" in str(r.error)


def test_c_code_cannot_be_used_to_import_what_is_not_authorized() -> None:
    """An import reaching the guard from C code (here `map` over the guarded `__import__`, were a program
    to get hold of it: it cannot name it) passes only for modules of an authorized package."""
    policy = ImportPolicy(["numpy"])
    assert policy.allows_internal("numpy._core._methods")
    assert policy.allows_internal("_strptime")
    assert not policy.allows_internal("os")
    assert not policy.allows_internal("subprocess")
    assert not policy.allows_internal("numpyx")
    guarded = policy.make_import(__import__)
    with pytest.raises(ImportError, match="Import of 'os' is not allowed"):
        list(map(guarded, ["os"]))  # from C (map), not an import statement: still only authorized packages
    (view,) = map(guarded, ["numpy._core._methods"])  # allowed, and what comes back is the filtered view
    assert view.__name__ == "numpy._core._methods" and not hasattr(view, "_sum")
