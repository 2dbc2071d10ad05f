"""`proctor.slots.maker` builds the very instance the dataclass's own `__init__` would, still frozen."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pytest

from proctor.calls import Call, Decision, RunInfo
from proctor.policy.admission import Admission
from proctor.policy.budgets import Reservation
from proctor.slots import maker


@pytest.mark.parametrize(("cls", "values"), [
    (Decision, ("allow", ("reads",), "allowed by rule 'reads'", "f00d")),
    (Reservation, (7, "lookup", "read", 1.5, ("calls",), 2, (("calls", 60),), None)),
    (Call, ("lookup", {"order": "1"}, "read", 0, (), RunInfo(id="run_1"), {}, ("mail",), None)),
    (Admission, ("decided", "lookup", None, None, (), {"order": "1"}, "read", None, (), 0.0, None)),
])
def test_maker_builds_what_the_dataclass_builds(cls: type, values: tuple[object, ...]) -> None:
    names = [f.name for f in dataclasses.fields(cls)]
    made, built = maker(cls)(*values), cls(**dict(zip(names, values, strict=True)))  # (Admission: keywords only)
    assert made == built and type(made) is cls
    assert [getattr(made, name) for name in names] == list(values)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.__setattr__(names[0], None)
    if cls is not Call and cls is not Admission:  # (those hold a dict: unhashable, as the dataclass's are)
        assert hash(made) == hash(built)


def test_maker_refuses_what_it_cannot_build_alike() -> None:
    @dataclass(frozen=True)
    class Unslotted:
        a: int

    @dataclass(frozen=True, slots=True)
    class Checked:
        a: int

        def __post_init__(self) -> None:
            if self.a < 0:
                raise ValueError("negative")

    for cls in (Unslotted, Checked):
        with pytest.raises(TypeError, match="slotted dataclass without __post_init__"):
            maker(cls)
    with pytest.raises(TypeError):
        maker(Decision)("allow", (), "too few")  # every field, positionally
