"""The Spark Python data source for netCDF: slabs of the outer dimension as Arrow batches."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from smerge.datasets import open_input
from smerge.spark.netcdf import register

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("parts", [1, 3, 64])
def test_reads_exactly_what_smerge_reads_with_row_ids(spark, ncar_dir, parts):
    register(spark)
    path = os.path.join(ncar_dir, "Pstorm.cdf")
    df = spark.read.format("smerge_netcdf").option("path", path).option("numPartitions", parts).load()
    src = open_input(path)
    assert df.columns == [*src.schema.names, "_row"]
    got = df.toArrow().sort_by("_row")
    want = pa.Table.from_batches(list(src.batches()), schema=src.schema)
    assert got.num_rows == want.num_rows == 76032
    assert got.column("_row").to_pylist() == list(range(76032))
    for name in src.schema.names:
        assert got.column(name).combine_chunks().equals(want.column(name).combine_chunks()), name
    # one Spark partition per slab range: every partition holds whole time steps, in order
    per = df.groupBy(F.spark_partition_id().alias("p")).agg(F.min("_row").alias("lo"), F.max("_row").alias("hi"),
                                                            F.count("*").alias("n")).collect()
    assert len(per) == parts
    assert all(r.lo % 1188 == 0 and r.n % 1188 == 0 and r.hi - r.lo + 1 == r.n for r in per)


def test_options_keys_and_variables(spark, ncar_dir):
    register(spark)
    path = os.path.join(ncar_dir, "Tstorm.cdf")
    df = (spark.read.format("smerge_netcdf").option("path", path).option("keys", "timestep,lat,lon")
          .option("variables", "t").load())
    assert df.columns == ["timestep", "lat", "lon", "t", "_row"]
    assert df.count() == 76032
