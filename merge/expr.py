"""A safe expression language for W-join predicates (``--where``), evaluated vectorised.

Grammar (a subset of Python/SQL expression syntax, case-insensitive keywords):
comparisons ``< <= > >= == != = <>`` (chains allowed), arithmetic ``+ - * /`` and unary
minus, ``and`` / ``or`` / ``not``, ``abs(x)``, numeric / string / boolean literals, and columns
written ``ALIAS.col`` (``S1.p``, or the alias given to a stream). Text is *parsed* with Python's
``ast`` module under a strict whitelist of node types and turned into a small tree of our own;
nothing is ever compiled, evaluated or executed as code.

Semantics are SQL's (the test oracle is DuckDB): NULL propagates through arithmetic and
comparisons, ``and``/``or``/``not`` use three-valued logic, and a row passes only when the
predicate is TRUE. ``/`` is floating-point division; division by zero is NULL.
"""

from __future__ import annotations

import ast
import io
import math
import re
import tokenize
from dataclasses import dataclass
from typing import Callable, Sequence

import pyarrow as pa

from smerge.errors import InputError, UsageError, param
from smerge.merge.arrays import buffer_values, int64_array, numeric_dtype, one_chunk

CMP_OPS = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}
ARITH_OPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
ALLOWED_FUNCS = ("abs",)
_PC_CMP = {"<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal", "==": "equal", "!=": "not_equal"}
_PC_ARITH = {"+": "add", "-": "subtract", "*": "multiply"}
_FUNCS: dict = {}


def call(name: str, *args, options=None):
    """Arrow's compute function ``name`` (as ``pyarrow.compute.<name>`` with its default options)
    called through ``pyarrow._compute``: importing ``pyarrow.compute`` builds a Python wrapper
    for each of its ~300 functions, 60-200 ms of every process that imports it."""
    f = _FUNCS.get(name)
    if f is None:
        from pyarrow._compute import get_function

        f = _FUNCS[name] = get_function(name)
    return f.call(list(args), options)


def cast(x, t: pa.DataType, *, safe: bool = True):
    """``pyarrow.compute.cast(x, t, safe=safe)`` without importing ``pyarrow.compute``."""
    from pyarrow._compute import CastOptions

    return call("cast", x, options=CastOptions.safe(t) if safe else CastOptions.unsafe(t))


class ExprError(UsageError):
    """A --where expression that cannot be accepted (syntax, unknown column, forbidden construct)."""


# ---- the tree -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Col:
    stream: int  # 0-based stream number
    name: str
    kind: str  # "num", "str", "bool", "time"


@dataclass(frozen=True)
class Lit:
    value: object
    kind: str


@dataclass(frozen=True)
class Neg:
    x: "Node"
    kind: str = "num"


@dataclass(frozen=True)
class Abs:
    x: "Node"
    kind: str = "num"


@dataclass(frozen=True)
class Arith:
    op: str
    left: "Node"
    right: "Node"
    kind: str = "num"


@dataclass(frozen=True)
class Cmp:
    op: str
    left: "Node"
    right: "Node"
    kind: str = "bool"


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" | "or"
    items: tuple["Node", ...]
    kind: str = "bool"


@dataclass(frozen=True)
class Not:
    x: "Node"
    kind: str = "bool"


Node = Col | Lit | Neg | Abs | Arith | Cmp | BoolOp | Not


def _kind_of(t: pa.DataType) -> str:
    if pa.types.is_boolean(t):
        return "bool"
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_decimal(t):
        return "num"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str"
    if pa.types.is_timestamp(t) or pa.types.is_date(t):
        return "time"
    return "other"


# ---- parsing --------------------------------------------------------------------------------

_EXAMPLE = "write e.g. \"S1.p > S2.p and abs(S1.t - S2.t) < 5\""


def _normalize(text: str) -> tuple[str, list[int]]:
    """SQL spellings to Python tokens: AND/OR/NOT any case, ``=`` -> ``==``, ``<>`` -> ``!=``.

    Returns the Python source and the positions (0-based, in the source) of the characters the
    ``=`` -> ``==`` rewrite inserted, so that error columns point into the user's text; every
    other rewrite keeps lengths (and untokenize keeps the tokens' positions)."""
    text = text.replace("<>", "!=")
    inserted: list[int] = []

    def eq(m: re.Match) -> str:
        inserted.append(m.start() + len(inserted) + 1)
        return "=="

    text = re.sub(r"(?<![<>!=])=(?!=)", eq, text)
    try:
        toks = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return text, inserted  # ast.parse reports it, with its column
    out = []
    prev = None
    for tok in toks:
        if tok.type == tokenize.NAME and tok.string.lower() in ("and", "or", "not", "true", "false") and \
                not (prev is not None and prev.type == tokenize.OP and prev.string == "."):
            low = tok.string.lower()
            tok = tok._replace(string={"true": "True", "false": "False"}.get(low, low))
        out.append(tok)
        prev = tok
    return tokenize.untokenize(out), inserted


def _syntax_error(e: SyntaxError, text: str, lead: int, inserted: list[int]) -> ExprError:
    """The user's column (1-based) of a syntax error in the normalized source."""
    msg = (e.msg or "invalid syntax").split(" (detected at")[0]
    if not e.offset or e.offset < 1 or e.offset > len(text.rstrip()) + len(inserted):
        where = f"at the end (column {len(text.rstrip()) + 1})"
    else:
        j = e.offset - 1
        where = f"at column {lead + j - sum(1 for q in inserted if q <= j) + 1}"
    return ExprError(f"{param.where}: syntax error {where}: {msg}, in {text!r}; {_EXAMPLE}")


# Integer literals must fit the int64 columns they meet (pyarrow cannot hold a larger one).
_INT64 = (-(2**63), 2**63 - 1)


def parse_expr(text: str, aliases: Sequence[str], schemas: Sequence[pa.Schema]) -> Node:
    """Parse ``text`` into a typed tree; columns resolve against ``aliases``/``schemas``.

    Raises ``ExprError`` (exit code 2) for syntax errors (with the column in ``text``), unknown
    aliases or columns, attribute access beyond ``ALIAS.col``, calls of anything but ``abs``,
    integer literals outside int64, and type mismatches.
    """
    if not text or not text.strip():
        raise ExprError(f"{param.where} is empty; give a predicate such as \"S1.p > S2.p\"")
    # One line, so that a column is a position in the text (line breaks and tabs are spaces).
    flat = text.translate({ord("\n"): " ", ord("\r"): " ", ord("\t"): " "})
    lead = len(flat) - len(flat.lstrip())
    src, inserted = _normalize(flat.strip())
    try:
        tree = ast.parse(src, mode="eval")
    except SyntaxError as e:
        raise _syntax_error(e, text, lead, inserted) from None
    lookup = {a.lower(): i for i, a in enumerate(aliases)}
    node = _build(tree.body, text, lookup, aliases, schemas)
    if node.kind != "bool":
        raise ExprError(f"{param.where} {text!r} is not a condition (it computes a {node.kind} value); "
                        "compare it, e.g. \"... > 0\"")
    return node


def _build(n: ast.AST, text: str, lookup: dict, aliases: Sequence[str], schemas: Sequence[pa.Schema]) -> Node:
    rec = lambda m: _build(m, text, lookup, aliases, schemas)  # noqa: E731
    if isinstance(n, ast.Attribute):
        if not isinstance(n.value, ast.Name):
            raise ExprError(f"{param.where}: attribute access is not allowed in {text!r}; "
                            "columns are written ALIAS.column, e.g. S1.p")
        alias = n.value.id
        if alias.lower() not in lookup:
            raise ExprError(f"{param.where}: unknown stream {alias!r}; the streams are {', '.join(aliases)}")
        s = lookup[alias.lower()]
        if n.attr not in schemas[s].names:
            raise ExprError(f"{param.where}: unknown column {alias}.{n.attr}; {aliases[s]} has "
                            f"{', '.join(schemas[s].names)}")
        kind = _kind_of(schemas[s].field(n.attr).type)
        if kind == "other":
            raise ExprError(f"{param.where}: column {alias}.{n.attr} has type {schemas[s].field(n.attr).type}, "
                            "which predicates cannot use")
        return Col(s, n.attr, kind)
    if isinstance(n, ast.Name):
        raise ExprError(f"{param.where}: bare name {n.id!r}; qualify columns with their stream, e.g. "
                        f"{aliases[0]}.{n.id}")
    if isinstance(n, ast.Constant):
        v = n.value
        if isinstance(v, bool):
            return Lit(v, "bool")
        if isinstance(v, int) and not _INT64[0] <= v <= _INT64[1]:
            raise ExprError(f"{param.where}: integer {v} is out of range (-2^63 to 2^63-1); write it as a float, "
                            f"e.g. {float(v):g}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ExprError(f"{param.where}: a number literal overflows a double (it reads as infinity); write a finite "
                            "number")
        if isinstance(v, (int, float)):
            return Lit(v, "num")
        if isinstance(v, str):
            return Lit(v, "str")
        raise ExprError(f"{param.where}: literal {v!r} is not allowed; use numbers, strings, true/false")
    if isinstance(n, ast.UnaryOp):
        if isinstance(n.op, ast.USub) and isinstance(n.operand, ast.Constant) \
                and type(n.operand.value) is int and n.operand.value == 2**63:
            return Lit(-(2**63), "num")  # the smallest int64, whose absolute value is not one
        x = rec(n.operand)
        if isinstance(n.op, ast.Not):
            _need(x, "bool", "not", text)
            return Not(x)
        if isinstance(n.op, (ast.USub, ast.UAdd)):
            _need(x, "num", "unary minus", text)
            if isinstance(n.op, ast.UAdd):
                return x
            if isinstance(x, Lit):
                return Lit(-x.value, "num")
            return Neg(x)
        raise ExprError(f"{param.where}: operator {type(n.op).__name__} is not allowed in {text!r}")
    if isinstance(n, ast.BinOp):
        if type(n.op) not in ARITH_OPS:
            raise ExprError(f"{param.where}: operator {type(n.op).__name__} is not allowed; use + - * /")
        left, right = rec(n.left), rec(n.right)
        op = ARITH_OPS[type(n.op)]
        if left.kind == "time" and right.kind == "time" and op == "-":
            raise ExprError(f"{param.where}: arithmetic on datetime columns is not supported; "
                            f"constrain time with {param.window}/{param.pair_windows}")
        _need(left, "num", op, text)
        _need(right, "num", op, text)
        return Arith(op, left, right)
    if isinstance(n, ast.BoolOp):
        items = tuple(rec(v) for v in n.values)
        for it in items:
            _need(it, "bool", "and/or", text)
        return BoolOp("and" if isinstance(n.op, ast.And) else "or", items)
    if isinstance(n, ast.Compare):
        parts = [rec(n.left)] + [rec(c) for c in n.comparators]
        cmps = []
        for op, l, r in zip(n.ops, parts, parts[1:]):
            if type(op) not in CMP_OPS:
                raise ExprError(f"{param.where}: operator {type(op).__name__} is not allowed; use < <= > >= = !=")
            if l.kind != r.kind:
                raise ExprError(f"{param.where}: cannot compare a {l.kind} value with a {r.kind} value in {text!r}")
            cmps.append(Cmp(CMP_OPS[type(op)], l, r))
        return cmps[0] if len(cmps) == 1 else BoolOp("and", tuple(cmps))
    if isinstance(n, ast.Call):
        fname = n.func.id if isinstance(n.func, ast.Name) else None
        if fname is None or fname.lower() not in ALLOWED_FUNCS:
            raise ExprError(f"{param.where}: calls are not allowed except abs(); got {ast.unparse(n.func)}(...)")
        if len(n.args) != 1 or n.keywords:
            raise ExprError(f"{param.where}: abs() takes exactly one argument")
        x = rec(n.args[0])
        _need(x, "num", "abs", text)
        return Abs(x)
    raise ExprError(f"{param.where}: {type(n).__name__} is not allowed in {text!r}; use comparisons, + - * /, "
                    "and/or/not, abs() and ALIAS.column")


def _need(x: Node, kind: str, what: str, text: str) -> None:
    if x.kind != kind:
        raise ExprError(f"{param.where}: {what} needs a {kind} operand, got a {x.kind} value in {text!r}")


# ---- analysis -------------------------------------------------------------------------------

def streams_of(node: Node) -> frozenset[int]:
    """The streams a (sub)expression reads."""
    return frozenset(s for s, _ in columns_of(node))


def columns_of(node: Node | None) -> set[tuple[int, str]]:
    """The (stream, column) pairs a (sub)expression reads."""
    if node is None or isinstance(node, Lit):
        return set()
    if isinstance(node, Col):
        return {(node.stream, node.name)}
    if isinstance(node, (Neg, Abs, Not)):
        return columns_of(node.x)
    if isinstance(node, (Arith, Cmp)):
        return columns_of(node.left) | columns_of(node.right)
    return set().union(*(columns_of(i) for i in node.items))


def conjuncts(node: Node) -> list[Node]:
    """Split a top-level conjunction ``a and b and ...`` into its parts."""
    if isinstance(node, BoolOp) and node.op == "and":
        out: list[Node] = []
        for it in node.items:
            out += conjuncts(it)
        return out
    return [node]


def equality_terms(node: Node) -> tuple[Col, Col] | None:
    """``(left, right)`` when ``node`` is ``Si.a == Sj.b`` between two different streams."""
    if isinstance(node, Cmp) and node.op == "==" and isinstance(node.left, Col) and isinstance(node.right, Col) \
            and node.left.stream != node.right.stream:
        return node.left, node.right
    return None


def conjoin(nodes: Sequence[Node]) -> Node | None:
    nodes = list(nodes)
    if not nodes:
        return None
    return nodes[0] if len(nodes) == 1 else BoolOp("and", tuple(nodes))


# ---- vectorised evaluation ------------------------------------------------------------------

def evaluate(node: Node, column: Callable[[int, str], pa.Array], length: int) -> pa.Array:
    """Evaluate ``node`` over ``length`` rows; ``column(stream, name)`` returns that many values.

    A predicate evaluates to a boolean array with NULL where SQL gives NULL; use ``mask`` to get
    the rows where it is TRUE.
    """
    if isinstance(node, Col):
        return column(node.stream, node.name)
    if isinstance(node, Lit):
        return scalar(node.value)
    if isinstance(node, Neg):
        return call("negate", evaluate(node.x, column, length))
    if isinstance(node, Abs):
        return call("abs", evaluate(node.x, column, length))
    if isinstance(node, Arith):
        left, right = evaluate(node.left, column, length), evaluate(node.right, column, length)
        if node.op == "/":
            left, right = _f64(left), _f64(right)
            den = call("if_else", call("equal", right, scalar(0.0)), pa.scalar(None, pa.float64()), right)
            return call("divide", left, den)
        return call(_PC_ARITH[node.op], left, right)
    if isinstance(node, Cmp):
        left, right = _same_time_type(evaluate(node.left, column, length), evaluate(node.right, column, length))
        return call(_PC_CMP[node.op], left, right)
    if isinstance(node, Not):
        return call("invert", evaluate(node.x, column, length))
    vals = [evaluate(i, column, length) for i in node.items]
    fn = "and_kleene" if node.op == "and" else "or_kleene"
    acc = vals[0]
    for v in vals[1:]:
        acc = call(fn, acc, v)
    return acc


_UNITS = ("s", "ms", "us", "ns")


def _same_time_type(left, right):
    """Two timestamp operands of different units and zones (Arrow compares one difference, not
    both) as the finer unit, as instants (UTC; a naive time is UTC); other operands as given."""
    lt, rt = left.type, right.type
    if not (pa.types.is_timestamp(lt) and pa.types.is_timestamp(rt)) or lt == rt:
        return left, right
    unit = max(lt.unit, rt.unit, key=_UNITS.index)
    to = pa.timestamp(unit, "UTC" if lt.tz or rt.tz else None)
    try:
        return cast(left, to), cast(right, to)
    except pa.ArrowInvalid as e:
        raise InputError(f"cannot compare times of {lt} with {rt}: {e}; the times lie outside what "
                         f"{unit} units hold (1678-2262 in nanoseconds)") from None


def scalar(v) -> pa.Scalar:
    """``pa.scalar(v)`` built from buffers: ``pa.scalar`` imports pandas (~0.3 s, ~50 MB) to ask
    whether ``v`` is a pandas object."""
    import numpy as np

    if isinstance(v, bool):
        return pa.Array.from_buffers(pa.bool_(), 1, [None, pa.py_buffer(np.packbits([v], bitorder="little"))])[0]
    if isinstance(v, int) and -(2**63) <= v < 2**63:
        return pa.Array.from_buffers(pa.int64(), 1, [None, pa.py_buffer(np.array([v], np.int64))])[0]
    if isinstance(v, float):
        return pa.Array.from_buffers(pa.float64(), 1, [None, pa.py_buffer(np.array([v], np.float64))])[0]
    if isinstance(v, str):
        b = v.encode()
        return pa.Array.from_buffers(pa.string(), 1, [None, pa.py_buffer(np.array([0, len(b)], np.int32)),
                                                      pa.py_buffer(b)])[0]
    return pa.scalar(v)


def _f64(x):
    return cast(x, pa.float64())


def mask(node: Node, column: Callable[[int, str], pa.Array], length: int):
    """A numpy boolean mask of the rows where ``node`` is TRUE (NULL and FALSE drop the row)."""
    import numpy as np

    v = evaluate(node, column, length)
    if isinstance(v, pa.Scalar):
        return np.full(length, bool(v.as_py()) if v.is_valid else False)
    return to_numpy(call("coalesce", v, scalar(False)))  # pyarrow.compute.fill_null(v, False)


def to_numpy(col):
    """A boolean or fixed-width numeric Arrow column as numpy, read from its buffers (pyarrow's
    own ``to_numpy`` imports pandas: ~0.3 s and ~50 MB per process). Values under NULLs are
    whatever the buffer holds: fill the NULLs first when they matter."""
    import numpy as np

    col = one_chunk(col)
    n, off, t = len(col), col.offset, col.type
    if pa.types.is_boolean(t):
        if n == 0:
            return np.empty(0, bool)
        bits = np.frombuffer(col.buffers()[1], np.uint8, count=(off + n + 7) // 8)
        return np.unpackbits(bits, bitorder="little")[off:off + n].astype(bool)
    dt = numeric_dtype(t)
    if dt is None:
        raise TypeError(f"to_numpy: {t} is not a boolean or numeric column")
    return buffer_values(col, dt)


from_numpy = int64_array  # an int64 numpy array as an Arrow array over the same memory


# ---- SQL rendering (the DuckDB oracle and the docs) -----------------------------------------

def to_sql(node: Node, tables: Sequence[str]) -> str:
    """The same predicate as SQL over tables named ``tables[stream]``."""
    r = lambda n: to_sql(n, tables)  # noqa: E731
    if isinstance(node, Col):
        return f'{tables[node.stream]}."{node.name}"'
    if isinstance(node, Lit):
        if isinstance(node.value, bool):
            return "TRUE" if node.value else "FALSE"
        if isinstance(node.value, str):
            return "'" + node.value.replace("'", "''") + "'"
        return repr(node.value) if isinstance(node.value, float) else str(node.value)
    if isinstance(node, Neg):
        return f"(-{r(node.x)})"
    if isinstance(node, Abs):
        return f"abs({r(node.x)})"
    if isinstance(node, Arith):
        if node.op == "/":
            return f"(CAST({r(node.left)} AS DOUBLE) / NULLIF(CAST({r(node.right)} AS DOUBLE), 0))"
        return f"({r(node.left)} {node.op} {r(node.right)})"
    if isinstance(node, Cmp):
        op = "=" if node.op == "==" else node.op
        return f"({r(node.left)} {op} {r(node.right)})"
    if isinstance(node, Not):
        return f"(NOT {r(node.x)})"
    return "(" + f" {node.op.upper()} ".join(r(i) for i in node.items) + ")"


__all__ = ["ExprError", "Node", "Col", "Lit", "parse_expr", "streams_of", "conjuncts", "equality_terms", "conjoin",
           "evaluate", "mask", "to_numpy", "from_numpy", "to_sql"]
