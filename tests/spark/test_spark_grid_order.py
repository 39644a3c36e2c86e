"""On Spark as in-process: a B stored in another dimension order (or with a reversed coordinate,
or auxiliary coordinates) is read by the tasks in A's key order and pairs every place."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "helpers"))
from grid_files import write_grid  # noqa: E402

from smerge.cli.main import main  # noqa: E402

pytestmark = pytest.mark.slow
WINDOW = ("--window", "50", "--increment", "10")


def run(capsys, *args):
    rc = main([str(a) for a in args])
    cap = capsys.readouterr()
    assert rc == 0, cap.err
    return json.loads(cap.out)


@pytest.mark.parametrize("order,flip,names", [
    (("lat", "time", "lon"), ("lat",), None),
    (("lon", "lat", "time"), (), {"lat": "latitude", "lon": "longitude"}),
])
def test_spark_reads_b_in_a_order(order, flip, names, tmp_path, capsys, spark):
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"), dim_names=names)
    b = write_grid(tmp_path / "b.nc", order, flip=flip, dim_names=names)
    local = run(capsys, "cgm", a, b, "--local", "-o", tmp_path / "l.parquet", "--json", "--with-ids", *WINDOW)
    assert local["matched"] == local["a_records"] == 4 * 24 * 30
    for parts in (1, 3):
        out = tmp_path / f"s{parts}.parquet"
        s = run(capsys, "cgm", a, b, "--master", "local[2]", "--partitions", parts, "-o", out, "--json",
                "--with-ids", *WINDOW)
        assert s["execution"] == "spark" and s["matched"] == local["matched"]
        t = pq.read_table(out).sort_by([("a_row", "ascending")])
        ref = pq.read_table(tmp_path / "l.parquet").sort_by([("a_row", "ascending")])
        assert np.array_equal(np.asarray(t["T"]), np.asarray(t["T_b"]))
        assert t.select(["a_row", "b_row", "T_b"]).equals(ref.select(["a_row", "b_row", "T_b"]))
