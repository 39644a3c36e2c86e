"""A tabular input with two columns of one name (CSV headers allow it, so do Arrow and Parquet
files written by pyarrow or DuckDB): which one is meant would be a guess, so a run that reads
such a name is exit 2 naming the file, the name and the columns; a run that reads neither of
them goes ahead."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main


def _dup_table(names):
    return pa.Table.from_arrays([pa.array([0.0, 1.0, 2.0]), pa.array([4.0, 3.0, 1.0]), pa.array([1.0, 1.0, 2.0])],
                                names=names)


def _write(tmp_path, fmt, names):
    p = tmp_path / f"dup.{fmt}"
    t = _dup_table(names)
    if fmt == "csv":
        p.write_text(",".join(names) + "\n" + "\n".join(",".join(str(v) for v in row)
                                                         for row in zip(*(c.to_pylist() for c in t.columns))) + "\n")
    elif fmt == "arrow":
        feather.write_feather(t, p, compression="uncompressed")
    else:
        pq.write_table(t, p)
    return str(p)


@pytest.mark.parametrize("fmt", ["csv", "arrow", "parquet"])
@pytest.mark.parametrize("names, dup, at", [(["k", "x", "x"], "x", "2, 3"), (["k", "k", "x"], "k", "1, 2")])
@pytest.mark.parametrize("cmd", ["cgm", "rtm", "wjoin"])
def test_a_name_two_columns_share_is_exit_2(tmp_path, capsys, fmt, names, dup, at, cmd):
    dup_path = _write(tmp_path, fmt, names)
    other = tmp_path / "b.parquet"
    pq.write_table(pa.table({"k": [0.0, 1.0, 2.0], "y": [1.0, 2.0, 3.0]}), other)
    out = tmp_path / "o.parquet"
    a, b = (str(other), dup_path) if cmd == "rtm" else (dup_path, str(other))
    opts = ["--time", "k", "--window", "0"] if cmd == "wjoin" else ["--keys", "k"]
    assert main([cmd, a, b, *opts, "--local", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"smerge: error: {dup_path}: 2 columns are named {dup!r} (columns {at}); rename all but one in the file"]
    assert not out.exists()


def test_columns_not_read_may_share_a_name(tmp_path):
    dup_path = _write(tmp_path, "parquet", ["k", "x", "x"])
    other = tmp_path / "b.parquet"
    pq.write_table(pa.table({"k": [0.0, 1.0, 2.0], "y": [1.0, 2.0, 3.0]}), other)
    out = tmp_path / "o.parquet"
    assert main(["cgm", dup_path, str(other), "--keys", "k", "--vars-a", "k", "--local", "-o", str(out)]) == 0
    assert pq.read_table(out).column_names == ["k", "k_b", "y"]
