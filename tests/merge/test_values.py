"""smerge.merge.values: user text -> typed values (durations, eps, window sizes, fractions), table-driven.

The unit lengths are checked against numpy's timedelta64 (an independent table), and the
consumers (wjoin bounds, count intervals, --eps on time keys, archive EVERY) against each other."""

from __future__ import annotations

import inspect
import math
import pathlib
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from smerge.errors import UsageError
from smerge.merge import values as V
from smerge.merge.values import Duration, parse_duration

ROOT = pathlib.Path(__file__).resolve().parents[2]

# ---- durations: every unit --------------------------------------------------------------------

# (text, numpy unit and count of the same length)
UNITS = [
    ("3ns", (3, "ns")), ("3us", (3, "us")), ("3ms", (3, "ms")), ("3s", (3, "s")), ("3sec", (3, "s")),
    ("3min", (3, "m")), ("3h", (3, "h")), ("3hr", (3, "h")), ("3d", (3, "D")), ("3day", (3, "D")),
    ("3days", (3, "D")), ("3w", (3, "W")),
    # spaces, case, decimals, exponents
    (" 3 H ", (3, "h")), ("3MIN", (3, "m")), ("3Ms", (3, "ms")), ("1.5h", (90, "m")), (".5s", (500, "ms")),
    ("2e3ms", (2, "s")), ("1E-3s", (1, "ms")),
]


@pytest.mark.parametrize("text, same", UNITS)
def test_every_unit_against_numpy(text, same):
    want = np.timedelta64(*same).astype("timedelta64[ns]").astype(np.int64)
    d = parse_duration(text)
    assert d.unit is not None and d.nanoseconds() == pytest.approx(float(want), rel=1e-15)
    assert d.ticks(10**9) == pytest.approx(want / 1e9, rel=1e-15)  # in seconds' ticks


@pytest.mark.parametrize("text, days", [("1mo", 30), ("2.5mo", 75), ("1y", 360), ("3Y", 1080), ("1MO", 30)])
def test_months_and_years_only_in_the_360_day_calendar(text, days):
    d = parse_duration(text)
    assert d.is_calendar and d.nanoseconds("360_day") == days * 86400 * 10**9
    for cal in (None, "standard", "noleap", "proleptic_gregorian", "all_leap", "julian"):
        with pytest.raises(UsageError, match=f"no fixed length in the {cal or 'standard'} calendar"):
            d.nanoseconds(cal, "--every")
    # fixed units are the same in every calendar
    assert parse_duration("2d").nanoseconds("360_day") == parse_duration("2d").nanoseconds("noleap") == 2 * 86400e9


# ---- durations: every refusal -------------------------------------------------------------------

REFUSED = [
    ("1m", "'m' could be minutes or months; write min or mo"), ("1M", "'M' could be minutes or months"),
    (" 2 m ", "minutes or months"),
    ("6 parsecs", "is not a duration"), ("", "is not a duration"), ("h", "is not a duration"),
    ("-3", "is not a duration"), ("-3s", "is not a duration"), ("+3s", "is not a duration"),
    ("nan", "is not a duration"), ("inf", "is not a duration"), ("infs", "is not a duration"),
    ("1h30min", "is not a duration"), ("1 h h", "is not a duration"), ("1e", "is not a duration"),
    ("1,5h", "is not a duration"), ("0x10s", "is not a duration"), ("1µs", "is not a duration"),
    ("1e400", "is too large to hold"), ("1e400s", "is too large to hold"), ("1e300s", "is too large to hold"),
    ("1e299w", "is too large to hold"), ("1e300y", "is too large to hold"),
]


@pytest.mark.parametrize("text, words", REFUSED)
def test_refusals_name_the_parameter_and_the_text(text, words):
    with pytest.raises(UsageError) as e:
        parse_duration(text, "--every")
    msg = str(e.value)
    assert msg.startswith(f"--every {text!r}") and words in msg, msg
    assert "\n" not in msg


def test_the_messages_the_command_line_tests_quote():
    with pytest.raises(UsageError, match=re.escape("--window '1e400' is too large to hold")):
        parse_duration("1e400", "--window")
    with pytest.raises(UsageError, match=re.escape("--pair-window '1,2=1e300d' is too large")):
        parse_duration("1e300d", "--pair-window", shown="1,2=1e300d")
    with pytest.raises(UsageError, match="not a duration; write e.g. 90s, 30min, 6h, 2d"):
        parse_duration("fast", "--window")


# ---- plain numbers and edge values ----------------------------------------------------------------

@pytest.mark.parametrize("given, value", [("7", 7.0), (" 7 ", 7.0), ("0", 0.0), ("0.25", 0.25), ("1e3", 1000.0),
                                           (7, 7.0), (0, 0.0), (2.5, 2.5), (1e300, 1e300), ("1e-400", 0.0)])
def test_plain_numbers_are_in_the_columns_unit(given, value):
    d = parse_duration(given)
    assert d == Duration(value) and d.unit is None
    assert d.ticks(10**9) == value and d.ticks(None) == value  # already in ticks, on any column
    with pytest.raises(ValueError):
        d.nanoseconds()  # a plain number has no length of its own


@pytest.mark.parametrize("given, words", [(-1, ">= 0"), (-0.5, ">= 0"), (float("nan"), ">= 0"),
                                          (float("inf"), "too large"), (True, "not a duration")])
def test_plain_number_refusals(given, words):
    with pytest.raises(UsageError, match=words):
        parse_duration(given, "window")


@pytest.mark.parametrize("given", ["0", "0s", "0.0h", 0, 0.0, "1e-400", "1e-400s"])
def test_positive_refuses_zero(given):
    assert parse_duration(given).value == 0
    with pytest.raises(UsageError, match=r"must be a positive duration \(> 0\)"):
        parse_duration(given, "--every", positive=True)


def test_a_unit_on_a_plain_number_column_is_refused():
    with pytest.raises(UsageError, match="has a unit but the time column is a plain number"):
        parse_duration("6h").ticks(None, what="--every")


def test_huge_values_beyond_int64_nanoseconds():
    # Fits a float, not int64 nanoseconds (~292 years): accepted as a value; each consumer
    # clamps (wjoin: a bound past the data's span is no bound) or refuses (count's ticks).
    d = parse_duration("1e12h")
    assert d.nanoseconds() == 3.6e24 > 2**63
    from smerge.counting.itemcount import duration_ticks
    from smerge.merge._wjoin_kernel import INT_POS
    from smerge.merge.wjoin_params import resolve_bound

    assert resolve_bound(d, "datetime@s") == INT_POS and resolve_bound(d, "datetime_us@us") == INT_POS
    assert resolve_bound(Duration(1e300), "int") == INT_POS
    with pytest.raises(UsageError, match="up to 2\\^62"):
        duration_ticks("1e12h", pa.timestamp("ns"), "--every")
    with pytest.raises(UsageError, match="too large"):
        duration_ticks("1e300s", pa.timestamp("ns"), "--every")


def test_str_and_equality():
    assert str(parse_duration("90s")) == "90s" and str(parse_duration("7")) == "7"
    assert parse_duration("1.5H") == Duration(1.5, "h")
    assert parse_duration(Duration(2, "d")) is not None and parse_duration(Duration(2, "d")) == Duration(2, "d")


# ---- the consumers agree ---------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["90s", "30min", "6h", "2d", "1w", "1500ms"])
def test_consumers_agree_on_a_duration(text):
    from smerge.datasets.archive.aggregate import _ticks_per_window, parse_aggregate
    from smerge.counting.itemcount import duration_ticks
    from smerge.merge.keys import key_eps
    from smerge.merge.wjoin_params import resolve_bound

    ns = int(np.timedelta64(int(parse_duration(text).nanoseconds()), "ns").astype(np.int64))
    assert resolve_bound(parse_duration(text), "datetime@ns") == ns  # wjoin, int64 ns
    assert duration_ticks(text, pa.timestamp("ms"), "--every") == ns // 10**6  # count, in the column's ticks
    assert _ticks_per_window(parse_aggregate(f"{text}:count"), pa.timestamp("us")) == ns // 10**3  # archive
    schema = pa.schema([("t", pa.timestamp("s"))])
    assert key_eps({"t": text}, ["t"], schema) == {"t": ns / 1e3}  # --eps, microseconds on the key matrix


def test_count_takes_months_on_a_360_day_time_only():
    from smerge.counting.itemcount import duration_ticks

    f360 = pa.field("t", pa.int64(), metadata={b"smerge.cf_units": b"days since 2000-01-01", b"calendar": b"360_day",
                                               b"smerge.cf_unit_us": str(86400 * 10**6).encode()})
    fnoleap = pa.field("t", pa.int64(), metadata={**f360.metadata, b"calendar": b"noleap"})
    assert duration_ticks("1mo", f360, "--every") == 30 * 86400 * 10**6  # microseconds on the 1970 base
    with pytest.raises(UsageError, match="no fixed length in the noleap calendar"):
        duration_ticks("1mo", fnoleap, "--every")


# ---- eps ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, want", [
    ("0", 0.0), ("0.01", 0.01), (" 2 ", 2.0), ("1h", "1h"), ("lat=0.01,lon=0.02", {"lat": 0.01, "lon": 0.02}),
    ("lat=0.01, time=30min", {"lat": 0.01, "time": "30min"}), ("time=1mo", {"time": "1mo"}),
])
def test_parse_eps(text, want):
    assert V.parse_eps(text) == want


@pytest.mark.parametrize("text, words", [
    ("fast", "eps 'fast' is not a number or a duration"), ("lat", "is not a number or a duration"),
    ("=1", "is not KEY=VALUE"), ("lat=1,2", "is not KEY=VALUE"), ("time=1h,time=2h", "names key 'time' twice"),
    ("time=1M", "minutes or months"), ("time=1e400h", "too large"), ("x=1parsec", "is not a duration"),
    ("lat=abc", "eps value for 'lat': 'abc' is not a number"),
])
def test_parse_eps_refusals(text, words):
    with pytest.raises(UsageError, match=re.escape(words)):
        V.parse_eps(text)


def test_eps_per_key_and_check_once():
    keys = ("lat", "lon", "time")
    assert V.eps_per_key(0.5, keys) == (0.5, 0.5, 0.5)
    assert V.eps_per_key({"lat": 1, "time": 2.5}, keys) == (1.0, 0.0, 2.5)
    assert V.eps_per_key([1, 2, 3], keys) == (1.0, 2.0, 3.0)
    with pytest.raises(UsageError, match="^eps names zz, which are not merge keys"):
        V.eps_per_key({"zz": 1}, keys)
    with pytest.raises(UsageError, match="^eps has 2 values but there are 3 keys"):
        V.eps_per_key([1, 2], keys)
    # spreading does not judge the values: the parameters do, once
    assert V.eps_per_key(-1, keys) == (-1.0,) * 3
    for bad in (-1.0, float("nan"), float("inf"), -float("inf")):
        with pytest.raises(UsageError, match="a tolerance must be a finite number >= 0"):
            V.check_eps((0.0, bad, 0.0), keys)
    V.check_eps((0.0, 0.0, 1e300), keys)
    with pytest.raises(UsageError, match="2 tolerances for 3 keys"):
        V.check_eps((0.0, 0.0), keys)
    from smerge.merge import CGMParams, MergeKeys, resolve_eps

    k = MergeKeys(("a",), ("a",))
    with pytest.raises(UsageError, match="^eps for key 'a' is -1.0"):
        CGMParams(keys=k, eps=resolve_eps(-1, ("a",)))


# ---- window sizes, counts, fractions ----------------------------------------------------------------

@pytest.mark.parametrize("n, ok", [(1, True), (5000, True), (10**9, True), (0, False), (-1, False),
                                   (10**9 + 1, False), (99999999999999, False), (True, False), (1.0, False),
                                   (float("nan"), False), ("5000", False)])
def test_window_size(n, ok):
    if ok:
        assert V.check_window_size(n) == n
    else:
        with pytest.raises(UsageError, match="the window size N must be an integer from 1 to 10\\^9"):
            V.check_window_size(n)


def test_count_bounds():
    assert V.check_count(10, "--delta-windows", 1, 10**9) == 10
    with pytest.raises(UsageError, match=re.escape("--delta-windows is 0; use an integer from 1 to 10^9")):
        V.check_count(0, "--delta-windows", 1, 10**9)
    with pytest.raises(UsageError, match="from 1 to 1,000"):
        V.check_count(1001, "n", 1, 1000)


@pytest.mark.parametrize("f, zero, ok", [
    (0.5, False, True), (1, False, True), (1.0, True, True), (0, True, True), (0.0, False, False),
    (-0.0, True, True), (1e-300, False, True), (1.0000001, False, False), (-0.1, True, False),
    (float("nan"), True, False), (float("inf"), True, False), (True, True, False), ("0.5", True, False),
])
def test_fractions(f, zero, ok):
    if ok:
        assert V.check_fraction(f, "--delta", zero=zero) == float(f)
    else:
        interval = "[0, 1]" if zero else "(0, 1]"
        with pytest.raises(UsageError, match=re.escape(f"--delta is {f!r}; it must be in {interval}")):
            V.check_fraction(f, "--delta", zero=zero)


def test_parse_fraction():
    assert V.parse_fraction(" 0.25 ", "--sample") == 0.25
    with pytest.raises(UsageError, match=re.escape("--sample is 'abc'; give a fraction in (0, 1], e.g. 0.25")):
        V.parse_fraction("abc", "--sample")
    with pytest.raises(UsageError, match=re.escape("--sample is nan; it must be in (0, 1] (1 reads every record)")):
        V.parse_fraction("nan", "--sample", note="(1 reads every record)")


# ---- one table, one default, light import ------------------------------------------------------------

def test_one_unit_table_in_the_sources():
    # No other module carries a table of duration units (the old copies had "min": 60 ...).
    table = re.compile(r"""["']min["']\s*:\s*60""")
    hits = [str(p.relative_to(ROOT)) for d in ("smerge", "cli", "merge", "index", "transport", "datasets", "jobs",
                                                "spark") for p in sorted((ROOT / d).rglob("*.py"))
            if table.search(p.read_text())]
    assert hits == ["merge/values.py"]


def test_default_window_size_is_the_option_default():
    from smerge.cli.cgm import cgm
    from smerge.cli.rtm import rtm
    from smerge.jobs.cgm import CGMJob
    from smerge.merge.params import DEFAULT_WINDOW_SIZE

    assert DEFAULT_WINDOW_SIZE == 5000
    for f in (cgm, rtm):
        assert inspect.signature(f).parameters["window"].default == DEFAULT_WINDOW_SIZE
    assert CGMJob.__dataclass_fields__["window_size"].default == DEFAULT_WINDOW_SIZE


def test_values_and_params_import_without_numpy_or_pyarrow():
    code = ("import sys, smerge.merge.values, smerge.merge.params\n"
            "print(','.join(m for m in ('numpy', 'pyarrow', 'smerge.merge.cgm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


def test_nanoseconds_is_finite_for_every_accepted_text():
    for text, _ in UNITS:
        assert math.isfinite(parse_duration(text).nanoseconds())
