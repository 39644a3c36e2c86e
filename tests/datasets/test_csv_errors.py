"""A CSV input that goes bad far into the file (after the rows its column types are inferred from):
exit 2 in one line naming the file and what to fix — a value that does not fit its column's type,
or a row with too few columns — with nothing written."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.cli.main import main


@pytest.mark.parametrize("bad, hint", [
    ("x,abc", "every value must fit its column's type, which the file's first rows set"),
    ("7", "every row needs every column"),
])
def test_a_bad_row_far_into_a_csv_is_one_line(tmp_path, capsys, bad, hint):
    a = tmp_path / "a.csv"
    a.write_text("k,x\n" + "".join(f"{i},1.5\n" for i in range(200_000)) + bad + "\n")
    pq.write_table(pa.table({"k": [1.0, 2.0]}), tmp_path / "b.parquet")
    out = tmp_path / "o.parquet"
    assert main(["cgm", str(a), str(tmp_path / "b.parquet"), "--keys", "k", "--local", "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"smerge: error: {a}: cannot read CSV data (") and err[0].endswith(
        f"; fix the file ({hint})"), err
    assert not out.exists()
