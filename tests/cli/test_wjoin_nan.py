"""NaN (not NULL) in a floating-point column a W-join's predicate reads: SQL (DuckDB, the oracle)
has NaN equal to NaN and above every number, the W-join's probes compare as IEEE; so such a
NaN is exit 2 naming the stream, column and row, for --on and --where alike. NULLs join as in
SQL (DuckDB's tuples), and a NaN in a column the predicate does not read is only carried."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wjoin_oracle import oracle_tuples

from smerge.cli.main import main


def _inputs(tmp_path, p1, p2):
    paths, tables = [], []
    for i, p in enumerate((p1, p2)):
        t = pa.table({"t": np.arange(len(p), dtype=np.int64), "p": pa.array(p, pa.float64()),
                      "q": np.full(len(p), np.nan)})
        tables.append(t)
        paths.append(str(tmp_path / f"s{i + 1}.parquet"))
        pq.write_table(t, paths[-1])
    return paths, tables


@pytest.mark.parametrize("pred", [["--where", "S1.p > S2.p"], ["--where", "S1.p + 1 = S2.p"], ["--on", "p"],
                                  ["--where", "not (S1.p < S2.p) and S1.t = S2.t"]])
def test_nan_in_a_predicate_column_is_exit_2(tmp_path, capsys, pred):
    paths, _ = _inputs(tmp_path, [1.0, 2.0, 3.0], [1.0, float("nan"), 3.0])
    out = tmp_path / "o.parquet"
    assert main(["wjoin", *paths, "--time", "t", "--window", "5", *pred, "--local", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"smerge: error: {paths[1]}: column 'p' is NaN at row 1; the join's predicate follows SQL, where NaN equals "
                   "NaN and sorts above every number, which this W-join does not do: write missing values as NULL "
                   "(pandas' to_parquet and pyarrow.Table.from_pandas do) or leave those rows out"]
    assert not out.exists()


def test_nulls_join_as_sql_and_nan_outside_the_predicate_is_carried(tmp_path):
    paths, tables = _inputs(tmp_path, [1.0, None, 3.0, 0.5], [1.0, 2.0, None, 3.0])
    out = tmp_path / "o.parquet"
    assert main(["wjoin", *paths, "--time", "t", "--window", "5", "--where", "S1.p < S2.p", "--with-ids", "--local",
                 "-o", str(out)]) == 0
    res = pq.read_table(out)
    got = sorted(zip(res["S1_row"].to_pylist(), res["S2_row"].to_pylist()))
    assert got == oracle_tuples(tables, "t", {(0, 1): 5}, "s1.p < s2.p") and len(got) == 5
    assert np.isnan(res["S1_q"].to_numpy()).all()
