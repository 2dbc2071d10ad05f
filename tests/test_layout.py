"""The import graph of proctor/: no module imports itself back through others, and no layer imports one above it.

Both hold for what runs: imports at module level and imports inside functions (deferred, for a heavy or optional
dependency), taken together — a deferred import that closes a loop is a cycle all the same, only later. Imports
under `if TYPE_CHECKING:` never run and are not counted."""

from __future__ import annotations

import ast

from proctor_modules import cycles, import_graph, module_names, parsed

#: Bottom to top. A module belongs to the layer of its package (proctor.X.* to "X", a top-level module to its
#: own name). Every command-line module is in `proctor.cli`, the top layer alone: it may import any part,
#: and nothing below it imports it.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    # foundations: the error tree, plain data, text and encoding helpers nothing else of proctor's is under
    "errors _lazy _provtok _pipeio backends calls canonical durations termsafe textcaps unicodenorm urls links "
    "jsoninput importpath interrupts pgconn redaction narrowing images signatures provenance",
    "telemetry tools adapters",       # spans and logs; what a tool is
    "ledger",                         # budget pools (memory, Redis)
    "audit",                          # the audit trail: records written down and read back, knowing no policy
    "policy",                         # the pure decision: schema, loader, conditions, budgets, admit(), replay
    "store halt",                     # what runs keep: the run store (durable runs, approvals), halts
    "approval",                       # who answers, and how (console, webhook, callback, inbox)
    "interpreter",                    # the sandboxed worker and its channel
    "gate",                           # the call's whole life (proctor.gate.run: the run context)
    "agent",                          # the model loop
    "integrations codemode serve testing proctor",  # what users start or import: adapters, servers
    "cli",                            # the `proctor` command: parses, calls the parts below, prints
))

def layer_of(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "proctor"
    for i, layer in enumerate(LAYERS):
        if key in layer:
            return i
    raise AssertionError(f"{module} is in no layer: add {key!r} to LAYERS in tests/test_layout.py")


def test_every_module_has_a_layer() -> None:
    """A new package or top-level module is placed in a layer on purpose, not by default."""
    for module in module_names():
        layer_of(module)


def _runs() -> dict[str, frozenset[str]]:
    """For each module, the proctor modules it imports when it is imported or when one of its functions runs."""
    module_level, deferred, _ = import_graph()
    return {m: module_level.get(m, frozenset()) | deferred.get(m, frozenset()) for m in {*module_level, *deferred}}


def test_no_import_cycles() -> None:
    """Importing any module, or calling any of its functions, never comes back to it through the modules it
    imports (no exceptions: a loop is resolved by moving code to its users, a Protocol below, or a parameter)."""
    assert cycles(_runs()) == []


def test_no_layer_imports_one_above_it() -> None:
    upward = sorted(f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
                    for a, targets in _runs().items() for b in targets if layer_of(b) > layer_of(a))
    assert upward == []


def test_command_line_modules_live_in_the_cli_package_alone() -> None:
    """The command line is one package on top: no part keeps a `cli` module of its own, and no module outside
    `proctor.cli` imports one inside it (a function a part or the inbox needs lives in that part)."""
    assert [m for m in module_names() if m.rsplit(".", 1)[-1].endswith("cli") and m != "proctor.cli"] == []
    assert layer_of("proctor.cli") == layer_of("proctor.cli.policy") == len(LAYERS) - 1
    assert LAYERS[-1] == frozenset({"cli"})
    reaching = sorted(f"{a} imports {b}" for a, targets in _runs().items() if not _in_cli(a)
                      for b in targets if _in_cli(b))
    assert reaching == []


def _in_cli(module: str) -> bool:
    return module == "proctor.cli" or module.startswith("proctor.cli.")


def test_the_checks_see_deferred_imports() -> None:
    """The graph holds imports inside functions (a check that saw only module level would pass on any loop)."""
    _, deferred, _ = import_graph()
    assert "proctor.integrations.smolagents" in deferred.get("proctor.integrations.mcp", frozenset())
    assert cycles({"a": frozenset({"b"}), "b": frozenset({"a"})}) == [["a", "b"]]


#: The sandboxed worker's own code runs untrusted programs and reads whatever they hand it: it probes, and is
#: held to that apart (tests/interpreter).
_WORKER = frozenset({"proctor.interpreter.worker", "proctor.interpreter.worker_io"})


def _names_any(annotation: ast.expr) -> bool:
    return any((isinstance(n, ast.Name) and n.id == "Any") or (isinstance(n, ast.Attribute) and n.attr == "Any")
               for n in ast.walk(annotation))


def _is_protocol(cls: ast.ClassDef) -> bool:
    return any(isinstance(n, (ast.Name, ast.Attribute)) and (n.id if isinstance(n, ast.Name) else n.attr) == "Protocol"
               for base in cls.bases for n in ast.walk(base))


def _any_in_protocols(tree: ast.Module, module: str) -> list[str]:
    found = []
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and _is_protocol(n)):
        for member in cls.body:
            if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = member.args
                annotated = [(a.arg, a.annotation) for a in (*args.posonlyargs, *args.args, *args.kwonlyargs,
                                                               *filter(None, (args.vararg, args.kwarg)))]
                annotated.append(("return", member.returns))
                found += [f"{module}: {cls.name}.{member.name} ({name})" for name, ann in annotated
                          if ann is not None and _names_any(ann)]
            elif isinstance(member, ast.AnnAssign) and _names_any(member.annotation):
                found.append(f"{module}: {cls.name}.{ast.unparse(member.target)}")
    return found


def test_no_protocol_takes_or_gives_any() -> None:
    """A seam says what crosses it: no Protocol of proctor's has a parameter, return or attribute typed `Any`
    (mypy strict would check nothing there). A value that is arbitrary by nature is `proctor.calls.JSONValue`."""
    found = [hit for module in module_names() if module not in _WORKER
             for tree in [parsed(module)] if tree is not None for hit in _any_in_protocols(tree, module)]
    assert found == []


def test_the_protocol_check_sees_any() -> None:
    source = ("class P(Protocol):\n    x: dict[str, Any]\n    def f(self, a: int, *, b: typing.Any) -> None: ...\n"
              "    def g(self) -> Callable[..., Any]: ...\n    def h(self, v: JSONValue) -> int: ...\n")
    assert _any_in_protocols(ast.parse(source), "m") == ["m: P.x", "m: P.f (b)", "m: P.g (return)"]
