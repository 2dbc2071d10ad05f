"""The import graph of proctor/: no module imports itself back through others, and no layer imports one above it.

Only module-level imports count for both (what runs when a module is imported); imports inside functions
(deferred: heavy or optional dependencies, commands) and under `if TYPE_CHECKING:` are checked apart below."""

from __future__ import annotations

from proctor_modules import cycles, import_graph, module_names, reaches

#: Bottom to top. A module belongs to the layer of its package (proctor.X.* to "X", a top-level module to its
#: own name); the command-line modules (`cli`, `ops_cli`, wherever they sit) belong to the top layer.
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer.split()) for layer in (
    # foundations: the error tree, plain data, text and encoding helpers nothing else of proctor's is under
    "errors _lazy _provtok backends calls canonical durations termsafe textcaps unicodenorm urls links jsoninput "
    "importpath interrupts pgconn redaction narrowing images signatures provenance",
    "telemetry tools adapters",       # spans and logs; what a tool is
    "ledger",                         # budget pools (memory, Redis)
    "policy",                         # the pure decision: schema, loader, conditions, budgets, admit()
    "audit store halt",               # what is written down: the audit trail, the run store, halts
    "approval",                       # who answers, and how (console, webhook, callback, inbox)
    "interpreter",                    # the sandboxed worker and its channel
    "gate",                           # the call's whole life (proctor.gate.run: the run context)
    "agent",                          # the model loop
    "integrations codemode serve demo testing cli proctor",  # what users start: adapters, servers, commands
))

#: Imports deferred into a function that point back at a module already importing this one at module level.
#: Each stays deferred for the reason given; a new one is a cycle the layout should lose instead.
KNOWN_DEFERRED_BACK: dict[tuple[str, str], str] = {
    ("proctor.policy.aggregates", "proctor.policy.conditions"):
        "recognising a pipeline asks which functions conditions know, once per condition compiled",
    ("proctor.policy.dataflow", "proctor.policy.conditions"):
        "a tool's `sources:` conditions are compiled when first used; conditions imports dataflow to register "
        "field_provenance() & co.",
    ("proctor.policy.dataflow", "proctor.policy.lets"): "as above, for `let:` names in label conditions",
    ("proctor.policy.engine", "proctor.policy.explain"): "Policy.explain() is a facade over proctor.policy.explain",
    ("proctor.policy.validators", "proctor.policy.conditions"):
        "schema validators compile a `when:` while the file loads, to report its line and column",
    ("proctor.policy.validators", "proctor.policy.lets"): "as above, for `let:` expressions",
    ("proctor.tools", "proctor.adapters"):
        "as_tool() accepts smolagents tools through the adapters, loaded only when one is given",
}


def layer_of(module: str) -> int:
    parts = module.split(".")
    if parts[-1] in ("cli", "ops_cli"):
        return len(LAYERS) - 1
    key = parts[1] if len(parts) > 1 else "proctor"
    for i, layer in enumerate(LAYERS):
        if key in layer:
            return i
    raise AssertionError(f"{module} is in no layer: add {key!r} to LAYERS in tests/test_layout.py")


def test_every_module_has_a_layer() -> None:
    """A new package or top-level module is placed in a layer on purpose, not by default."""
    for module in module_names():
        layer_of(module)


def test_no_import_cycles_at_module_level() -> None:
    """Importing any module never comes back to it through the modules it imports."""
    module_level, _, _ = import_graph()
    assert cycles(module_level) == []


def test_no_layer_imports_one_above_it_at_module_level() -> None:
    module_level, _, _ = import_graph()
    upward = sorted(f"{a} (layer {layer_of(a)}) imports {b} (layer {layer_of(b)})"
                    for a, targets in module_level.items() for b in targets if layer_of(b) > layer_of(a))
    assert upward == []


def test_deferred_imports_close_no_new_cycle() -> None:
    """An import inside a function that leads back to a module importing this one is a cycle in disguise:
    only the listed ones, each with its reason, are kept (one that is gone must leave the list too)."""
    module_level, deferred, _ = import_graph()
    back = {(a, b) for a, targets in deferred.items() for b in targets if reaches(module_level, b, a)}
    assert back == set(KNOWN_DEFERRED_BACK)
