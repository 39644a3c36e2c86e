"""The JSON query bodies of the index server, validated (shared by server and client).

A query is a small JSON object sent as a Flight ticket (``do_get``) or action body:

``{"op": "range", "box": {"lo": [..], "hi": [..]}, "limit": 5000, "token": null}``
``{"op": "symdiff", "box": {..}, "box2": {..}, "limit": 5000, "token": null}``
``{"op": "stream"}`` (B in stored order), optional ``"columns": [..]`` and ``"dataset": NAME``.
``{"op": "summary"}``: the summarised stream of a dataset served with ``--summarize``
(``smerge.counting.summary``; its columns are fixed: no ``"columns"``).

Every field is checked (type, size, range); anything else is rejected with a message that
says what is wrong. Limits are module constants.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

MAX_REQUEST_BYTES = 64 * 1024
MAX_PAGE_ROWS = 1_000_000
MAX_DIMS = 8
MAX_BOXES = 2
MAX_COLUMNS = 1024
MAX_NAME_CHARS = 256  # a dataset or column name
MAX_TOKEN_CHARS = 4096  # a bearer token travels in every request's headers (the gate allows 256 KiB)
MAX_LISTED = 5  # names repeated in an error message
OPS = {"range": 1, "symdiff": 2, "stream": 0, "summary": 0}
WHOLE_STREAM_OPS = ("stream", "summary")
FIELDS = {"op", "dataset", "box", "box2", "limit", "token", "columns"}
NEXT_TOKEN_KEY = b"smerge.next_token"
INVALID_ARGUMENT = b"INVALID_ARGUMENT"  # extra_info of the server error answering a rejected request
MAX_ERROR_CHARS = 300  # of an error message sent to a client


class BadRequest(ValueError):
    """A malformed, oversized or unknown request (the server answers INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class Query:
    op: str
    dataset: str | None
    boxes: tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]
    limit: int
    token: str | None
    columns: tuple[str, ...] | None

    def to_json(self) -> bytes:
        body: dict = {"op": self.op}
        if self.dataset is not None:
            body["dataset"] = self.dataset
        for name, (lo, hi) in zip(("box", "box2"), self.boxes):
            body[name] = {"lo": list(lo), "hi": list(hi)}
        if self.op not in WHOLE_STREAM_OPS:
            body["limit"] = self.limit
            body["token"] = self.token
        if self.columns is not None:
            body["columns"] = list(self.columns)
        return json.dumps(body, separators=(",", ":"), allow_nan=True).encode()


def one_line(e: BaseException) -> str:
    """An error as one line of at most ``MAX_ERROR_CHARS`` characters (what a client is sent;
    parameter references shown as the serving process names them)."""
    from smerge.errors import render

    text = render(str(e)).strip()
    text = text.splitlines()[0] if text else type(e).__name__
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 3] + "..."



def _listed(names) -> str:
    """At most ``MAX_LISTED`` names, each cut to 40 characters (error messages stay short)."""
    names = list(names)
    shown = [repr(n if len(n) <= 40 else n[:37] + "...") for n in names[:MAX_LISTED]]
    more = f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else ""
    return ", ".join(shown) + more


def _number(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        if v in ("inf", "+inf", "-inf", "Infinity", "-Infinity"):
            return float(v.replace("Infinity", "inf"))
        raise BadRequest(f"{where} must be a number, got {type(v).__name__}")
    try:
        f = float(v)
    except OverflowError:
        raise BadRequest(f"{where} is too large for a float64 bound; use a number or \"inf\"") from None
    if math.isnan(f):
        raise BadRequest(f"{where} is NaN; box bounds must be numbers")
    return f


def _box(v, name: str) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if not isinstance(v, dict) or set(v) != {"lo", "hi"}:
        raise BadRequest(f"{name!r} must be an object {{\"lo\": [...], \"hi\": [...]}}")
    lo, hi = v["lo"], v["hi"]
    if not isinstance(lo, list) or not isinstance(hi, list):
        raise BadRequest(f"{name}.lo and {name}.hi must be lists of numbers")
    if not (1 <= len(lo) <= MAX_DIMS) or len(lo) != len(hi):
        raise BadRequest(f"{name} must have 1..{MAX_DIMS} bounds on each side, the same number for lo and hi")
    return (tuple(_number(x, f"{name}.lo[{i}]") for i, x in enumerate(lo)),
            tuple(_number(x, f"{name}.hi[{i}]") for i, x in enumerate(hi)))


def parse_query(raw: bytes, *, max_page: int = MAX_PAGE_ROWS) -> Query:
    """Validate a request body; raise ``BadRequest`` with a clear message."""
    if len(raw) > MAX_REQUEST_BYTES:
        raise BadRequest(f"request is {len(raw)} bytes; the limit is {MAX_REQUEST_BYTES}")
    try:
        body = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(f"request is not valid JSON ({str(e)[:120]})") from None
    except RecursionError:
        raise BadRequest("request JSON is nested too deeply") from None
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        raise BadRequest(f"request JSON has a value out of range ({str(e)[:120]})") from None
    if not isinstance(body, dict):
        raise BadRequest("request must be a JSON object with an \"op\" field")
    unknown = sorted(set(body) - FIELDS)
    if unknown:
        raise BadRequest(f"unknown request field(s) {_listed(unknown)}; allowed: {', '.join(sorted(FIELDS))}")
    op = body.get("op")
    if not isinstance(op, str) or op not in OPS:
        shown = _listed([op]) if isinstance(op, str) else type(op).__name__
        raise BadRequest(f"unknown op {shown}; use one of {', '.join(OPS)}")
    dataset = body.get("dataset")
    if dataset is not None and (not isinstance(dataset, str) or len(dataset) > MAX_NAME_CHARS):
        raise BadRequest("dataset must be a name (string)")
    nbox = OPS[op]
    names = ("box", "box2")[:nbox]
    extra_boxes = [n for n in ("box", "box2")[nbox:] if n in body]
    if extra_boxes:
        raise BadRequest(f"op {op!r} takes {nbox} box(es) (at most {MAX_BOXES}); remove {', '.join(extra_boxes)}")
    for n in names:
        if n not in body:
            raise BadRequest(f"op {op!r} needs {n!r}")
    boxes = tuple(_box(body[n], n) for n in names)
    if nbox == 2 and len(boxes[0][0]) != len(boxes[1][0]):
        raise BadRequest("box and box2 must have the same number of keys")
    limit = body.get("limit", max_page if op in WHOLE_STREAM_OPS else None)
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise BadRequest(f"op {op!r} needs an integer \"limit\" (records per page, 1..{max_page})")
    if not 1 <= limit <= max_page:
        shown = str(limit) if abs(limit) < 10**15 else f"an integer of {len(str(abs(limit)))} digits"
        raise BadRequest(f"limit is {shown}; use 1..{max_page} records per page")
    token = body.get("token")
    if token is not None and (not isinstance(token, str) or len(token) > 128):
        raise BadRequest("token must be the string returned by the previous page, or null")
    columns = body.get("columns")
    if columns is not None and op == "summary":
        raise BadRequest("op 'summary' sends the item and time columns the server summarises; remove \"columns\"")
    if columns is not None:
        if isinstance(columns, list) and not columns:
            raise BadRequest("columns is an empty list; name at least one column, or leave \"columns\" out "
                             "for all of them")
        if (not isinstance(columns, list) or len(columns) > MAX_COLUMNS
                or not all(isinstance(c, str) and len(c) <= MAX_NAME_CHARS for c in columns)):
            raise BadRequest(f"columns must be a list of at most {MAX_COLUMNS} column names")
        seen: set[str] = set()
        dups = [c for c in columns if c in seen or seen.add(c)]
        if dups:
            raise BadRequest(f"columns repeat {_listed(dict.fromkeys(dups))}; name each column once")
        columns = tuple(columns)
    return Query(op=op, dataset=dataset, boxes=boxes, limit=int(limit), token=token, columns=columns)
