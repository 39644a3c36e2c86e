"""DECIMAL key columns (DuckDB writes `SELECT 45.25 AS lat` as decimal(4, 2); pyarrow and Spark
write them too) are numbers: compared as float64, they pair exactly as the same values stored
as double do, through cgm and rtm, against decimal or double on the other side; NULL decimals
are NaN keys (exit 2 by default)."""

from __future__ import annotations

import decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main
from smerge.merge.keys import column_f64, key_kind


def test_decimal_columns_are_numbers_as_float64():
    col = pa.array([decimal.Decimal("45.25"), decimal.Decimal("-0.10"), None], pa.decimal128(4, 2))
    assert key_kind(pa.field("lat", col.type)).group == "number"
    v = column_f64(col)
    assert v[:2].tolist() == [45.25, -0.1] and np.isnan(v[2])


@pytest.mark.parametrize("cmd", ["cgm", "rtm"])
@pytest.mark.parametrize("b_decimal", [False, True])
def test_decimal_keys_pair_as_their_doubles(tmp_path, cmd, b_decimal):
    rng = np.random.default_rng(7)
    lat = np.round(np.sort(rng.uniform(-80, 80, 300)), 2)
    blat = np.round(lat + rng.choice([-0.03, 0.0, 0.02, 0.5], lat.size), 2)
    dec = lambda v: pa.array([decimal.Decimal(f"{x:.2f}") for x in v], pa.decimal128(6, 2))  # noqa: E731
    pq.write_table(pa.table({"lat": dec(lat), "x": np.arange(lat.size)}), tmp_path / "a_dec.parquet")
    pq.write_table(pa.table({"lat": lat, "x": np.arange(lat.size)}), tmp_path / "a_dbl.parquet")
    pq.write_table(pa.table({"lat": dec(blat) if b_decimal else blat, "y": np.arange(lat.size)}), tmp_path / "b.parquet")
    outs = {}
    for a in ("a_dec", "a_dbl"):
        out = tmp_path / f"{a}.out.parquet"
        assert main([cmd, str(tmp_path / f"{a}.parquet"), str(tmp_path / "b.parquet"), "--keys", "lat",
                     "--eps", "0.025", "--local", "-o", str(out)]) == 0
        t = pq.read_table(out)
        outs[a] = sorted(zip(t["x"].to_pylist(), t["y"].to_pylist()))
    assert outs["a_dec"] == outs["a_dbl"] and 0 < len(outs["a_dec"]) < lat.size


def test_null_decimal_key_is_exit_2(tmp_path, capsys):
    col = pa.array([decimal.Decimal("1.00"), None], pa.decimal128(4, 2))
    pq.write_table(pa.table({"k": col}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": [1.0, 2.0]}), tmp_path / "b.parquet")
    assert main(["cgm", str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "--keys", "k", "--local",
                 "-o", str(tmp_path / "o.parquet")]) == 2
    assert "k" in capsys.readouterr().err
