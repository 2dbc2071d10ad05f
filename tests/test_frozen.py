"""`quick_init`: same signature, same frozenness, same values; refused where it cannot be exact."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from proctor._frozen import quick_init
from proctor.calls import CallRecord, Decision, HistoryEntry
from proctor.gate import CallOutcome
from proctor.redaction import Redacted


@dataclasses.dataclass(frozen=True, slots=True)
class Plain:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()


@quick_init
@dataclasses.dataclass(frozen=True, slots=True)
class Quick:
    a: int
    b: str = "x"
    c: tuple[int, ...] = ()


def test_same_signature_values_and_frozenness_as_the_generated_init() -> None:
    """A quick_init class takes the same arguments, holds the same values and stays frozen."""
    assert [(p.name, p.default, p.kind) for p in inspect.signature(Quick).parameters.values()] == [
        (p.name, p.default, p.kind) for p in inspect.signature(Plain).parameters.values()]
    for args, kwargs in [((1,), {}), ((1, "y"), {}), ((), {"a": 2, "c": (3,)}), ((1,), {"b": "z"})]:
        q, p = Quick(*args, **kwargs), Plain(*args, **kwargs)
        assert dataclasses.astuple(q) == dataclasses.astuple(p)
        assert repr(q).replace("Quick", "Plain") == repr(p)
    assert Quick(1) == Quick(1) and hash(Quick(1)) == hash(Quick(1)) and Quick(1) != Quick(2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        Quick(1).a = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Quick(1, d=4)  # type: ignore[call-arg]


@pytest.mark.parametrize("cls", [Decision, HistoryEntry, CallRecord, CallOutcome, Redacted])
def test_the_records_keep_their_fields_as_parameters(cls: type) -> None:
    """Each record class the gate builds per call has exactly its fields, in order, as parameters."""
    params = inspect.signature(cls).parameters
    fields = dataclasses.fields(cls)
    assert list(params) == [f.name for f in fields]
    assert [p.default for p in params.values()] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default for f in fields]
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"


def test_refuses_what_it_cannot_reproduce() -> None:
    """Mutable, slot-less, factory-defaulted, keyword-only or post-init dataclasses are refused."""
    with pytest.raises(TypeError):
        quick_init(dataclasses.dataclass(slots=True)(type("M", (), {"__annotations__": {"a": int}})))
    with pytest.raises(TypeError):
        quick_init(dataclasses.dataclass(frozen=True)(type("N", (), {"__annotations__": {"a": int}})))

    @dataclasses.dataclass(frozen=True, slots=True)
    class Factory:
        a: list[int] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class KwOnly:
        a: int

    @dataclasses.dataclass(frozen=True, slots=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    for cls in (Factory, KwOnly, Post):
        with pytest.raises(TypeError):
            quick_init(cls)


@pytest.mark.parametrize("native", [True, False])
def test_builders_make_what_the_class_makes(native: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A builder's instance equals the class's, stays frozen, and wrong calls fail as the class's do."""
    import proctor._frozen as frozen

    if not native:
        monkeypatch.setattr(frozen, "_maker", None)
    elif frozen._maker is None:
        pytest.fail("proctor._newobj is not built: reinstall proctor (pip install -e .) with a C compiler")
    build = frozen.builder(Quick)
    for args in [(1,), (1, "y"), (1, "y", (2,))]:
        made, called = build(*args), Quick(*args)
        assert type(made) is Quick and made == called and hash(made) == hash(called) and repr(made) == repr(called)
    assert build(1, c=(3,)) == Quick(1, c=(3,))  # keywords: the class itself
    with pytest.raises(dataclasses.FrozenInstanceError):
        build(1).a = 2  # type: ignore[misc]
    for bad in [(), (1, "y", (), 4)]:
        with pytest.raises(TypeError):
            build(*bad)
    with pytest.raises(TypeError):
        frozen.builder(Plain)  # its __init__ may do more than store: not skipped
    for cls in (Decision, HistoryEntry, CallRecord, CallOutcome, Redacted):
        fields = dataclasses.fields(cls)
        values = [f"v{i}" for i, _ in enumerate(fields)]
        assert frozen.builder(cls)(*values) == cls(*values)


class Slotted:
    __slots__ = ("a", "b")


class Sub(Slotted):
    __slots__ = ("c",)


@pytest.mark.parametrize("native", [True, False])
def test_slot_builders_set_the_named_slots_and_leave_the_others_unset(native: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot builder sets the named slots (a base class's too), takes trailing defaults, leaves the rest unset."""
    import proctor._frozen as frozen

    if not native:
        monkeypatch.setattr(frozen, "_maker", None)
    elif frozen._maker is None:
        pytest.fail("proctor._newobj is not built: reinstall proctor (pip install -e .) with a C compiler")
    build = frozen.slot_builder(Sub, ("c", "a"), ("dflt",))
    one = build(1)
    assert type(one) is Sub and (one.c, one.a) == (1, "dflt")
    with pytest.raises(AttributeError):
        one.b  # noqa: B018 - unset slot
    assert build(1, 2).a == 2


def test_the_native_maker_refuses_what_it_cannot_build_exactly() -> None:
    """Not a slot, a read-only member, a class with its own __new__, or a slot named twice: refused."""
    import proctor._frozen as frozen

    if frozen._maker is None:
        pytest.fail("proctor._newobj is not built: reinstall proctor (pip install -e .) with a C compiler")
    import proctor._newobj as newobj

    class WithNew:
        __slots__ = ("a",)

        def __new__(cls) -> WithNew:
            return super().__new__(cls)

    for cls, names in [(Slotted, ("zz",)), (Slotted, ("__class__",)), (WithNew, ("a",)), (Slotted, ("a", "a")),
                       (int, ("real",))]:
        with pytest.raises((TypeError, ValueError)):
            newobj.maker(cls, names, ())
