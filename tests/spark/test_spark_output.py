"""Output written by the executors: Parquet parts joined byte-for-byte, Parquet dataset folders,
planning from metadata, NaN keys reported with their global row."""

from __future__ import annotations

import os

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from spark_data import partially_sorted, write_stream
from typer.testing import CliRunner

from smerge.cli.main import app
from smerge.datasets.writers import parquet_options
from smerge.errors import InputError, OutputError
from smerge.jobs import CGMJob, prepare, run_local
from smerge.spark.cgm.runner import run_cgm_spark
from smerge.spark.parquet import PART_WRITE_OPTIONS, ParquetConcatError, _Reader, _Writer, concat_parquet

SCHEMA = pa.schema([("x", pa.float64()), ("n", pa.int64()), ("s", pa.string()), ("f", pa.float32())])


def part(path, n, seed, *, rows_per_group=700, **options):
    rng = np.random.default_rng(seed)
    t = pa.table({"x": rng.random(n), "n": rng.integers(0, 4, n),
                  "s": pa.array([f"s{v}" for v in rng.integers(0, 3, n)]),
                  "f": pa.array(rng.random(n).astype("f4"), mask=rng.random(n) < 0.2)}, schema=SCHEMA)
    w = pq.ParquetWriter(path, SCHEMA, **{**parquet_options(SCHEMA), **PART_WRITE_OPTIONS, **options})
    for b in t.to_batches(max_chunksize=rows_per_group):
        w.write_batch(b)
    w.close()
    return str(path), t


def test_thrift_footer_round_trips_byte_for_byte(tmp_path):
    path, _ = part(tmp_path / "p.parquet", 2000, 1)
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[-8:-4], "little")
    footer = raw[-8 - n:-8]
    w = _Writer()
    w.struct(_Reader(footer).struct())
    assert bytes(w.out) == footer


def test_concat_parquet_equals_concatenated_tables(tmp_path):
    parts = [part(tmp_path / f"p{i}.parquet", n, i) for i, n in enumerate([1500, 0, 4321, 1])]
    out = str(tmp_path / "all.parquet")
    assert concat_parquet([p for p, _ in parts] + [str(tmp_path / "missing.parquet")], out, SCHEMA) == 5822
    want = pa.concat_tables([t for _, t in parts])
    got = pq.read_table(out)
    assert got.equals(want)
    meta = pq.ParquetFile(out).metadata
    assert meta.num_rows == 5822
    assert meta.num_row_groups == sum(pq.ParquetFile(p).metadata.num_row_groups for p, _ in parts) == 3 + 7 + 1
    # row-group statistics and filters still work, and another reader agrees
    assert pq.read_table(out, filters=[("n", "=", 2)]).num_rows == int((want["n"].to_numpy() == 2).sum())
    total = duckdb.sql(f"select count(*), sum(x) from '{out}'").fetchall()[0]
    assert total[0] == 5822 and total[1] == pytest.approx(float(want["x"].to_numpy().sum()))
    # the first part moved and extended in place gives the same file
    moved = str(tmp_path / "moved.parquet")
    assert concat_parquet([p for p, _ in parts], moved, SCHEMA, take_first=True) == 5822
    assert not os.path.exists(parts[0][0]) and pq.read_table(moved).equals(want)
    # no parts: an empty file with the schema
    empty = str(tmp_path / "empty.parquet")
    assert concat_parquet([], empty, SCHEMA) == 0 and pq.read_table(empty).schema.equals(SCHEMA)


def test_concat_refuses_page_indexes(tmp_path):
    a, _ = part(tmp_path / "a.parquet", 100, 1, write_page_index=True)
    with pytest.raises(ParquetConcatError, match="page index"):
        concat_parquet([a], str(tmp_path / "o.parquet"), SCHEMA)


def storms(ncar_dir):
    return os.path.join(ncar_dir, "Pstorm.cdf"), os.path.join(ncar_dir, "Tstorm.cdf")


def test_gridded_inputs_are_planned_from_metadata_and_dataset_output(spark, tmp_path, ncar_dir):
    a, b = storms(ncar_dir)
    base = dict(a=a, b=b, with_ids=True, eps=0.01, window_size=2000, least_increment_a=500, least_increment_b=500)
    run_local(prepare(CGMJob(output=str(tmp_path / "l.parquet"), **base)))
    want = pq.read_table(tmp_path / "l.parquet")
    out = str(tmp_path / "ds") + "/"
    st = run_cgm_spark(prepare(CGMJob(output=out, **base)), partitions=3, spark=spark)
    assert st["plan"] == {"a": "metadata", "b": "metadata"} and st["part_format"] == "parquet"
    files = sorted(os.listdir(tmp_path / "ds"))
    assert files == [".smerge-dataset", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
    files = files[1:]
    got = pa.concat_tables([pq.read_table(tmp_path / "ds" / f) for f in files])
    assert got.equals(want)
    # no staging folders left beside the output
    assert sorted(os.listdir(tmp_path)) == ["ds", "l.parquet"]
    # an existing dataset needs --overwrite; with it the folder is replaced
    with pytest.raises(OutputError, match="already exists"):
        prepare(CGMJob(output=out, **base))
    (tmp_path / "ds" / "stale.parquet").write_bytes(b"x")  # not smerge's: the folder is kept
    with pytest.raises(OutputError, match="holds 'stale.parquet', which smerge did not write"):
        prepare(CGMJob(output=out, overwrite=True, **base))
    (tmp_path / "ds" / "stale.parquet").unlink()  # replaced whole: the old parts 1 and 2 go too
    st = run_cgm_spark(prepare(CGMJob(output=str(tmp_path / "ds"), overwrite=True, format="parquet-dataset",
                                      **base)), partitions=1, spark=spark)
    assert st["plan"] == {"a": "none", "b": "none"}
    assert sorted(os.listdir(tmp_path / "ds")) == [".smerge-dataset", "part-00000.parquet"]
    assert pq.read_table(tmp_path / "ds").equals(want)


def test_dataset_with_seam_pairs_and_unmatched_files(spark, tmp_path):
    rng = np.random.default_rng(3)
    n = 2000
    a = write_stream(tmp_path / "a.parquet", partially_sorted(n, rng), rng.integers(0, 3, n), seed=1)
    b = write_stream(tmp_path / "b.parquet", partially_sorted(n, rng), rng.integers(0, 3, n), seed=2)
    kw = dict(a=a, b=b, keys_a=("k1", "k2"), with_ids=True, eps=0.25, window_size=60, least_increment_a=10,
              least_increment_b=10, batch_rows=128, overwrite=True)
    one = run_cgm_spark(prepare(CGMJob(output=str(tmp_path / "one.parquet"), unmatched=str(tmp_path / "u1"), **kw)),
                        partitions=4, spark=spark)
    ds = run_cgm_spark(prepare(CGMJob(output=str(tmp_path / "ds/"), unmatched=str(tmp_path / "u2"), **kw)),
                       partitions=4, spark=spark)
    assert one["plan"] == {"a": "scan", "b": "scan"} and one["seam_pairs"] > 0
    files = sorted(os.listdir(tmp_path / "ds"))[1:]  # after the .smerge-dataset marker
    # P task parts plus the driver's part with the kept seam pairs, in order = the single file
    assert files == [f"part-{i:05d}.parquet" for i in range(5)]
    joined = pa.concat_tables([pq.read_table(tmp_path / "ds" / f) for f in files])
    assert joined.equals(pq.read_table(tmp_path / "one.parquet"))
    for side in ("a", "b"):
        assert pq.read_table(tmp_path / f"u1.{side}.parquet").equals(pq.read_table(tmp_path / f"u2.{side}.parquet"))
    assert ds["matched"] == one["matched"] == joined.num_rows


def test_nan_in_a_later_key_reports_the_global_row(spark, tmp_path):
    k1 = np.arange(40, dtype=np.float64)
    k2 = np.zeros(40)
    k2[33] = np.nan  # owned by the second partition; its local row there is not 33
    a = write_stream(tmp_path / "a.parquet", k1, k2)
    b = write_stream(tmp_path / "b.parquet", k1, np.zeros(40))
    job = CGMJob(a=a, b=b, output=str(tmp_path / "o/"), keys_a=("k1", "k2"), batch_rows=8)
    with pytest.raises(InputError, match="'k2' is NaN or missing at row 33"):
        run_cgm_spark(prepare(job), partitions=2, spark=spark)
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet"]


@pytest.mark.slow
def test_cli_local_writes_a_dataset_folder(tmp_path, ncar_dir):
    a, b = storms(ncar_dir)
    r = CliRunner().invoke(app, ["cgm", a, b, "--eps", "0.01", "--local", "-o", str(tmp_path / "pt")])
    assert r.exit_code == 0, r.output
    assert sorted(os.listdir(tmp_path / "pt")) == [".smerge-dataset", "part-00000.parquet"]
    assert pq.read_table(tmp_path / "pt").num_rows == 76032
    r = CliRunner().invoke(app, ["cgm", a, b, "--local", "-o", str(tmp_path / "pt")])
    assert r.exit_code == 2 and "--overwrite" in r.output


def test_default_partitions_keep_a_million_records_each():
    from types import SimpleNamespace

    from smerge.spark.cgm.plan import default_partitions

    def prep(na, nb):
        return SimpleNamespace(src_a=SimpleNamespace(num_rows=na), src_b=SimpleNamespace(num_rows=nb))

    assert default_partitions(prep(76032, 76032), 8, {}) == 1
    assert default_partitions(prep(1_000_000, 3_500_000), 8, {}) == 4
    assert default_partitions(prep(8_000_000, 8_000_000), 2, {}) == 2
    assert default_partitions(prep(None, 10), 3, {}) == 3  # CSV: size unknown
    assert default_partitions(prep(76032, 10), 8, {"smerge.partition.min_records": "10000"}) == 8


def test_task_threads_only_when_tasks_leave_cores_free():
    from types import SimpleNamespace

    from smerge.errors import UsageError
    from smerge.spark.cgm.runner import _task_threads

    local1 = SimpleNamespace(master="local[1]", defaultParallelism=1)
    cluster = SimpleNamespace(master="spark://h:7077", defaultParallelism=16)
    cores = os.cpu_count() or 1
    assert _task_threads({}, local1, 1) is (1 < cores)
    assert _task_threads({}, local1, cores) is False
    assert _task_threads({}, cluster, 16) is False and _task_threads({}, cluster, 4) is True
    assert _task_threads({"smerge.task.prefetch": "false"}, cluster, 1) is False
    assert _task_threads({"smerge.task.prefetch": "true"}, cluster, 64) is True
    with pytest.raises(UsageError, match="true, false or auto"):
        _task_threads({"smerge.task.prefetch": "maybe"}, cluster, 1)
