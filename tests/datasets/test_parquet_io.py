"""smerge's Parquet reader and writer over pyarrow's classes (datasets/parquet_io.py) give what
``pyarrow.parquet`` gives: the same batches for any choice of columns and row groups, and
byte-identical files; a local merge does not import ``pyarrow.parquet`` at all."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smerge.datasets.parquet_io import _LocalParquetFile, _LocalParquetWriter, parquet_file, parquet_writer
from smerge.datasets.writers import parquet_options


def _table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    f = rng.normal(size=n)
    return pa.table({
        "time": pa.array((rng.integers(0, 10**12, n)).astype("datetime64[us]")).cast(pa.timestamp("us", "UTC")),
        "lat": f,
        "v": pa.array(f.astype("f4"), mask=rng.random(n) < 0.1),
        "name": pa.array([f"s{i % 7}" for i in range(n)]),
        "cat": pa.array([f"c{i % 3}" for i in range(n)]).dictionary_encode(),
        "a.b": np.arange(n, dtype=np.int16),
        "nested": pa.array([{"x": i, "y": [i, i + 1]} for i in range(n)]),
    })


def _batches(reader, **kw) -> pa.Table:
    got = list(reader.iter_batches(**kw))
    return pa.Table.from_batches(got) if got else None


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 400), group=st.integers(1, 97), batch=st.integers(1, 150),
       cols=st.lists(st.sampled_from(["time", "lat", "v", "name", "cat", "a.b", "nested"]), unique=True, max_size=7),
       pick=st.lists(st.integers(0, 50), max_size=4))
def test_same_batches_as_pyarrow_parquet(tmp_path_factory, n, group, batch, cols, pick):
    path = str(tmp_path_factory.mktemp("pq") / "t.parquet")
    pq.write_table(_table(n), path, row_group_size=group)
    groups = sorted({g % pq.ParquetFile(path).num_row_groups for g in pick}) or None
    columns = [c for c in cols if "." not in c] or None
    ours = parquet_file(path, pre_buffer=False, columns=columns)
    assert isinstance(ours, _LocalParquetFile)
    theirs = pq.ParquetFile(path, pre_buffer=False)
    assert ours.schema_arrow.equals(theirs.schema_arrow, check_metadata=True)
    assert ours.metadata.equals(theirs.metadata)
    kw = dict(batch_size=batch, columns=columns, row_groups=groups)
    a, b = _batches(ours, **kw), _batches(theirs, **kw)
    assert (a is None and b is None) or a.equals(b)


def test_a_dotted_name_and_a_file_object_go_through_pyarrow_parquet(tmp_path):
    path = str(tmp_path / "t.parquet")
    pq.write_table(_table(10), path)
    assert isinstance(parquet_file(path, columns=["a.b"]), pq.ParquetFile)
    with open(path, "rb") as f:
        buf = io.BytesIO(f.read())
    got = parquet_file(buf)
    assert isinstance(got, pq.ParquetFile) and got.metadata.num_rows == 10


@pytest.mark.parametrize("rows,batches", [(0, 1), (5, 1), (1000, 3), (70_000, 2)])
def test_byte_identical_files(tmp_path, rows, batches):
    table = _table(rows, seed=3)
    schema = table.schema
    opts = parquet_options(schema)
    ours, theirs = tmp_path / "ours.parquet", tmp_path / "theirs.parquet"
    w1 = parquet_writer(str(ours), schema, **opts)
    assert isinstance(w1, _LocalParquetWriter)
    w2 = pq.ParquetWriter(str(theirs), schema, **opts)
    for batch in table.combine_chunks().to_batches(max_chunksize=max(1, -(-rows // batches))):
        w1.write_batch(batch)
        w2.write_batch(batch)
    w1.close()
    w2.close()
    assert ours.read_bytes() == theirs.read_bytes()
    assert rows == 0 or pq.read_table(ours).equals(table)


def test_a_batch_of_another_schema_is_refused(tmp_path):
    w = parquet_writer(str(tmp_path / "o.parquet"), pa.schema([("k", pa.float64())]))
    with pytest.raises(ValueError, match="schema does not match"):
        w.write_batch(pa.record_batch({"k": pa.array([1], pa.int64())}))
    w.close()


PROBE = """
import json, sys
sys.argv = ["smerge", "cgm", "a.parquet", "b.parquet", "--keys", "k", "--eps", "0.05", "--local", "-o", "o.parquet"]
from smerge.cli.main import main
rc = main()
print(json.dumps({"rc": rc, "pyarrow.parquet": "pyarrow.parquet" in sys.modules, "pyarrow.fs": "pyarrow.fs" in sys.modules}))
"""


def test_a_local_merge_does_not_import_pyarrow_parquet(tmp_path):
    k = np.arange(3000.0)
    pq.write_table(pa.table({"k": k, "v": np.arange(3000)}), tmp_path / "a.parquet", row_group_size=1000)
    pq.write_table(pa.table({"k": k + 0.01, "w": np.arange(3000)}), tmp_path / "b.parquet", row_group_size=700)
    r = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == {"rc": 0, "pyarrow.parquet": False, "pyarrow.fs": False}
    out = pq.read_table(tmp_path / "o.parquet")
    assert out.num_rows == 3000 and out.column("w").to_pylist() == list(range(3000))


def test_extension_types_without_an_arrow_schema_read_as_pyarrow_parquet_reads_them(tmp_path):
    """A file written without the Arrow schema (as DuckDB, Spark and parquet-mr write them): its
    UUID and JSON columns are read as Arrow's extension types, as pyarrow.parquet reads them."""
    import uuid

    path = str(tmp_path / "x.parquet")
    table = pa.table({"k": [0.0, 1.0],
                      "u": pa.array([uuid.UUID(int=i).bytes for i in range(2)], pa.uuid()),
                      "j": pa.array(['{"i": 0}', '{"i": 1}'], pa.json_())})
    pq.write_table(table, path, store_schema=False)
    ours, theirs = parquet_file(path), pq.ParquetFile(path)
    assert isinstance(ours, _LocalParquetFile)
    assert ours.schema_arrow.equals(theirs.schema_arrow)
    assert [str(f.type) for f in ours.schema_arrow] == [str(f.type) for f in table.schema]
    assert _batches(ours, batch_size=10).equals(_batches(theirs, batch_size=10))
