"""Band conjuncts checked inside the compiled probes (float64 columns, optionally plus or minus a
literal): the same tuples as the predicate evaluated by Arrow after the probe, and as DuckDB."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from wjoin_oracle import oracle_tuples

from smerge.errors import InputError
from smerge.merge.wjoin import wjoin
from smerge.merge.wjoin_params import WJoinParams
from smerge.merge.wjoin_plan import BandTerm, make_plan


def _run(tables, params, batch):
    out = list(wjoin([t.to_batches(max_chunksize=batch) for t in tables], [t.schema for t in tables], params))
    if not out:
        return []
    tab = pa.Table.from_batches(out)
    return list(zip(*(tab[f"S{i + 1}_row"].to_pylist() for i in range(len(tables)))))


def _table(rng, n, nan: bool):
    t = np.sort(rng.integers(0, 30, n))
    x = rng.normal(0, 3, n).round(1)
    if nan:
        x[rng.random(n) < 0.15] = np.nan
    mask = rng.random(n) < 0.15
    return pa.table({"t": t, "k": rng.integers(0, 3, n), "x": pa.array(x, mask=mask),
                     "i": rng.integers(-5, 5, n)})


SIDES = ["S{a}.x", "S{a}.x + 1", "S{a}.x - 2.5", "3 + S{a}.x"]


@st.composite
def band_case(draw):
    n = draw(st.integers(2, 3))
    seed = draw(st.integers(0, 2**31))
    nan = draw(st.booleans())
    rng = np.random.default_rng(seed)
    tables = [_table(rng, draw(st.integers(0, 25)), nan) for _ in range(n)]
    terms = []
    for _ in range(draw(st.integers(1, 2))):
        a, b = draw(st.lists(st.integers(1, n), min_size=2, max_size=2, unique=True))
        op = draw(st.sampled_from(["<", "<=", ">", ">="]))
        terms.append(f"{draw(st.sampled_from(SIDES)).format(a=a)} {op} {draw(st.sampled_from(SIDES)).format(a=b)}")
    if draw(st.booleans()):
        terms.append(" and ".join(f"S1.k = S{s}.k" for s in range(2, n + 1)))  # hash probes
    method = draw(st.sampled_from(["auto", "nested-loop"]))
    return tables, " and ".join(terms), method, draw(st.integers(1, 7)), draw(st.integers(1, 6))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(band_case())
def test_band_in_the_probe_equals_the_predicate_after_it(case):
    tables, where, method, window, batch = case
    n = len(tables)
    p = WJoinParams(n, ("t",), window=window, where=where, with_ids=True, method=method)
    plan = make_plan([t.schema for t in tables], p)
    assert any(plan.level_band[i][lvl] for i in range(n) for lvl in range(n))  # the kernel path is taken
    # "(c) or false" hides every conjunct from the band planner: Arrow evaluates it after the probe
    hidden = " and ".join(f"(({c}) or false)" for c in where.split(" and "))
    q = WJoinParams(n, ("t",), window=window, where=hidden, with_ids=True, method=method)
    assert not any(make_plan([t.schema for t in tables], q).level_band[i][lvl] for i in range(n) for lvl in range(n))
    nan_read = [i for i, t in enumerate(tables)
                if "x" in plan.float_cols[i] and pc.any(pc.is_nan(t["x"]).fill_null(False)).as_py()]
    if nan_read:
        # DuckDB orders NaN above every number and equal to itself, the probes compare as IEEE:
        # a NaN the predicate reads is refused, on both paths
        for params in (p, q):
            with pytest.raises(InputError, match=r"S\d: column 'x' is NaN at row \d+; the join's predicate follows SQL"):
                _run(tables, params, batch)
        return
    got = _run(tables, p, batch)
    assert got == _run(tables, q, batch)
    windows = {(a, b): window for a in range(n) for b in range(a + 1, n)}
    sql = where.replace(" and ", " AND ").replace("S", "s")
    assert sorted(got) == oracle_tuples(tables, "t", windows, sql)


def test_band_terms_only_for_float_columns_and_literal_offsets():
    t = pa.table({"t": [0], "x": [1.0], "i": [1], "k": [1]})
    plan = make_plan([t.schema, t.schema], WJoinParams(2, ("t",), window=1, where=(
        "S1.x > S2.x + 8 and S1.i > S2.i and S1.x * 2 > S2.x and S1.x > S2.i and S1.x > 1")))
    bands = [b for b in plan.level_band[0][1]] + [b for b in plan.level_band[1][1]]
    assert bands == [BandTerm("<", (1, "x", ("+", 8.0)), (0, "x", None)),
                     BandTerm(">", (0, "x", None), (1, "x", ("+", 8.0)))]
    # integers, products, mixed types and one-stream conjuncts stay with Arrow
    assert [len([c for lv in plan.level_conj[i] for c in lv]) for i in range(2)] == [4, 4]
