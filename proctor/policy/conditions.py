"""`when` conditions: CEL compiled at load time, evaluated per call, failing closed.

CEL runs through the `cel` module of the `common-expression-language` package (a
Rust core). Compilation happens once per distinct source (cached); a condition only
sees the variables it references, so a rule about `args` never pays for converting
`history`.

Numbers: CEL compares ints and doubles freely (``args.amount > 100`` works for 150.5)
but does not mix them in arithmetic: ``args.amount * 2 > 100`` fails on a float
amount. Write ``100.0`` or ``double(args.amount)`` when a value may be either.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proctor.errors import ConditionError, EvaluationError, ValueTooDeep
from proctor.policy._cel import cel
from proctor.policy.activation import Activation
from proctor.policy.aggregates import (
    AggregateError,
    Rewrite,
    closing,
    is_hidden,
    rewrite,
    split_args,
    tokenize,
    unbox_source,
)
from proctor.policy.functions import BOX_PREFIX, known_functions
from proctor.policy.functions import FUNCTIONS as CEL_FUNCTIONS
from proctor.policy.probes import PROBE_FUNCTIONS, Unresolved, rewrite_probes
from proctor.policy.projection import Needs, needs_of
from proctor.policy.values import MAX_CONTAINERS, MAX_DEPTH, check_value

__all__ = [
    "FUNCTIONS",
    "MAX_CONTAINERS",
    "MAX_DEPTH",
    "VARIABLES",
    "Condition",
    "ConditionError",
    "EvaluationError",
    "ValueTooDeep",
    "check_value",
    "compile_condition",
    "compile_expression",
    "namespaced",
    "regex_problem",
]

#: The variables a condition may use, in the order the docs list them.
VARIABLES: tuple[str, ...] = ("tool", "args", "side_effect", "history", "run", "usage", "seen")

#: Kept for callers of the earlier name: the functions known when this module was imported.
FUNCTIONS: frozenset[str] = known_functions()

# Names bound by comprehension macros (`history.exists(c, c.tool == 'x')`): cel lists
# them among the variables, so they are recognised from the source instead.
_MACRO_VAR = re.compile(r"\.\s*(?:all|exists|exists_one|map|filter)\s*\(\s*([A-Za-z_]\w*)\s*,")
# Type names are identifiers too (`type(x) == int`).
_TYPE_NAMES = frozenset({"int", "uint", "double", "string", "bool", "bytes", "list", "map", "null_type", "type"})
_CEL_ERROR = re.compile(r"<input>:(\d+):(\d+): (.*)")
_EXPECTING = re.compile(r"\s+expecting \{.*$")




def _position(source: str, offset: int) -> tuple[int, int]:
    line = source.count("\n", 0, offset) + 1
    column = offset - (source.rfind("\n", 0, offset) + 1) + 1
    return line, column


def _find(source: str, pattern: str) -> tuple[int, int]:
    match = re.search(pattern, source)
    return _position(source, match.start()) if match else (1, 1)


def _did_you_mean(name: str, options: list[str] | tuple[str, ...] | frozenset[str]) -> str:
    close = difflib.get_close_matches(name, sorted(options), n=1)
    return f"did you mean '{close[0]}'? " if close else ""


@dataclass(frozen=True, slots=True)
class Condition:
    """A compiled `when`: `evaluate(activation)` is true, false, or raises EvaluationError."""

    source: str
    program: Any
    variables: tuple[str, ...]
    needs: Needs = field(default_factory=dict)
    #: The registered (Python) functions it calls; only these are added to its CEL context.
    functions: tuple[str, ...] = ()
    #: The program with its history pipelines read from the run's folds and keyed indices
    #: (`proctor.policy.aggregates`), the variables it reads (hidden ``__hN`` ones included), and
    #: the same with ``__hN()`` calls for a decision where a pipeline's value is an error.
    fast: Any = None
    fast_variables: tuple[str, ...] = ()
    fast_calls: Any = None
    #: What the original program reads (used for a short plain history, evaluated without folds).
    plain_needs: Needs | None = None
    #: The program with its provenance calls on paths of `args` read from hidden variables computed
    #: before CEL runs (`proctor.policy.probes`), and what it reads and calls; None when it has none.
    probed: Any = None
    probed_variables: tuple[str, ...] = ()
    probed_functions: tuple[str, ...] = ()

    def evaluate(self, activation: Mapping[str, Any]) -> bool:
        """Evaluate against the variables in `activation` (only those referenced are read).

        An activation with a ``cel_context(names)`` method (the engine's, shared by every
        rule of one decision) hands back a `cel.Context` whose variables were converted
        once; a plain mapping is converted on every evaluation.
        """
        result = self.compute(activation)
        if not isinstance(result, bool):
            raise EvaluationError(f"condition gave {result!r} ({type(result).__name__}), not true or false")
        return result

    def compute(self, activation: Mapping[str, Any]) -> Any:
        """The expression's value for `activation` (any CEL value); raises EvaluationError."""
        try:
            if isinstance(activation, Activation) and self.fast is not None and activation.folds_history:
                try:
                    result = self.fast.execute(activation.cel_context(self.fast_variables, self.functions))
                except AggregateError:  # an aggregate is an error: let CEL see it as one, where || may absorb it
                    result = self.fast_calls.execute(_calls_context(self, activation))
            elif isinstance(activation, Activation):
                cel_context = activation.cel_context
                context = None
                if self.probed is not None:
                    try:
                        context = cel_context(self.probed_variables, self.probed_functions)
                    except Unresolved:  # a path the probe cannot follow here: CEL says why, as written
                        pass
                if context is not None:
                    result = self.probed.execute(context)
                else:
                    result = self.program.execute(cel_context(self.variables, self.functions))
            else:
                context = {name: activation[name] for name in self.variables}
                for value in context.values():
                    check_value(value)
                if self.functions:
                    ctx = cel.Context(context)
                    for fn in self.functions:
                        ctx.add_function(fn, CEL_FUNCTIONS[fn].callable_for(None))
                    result = self.program.execute(ctx)
                else:
                    result = self.program.execute(context)
        except KeyError as exc:
            raise EvaluationError(self._missing_key(exc.args[0] if exc.args else "?")) from None
        except TypeError as exc:
            raise EvaluationError(_type_message(str(exc))) from None
        except Exception as exc:  # noqa: BLE001 - anything else CEL raises must deny, never allow
            raise EvaluationError(_other_message(str(exc)) or type(exc).__name__) from None
        return result

    def _missing_key(self, key: object) -> str:
        # CEL only says which key; the source usually says in which map.
        text = f"no such key {key!r}"
        found = re.search(
            rf"([A-Za-z_][\w.]*)(?:\.{re.escape(str(key))}\b|\[['\"]{re.escape(str(key))}['\"]\])", self.source
        )
        return f"{text} in {found.group(1)}" if found else text


def _calls_context(condition: Condition, activation: Mapping[str, Any]) -> Any:
    """A context where each hidden pipeline is a function (raising its error), for CEL to absorb or not."""
    names = condition.fast_variables
    variables = {n: activation[n] for n in names if not is_hidden(n)}
    functions = {n: _raiser(activation, n) for n in names if is_hidden(n)}
    call = activation.call if isinstance(activation, Activation) else None
    for fn in condition.functions:
        functions[fn] = CEL_FUNCTIONS[fn].callable_for(call)
    return cel.Context(variables, functions)


def _raiser(activation: Mapping[str, Any], name: str) -> Any:
    return lambda: activation[name]


def _first_sentence(text: str) -> str:
    text = text.strip().splitlines()[0] if text.strip() else ""
    cut = text.find(". ")
    return text[: cut + 1] if cut > 0 else text


def _other_message(text: str) -> str:
    regex = re.search(r"Function 'matches' error: (.*?) not a valid regex:", text)
    if regex:
        reason, _ = _regex_reason(text)
        return f"matches(): {regex.group(1)} is not a valid regular expression: {reason}"
    failed = re.match(r"Function '[\w.]+' error: Python function call failed: \w+: (.*)", text, re.DOTALL)
    if failed:  # one of proctor's functions refused its arguments: its own message says why
        return _first_sentence(failed.group(1)).rstrip(".")
    hidden = re.search(r"AggregateError: (.*?)(?:\. Check function|$)", text)
    if hidden:
        return hidden.group(1)
    unconvertible = re.search(r"convert variable '(\w+)'.*type (\w+) to Value", text)
    if unconvertible:
        return f"{unconvertible.group(1)} holds a {unconvertible.group(2)}, which CEL cannot use"
    unconvertible = re.search(r"type (\w+) to Value", text)
    if unconvertible:
        return f"a value is a {unconvertible.group(1)}, which CEL cannot use"
    undefined = re.match(r"Undefined variable or function: '([^']*)'", text)
    if undefined:
        return f"'{undefined.group(1)}' does not apply to these values (wrong type?)"
    return _first_sentence(text)


_NUMERIC = re.compile(r"\b(int|uint|float|double)\b")


def _type_message(text: str) -> str:
    first = _first_sentence(text).rstrip(".")
    # Only when the operands named are two different number types (`float * int`), not for `'x' in null`.
    if len(set(_NUMERIC.findall(first))) >= 2:
        return f"{first} (CEL does not mix int and double: write 100.0 or double(x))"
    if "overload" in text.lower():
        return f"{first} (check the types: a missing value is null, a number is not a string)"
    return first


# A string literal (so that an '=' inside one is skipped) or a lone '=' (not part of ==, !=, <=, >=).
_STRING = (r"(?:[rR][bB]?|[bB][rR]?)?(?:'''(?:\\.|[^\\])*?'''|" + '"""' + r"(?:\\.|[^\\])*?" + '"""'
           + r"""|'(?:\\.|[^'\\\n])*'|"(?:\\.|[^"\\\n])*")""")
_EQUALS = re.compile(_STRING + r"|(?<![=!<>])=(?!=)", re.DOTALL)


#: Functions also spelled with a dot, as a namespace: ``path.within(p, root)`` is ``path_within(p, root)``.
NAMESPACED = {"path.within": "path_within", "path.normalize": "path_normalize"}


def namespaced(source: str) -> str:
    """`source` with ``path.within(`` / ``path.normalize(`` written as the functions they name (same length),
    unless a macro binds the name `path` (``paths.all(path, path.normalize() == …)`` is a method call)."""
    if "path." not in source:
        return source
    toks = tokenize(source)
    if toks is None or "path" in _MACRO_VAR.findall(source):
        return source
    out = source
    for i, tok in enumerate(toks[:-3]):
        if (tok.kind == "id" and tok.text == "path" and not (i > 0 and toks[i - 1].text == ".")
                and toks[i + 1].text == "." and f"path.{toks[i + 2].text}" in NAMESPACED and toks[i + 3].text == "("
                and toks[i + 2].start == toks[i + 1].end == tok.end + 1):
            out = out[: tok.start] + NAMESPACED[f"path.{toks[i + 2].text}"] + out[toks[i + 2].end :]
    return out


def _lone_equals(source: str) -> int | None:
    """The offset of the first '=' that is not part of a comparison or a string literal."""
    for found in _EQUALS.finditer(source):
        if found.group() == "=":
            return found.start()
    return None


_MATCHES = cel.compile("s.matches(p)")


def regex_problem(pattern: str) -> tuple[str, int | None] | None:
    """Why the regex engine of `matches()` refuses `pattern`, and where in it (a 0-based offset, when it
    says); None when the pattern is valid. The syntax is RE2's (no look-around, no backreferences)."""
    try:
        _MATCHES.execute({"s": "", "p": pattern})
    except Exception as exc:  # noqa: BLE001 - the engine's refusal, whatever its type
        return _regex_reason(str(exc))
    return None


def _regex_reason(text: str) -> tuple[str, int | None]:
    """The engine's reason (``unclosed character class``) and offset, from its multi-line error text."""
    found = re.search(r"^error: (.*?)(?:\. Check function arguments.*)?$", text, re.MULTILINE)
    reason = found.group(1).rstrip(".") if found else (_first_sentence(text) or "invalid")
    lines = text.splitlines()
    offset = None
    for i, line in enumerate(lines):
        if i > 0 and line.strip() and set(line.strip()) == {"^"} and lines[i - 1].startswith("    "):
            offset = line.index("^") - 4
            break
    return reason, offset


def _literal(text: str) -> Any:
    """A CEL literal's value (a string token's text unescaped as CEL does), or None."""
    try:
        return cel.compile(text).execute({})
    except Exception:  # noqa: BLE001 - not a literal CEL can evaluate alone: nothing to check early
        return None


#: Arities (fewest, most) of CEL's native functions, counting a method's receiver; None: any.
_NATIVE_ARITY: dict[str, tuple[int, int | None]] = {
    "size": (1, 1), "contains": (2, 2), "startsWith": (2, 2), "endsWith": (2, 2), "matches": (2, 2),
    "int": (1, 1), "uint": (1, 1), "double": (1, 1), "string": (1, 1), "bytes": (1, 1), "dyn": (1, 1),
    "type": (1, 1), "timestamp": (1, 1), "duration": (1, 1),
}  # fmt: skip


def _check_calls(source: str, what: str) -> None:
    """Every call of a known function has as many arguments as it takes, and every literal pattern
    given to `matches()` compiles: else a ConditionError located at the call or the pattern."""
    toks = tokenize(source)
    if toks is None:
        return  # (not tokenised with certainty: CEL has compiled it, run time reports the rest)
    for i, tok in enumerate(toks):
        if tok.kind != "id" or i + 1 >= len(toks) or toks[i + 1].text != "(":
            continue
        method = i > 0 and toks[i - 1].text == "." and toks[i - 1].kind == "op"
        close = closing(toks, i + 1)
        if close is None:
            return
        args = split_args(toks, i + 2, close)
        given = len(args) + (1 if method else 0)
        arity = _arity(tok.text)
        if arity is not None:
            least, most = arity
            if given < least or (most is not None and given > most):
                takes = (f"{least}" if least == most else f"{least} to {most}" if most is not None
                         else f"at least {least}")
                hint = CEL_FUNCTIONS[tok.text].doc if tok.text in CEL_FUNCTIONS else ""
                receiver = " (counting the value before the dot)" if method else ""
                raise ConditionError(
                    f"{what}: {tok.text}() takes {takes} argument{'s' if most != 1 else ''}, got {given}{receiver}"
                    + (f": {hint}" if hint else ""), *_position(source, tok.start))
        if tok.text == "matches" and given == 2:
            lo, hi = args[0] if method else args[1]
            if hi - lo == 1 and toks[lo].kind == "str":
                pattern = _literal(toks[lo].text)
                problem = regex_problem(pattern) if isinstance(pattern, str) else None
                if problem is not None:
                    reason, at = problem
                    where = f", at character {at + 1} of the pattern" if at is not None else ""
                    raise ConditionError(
                        f"{what}: matches(): {pattern!r} is not a valid regular expression: {reason}{where} "
                        "(RE2 syntax: no look-around, no backreferences)", *_position(source, toks[lo].start))


def _arity(name: str) -> tuple[int, int | None] | None:
    if name in _NATIVE_ARITY:
        return _NATIVE_ARITY[name]
    registered = CEL_FUNCTIONS.get(name)
    return None if registered is None else registered.arity()


@functools.lru_cache(maxsize=16384)
def compile_condition(source: str) -> Condition:
    """Compile a `when` expression, checking it only uses known variables and functions."""
    return compile_expression(source, VARIABLES, what="when")


# Large enough for every condition of a 10,000-rule policy: the schema compiles each `when` to
# check it and the engine compiles it again, so a smaller cache compiled every condition twice.
@functools.lru_cache(maxsize=16384)
def compile_expression(source: str, variables: tuple[str, ...] = VARIABLES, what: str = "when") -> Condition:
    """Compile a CEL expression that may read only `variables`; errors are prefixed with `what`."""
    if not source.strip():
        hint = "condition (leave out `when` to match always)" if what == "when" else "expression"
        raise ConditionError(f"{what}: empty {hint}", 0, 0)
    written, source = source, namespaced(source)  # (the same length: every offset stays where it was written)
    try:
        program = cel.compile(source)
    except ValueError as exc:
        equals = _lone_equals(source)
        if equals is not None:
            raise ConditionError(f"{what}: '=' is not a CEL operator: did you mean '=='? (CEL compares with == "
                                 "and has no assignment)", *_position(source, equals)) from None
        found = _CEL_ERROR.search(str(exc))
        if not found:
            raise ConditionError(f"{what}: CEL error: {_first_sentence(str(exc))}") from None
        detail = _EXPECTING.sub("", found.group(3)).strip().removeprefix("Syntax error: ")
        if re.match(r"token recognition error at: '[rRbB]*['\"].*\\", detail):
            detail += (" (a backslash in a CEL string starts an escape: write \\\\d for RE2's \\d, or a raw "
                       "string r'\\d'; see docs/policy.md, \"Regular expressions\")")
        raise ConditionError(f"{what}: CEL syntax error: {detail}", int(found.group(1)), int(found.group(2))) from None
    bound = set(_MACRO_VAR.findall(source))
    used = [v for v in program.variables() if v in VARIABLES or v not in bound | _TYPE_NAMES]
    for name in used:
        if name not in variables:
            hint = _did_you_mean(name, variables)
            raise ConditionError(
                f"{what}: unknown variable '{name}' ({hint}variables: {', '.join(variables)})",
                *_find(source, rf"(?<![\w.]){re.escape(name)}\b"),
            )
    known = known_functions()
    for fn in program.functions():
        if fn[:1] in "_!-@" or fn in known:
            continue
        hint = _did_you_mean(fn, known)
        raise ConditionError(
            f"{what}: unknown function '{fn}'{' (' + hint.strip() + ')' if hint else ''}",
            *_find(source, rf"\b{re.escape(fn)}\s*\("),
        )
    _check_calls(source, what)
    # (in VARIABLES' order; a variable only some expressions have, `record` of a field's labels, after them)
    names = tuple(v for v in (*VARIABLES, *(x for x in variables if x not in VARIABLES)) if v in used)
    source_run = source
    boxes = [fn for fn in program.functions() if fn in CEL_FUNCTIONS and CEL_FUNCTIONS[fn].box is not None]
    if boxes:  # call the functions' boxed companions: a list they return then costs CEL no conversion
        unboxed = unbox_source(source, frozenset(boxes), BOX_PREFIX)
        if unboxed is not None:  # (None: not tokenised with certainty; the plain functions then serve)
            source_run, program = unboxed, cel.compile(unboxed)
    functions = tuple(sorted(fn for fn in program.functions() if fn in CEL_FUNCTIONS))
    fast = _fast(source_run) if "history" in names else None
    if fast is None:
        probed = (_probed(source, names, frozenset(boxes)) if PROBE_FUNCTIONS.keys() & {*functions, *boxes} else None)
        return Condition(source=written, program=program, variables=names, needs=needs_of(source, names),
                         functions=functions, **(probed or {}))
    fast_program, calls_program, rewritten = fast
    # A keyed pipeline reads the call too (its call sides): converted up front, as the source as written is.
    fast_used = set(fast_program.variables()).union(*(p.free_variables for p in rewritten.pipelines))
    plain = tuple(v for v in VARIABLES if v in fast_used)
    hidden = tuple(p.name for p in rewritten.pipelines)
    read = " ".join([rewritten.source, *(f for p in rewritten.pipelines for f in p.free_sources)])
    needs: Needs = {**needs_of(read, plain), **dict.fromkeys(hidden)}
    return Condition(source=written, program=program, variables=names, needs=needs, functions=functions,
                     fast=fast_program, fast_variables=plain + hidden, fast_calls=calls_program,
                     plain_needs=needs_of(source, names))


def _probed(source: str, names: tuple[str, ...], boxes: frozenset[str]) -> dict[str, Any] | None:
    """The `Condition` fields of the program with its probe-able provenance calls answered beforehand."""
    if "args" in _MACRO_VAR.findall(source) or "bind(" in source:
        return None  # `args` may name something else there (`[...].all(args, from_user(args.to))`): as written
    found = rewrite_probes(source)
    if found is None:
        return None
    text, probes = found
    if boxes:  # calls left (on values other than a path of args) use the boxed companions
        text = unbox_source(text, boxes, BOX_PREFIX) or text
    try:
        program = cel.compile(text)
    except Exception:  # noqa: BLE001 - an optimisation: when in doubt, evaluate as written
        return None
    return {"probed": program, "probed_variables": (*names, *(p.name for p in probes)),
            "probed_functions": tuple(sorted(fn for fn in program.functions() if fn in CEL_FUNCTIONS))}


def _fast(source: str) -> tuple[Any, Any, Rewrite] | None:
    """The condition with its history pipelines folded per run (None when it has none, or on any doubt)."""
    rewritten = rewrite(source)
    if rewritten is None:
        return None
    try:
        return cel.compile(rewritten.source), cel.compile(rewritten.calls_source), rewritten
    except Exception:  # noqa: BLE001 - the rewrite is an optimisation: when in doubt, evaluate as written
        return None
