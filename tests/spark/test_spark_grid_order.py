"""On Spark as in-process: a B stored in any other dimension order (or with a reversed coordinate,
or auxiliary coordinates) is read by the tasks in A's key order and pairs every place, with time
slices larger than the window, on 1 and 3 partitions (the shared session, through the pipeline
every command takes)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "helpers"))
from grid_files import permutations, write_grid  # noqa: E402

from smerge.jobs.cgm import CGMJob  # noqa: E402
from smerge.jobs.pipeline import RunOptions, execute  # noqa: E402
from smerge.jobs.route import Route  # noqa: E402

pytestmark = pytest.mark.slow
SPARK = Route(True, "local[2]", "spark (--master local[2])")
DIMS4 = ("time", "level", "lat", "lon")


def job(a, b, out):
    # N = 50 records, K = 10: one time slice (720 records; 288 in 4-D) is many windows
    return CGMJob(a=a, b=b, output=str(out), with_ids=True, window_size=50, least_increment_a=10,
                  least_increment_b=10)


def check(spark, a, b, tmp_path, cells):
    local = execute(job(a, b, tmp_path / "l.parquet"), RunOptions(local=True))
    assert local["matched"] == local["a_records"] == cells and local["b_order"] == "A's key order"
    ref = pq.read_table(tmp_path / "l.parquet").sort_by([("a_row", "ascending")])
    assert np.array_equal(np.asarray(ref["T"]), np.asarray(ref["T_b"]))
    for parts in (1, 3):
        out = tmp_path / f"s{parts}.parquet"
        s = execute(job(a, b, out), RunOptions(partitions=parts, spark=spark), route=SPARK)
        assert s["execution"] == "spark" and s["matched"] == local["matched"] and s["b_order"] == "A's key order"
        t = pq.read_table(out).sort_by([("a_row", "ascending")])
        assert t.select(["a_row", "b_row", "T_b"]).equals(ref.select(["a_row", "b_row", "T_b"]))


@pytest.mark.parametrize("order", [o for o in permutations(("time", "lat", "lon")) if o != ("time", "lat", "lon")])
def test_spark_reads_every_permutation_of_a_3d_b_in_a_order(order, tmp_path, spark):
    a = write_grid(tmp_path / "a.nc", ("time", "lat", "lon"))
    b = write_grid(tmp_path / "b.nc", order, flip=("lat",) if order[0] == "lat" else ())
    check(spark, a, b, tmp_path, 4 * 24 * 30)


def test_spark_reads_a_4d_b_and_auxiliary_coordinates_in_a_order(tmp_path, spark):
    names = {"lat": "latitude", "lon": "longitude"}
    sizes = {"time": 3, "lat": 8, "lon": 12}
    a = write_grid(tmp_path / "a.nc", DIMS4, dims=DIMS4, sizes=sizes, dim_names=names)
    b = write_grid(tmp_path / "b.nc", ("lon", "level", "time", "lat"), dims=DIMS4, sizes=sizes, dim_names=names,
                   fmt="NETCDF3_CLASSIC")
    check(spark, a, b, tmp_path, 3 * 3 * 8 * 12)
