"""A key missing from a file pandas wrote with its (unnamed) index: the one-line error says which
column is that index and how to name it."""

from __future__ import annotations

import pandas as pd
import pytest

from smerge.cli.main import main


@pytest.mark.parametrize("ext, shown", [("parquet", "'__index_level_0__'"), ("csv", "''")])
def test_unnamed_pandas_index_is_named_in_the_error(tmp_path, capsys, ext, shown):
    df = pd.DataFrame({"T": [1.0, 2.0]}, index=pd.date_range("2000-01-01", periods=2, freq="h"))
    a = tmp_path / f"a.{ext}"
    df.to_parquet(a) if ext == "parquet" else df.to_csv(a)
    pd.DataFrame({"time": pd.date_range("2000-01-01", periods=2, freq="h"), "U": [1.0, 2.0]}).to_parquet(
        tmp_path / "b.parquet")
    assert main(["cgm", str(a), str(tmp_path / "b.parquet"), "--keys", "time", "--local",
                 "-o", str(tmp_path / "o.parquet")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no key 'time'" in err[0], err
    assert f"({shown} is the unnamed index pandas wrote: name it before writing, e.g. df.index.name = 'time'" in err[0]
