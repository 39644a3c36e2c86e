"""`--nan-keys unmatched` counts B's NaN-key records in `b_nan_keys` for rtm as for cgm (rtm
reported 0 while `b_unmatched` and the unmatched B file held them)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main


@pytest.mark.parametrize("cmd", ["cgm", "rtm"])
def test_b_nan_keys_counted(tmp_path, capsys, cmd):
    k = np.arange(10.0)
    pq.write_table(pa.table({"k": k, "x": np.ones(10)}), tmp_path / "a.parquet")
    kb = k.copy()
    kb[[2, 5, 7]] = np.nan
    pq.write_table(pa.table({"k": kb, "y": np.ones(10)}), tmp_path / "b.parquet")
    assert main([cmd, str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet"), "--local", "--keys", "k",
                 "--nan-keys", "unmatched", "--unmatched", str(tmp_path / "u"), "-o", str(tmp_path / "o.parquet"),
                 "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["matched"], s["b_unmatched"], s["a_nan_keys"], s["b_nan_keys"]) == (7, 3, 0, 3)
    assert np.isnan(pq.read_table(tmp_path / "u.b.parquet")["k"].to_numpy()).sum() == 3
