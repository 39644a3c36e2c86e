"""smerge's Parquet output: floating-point columns stored uncompressed (snappy does not compress
random mantissas and costs a third of the writer's time), every other column snappy and
dictionary-encoded; with a nested column, snappy throughout; the values round-trip exactly."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from smerge.datasets.writers import _ParquetWriter


def _codecs(path) -> dict:
    md = pq.ParquetFile(path).metadata
    rg = md.row_group(0)
    return {rg.column(i).path_in_schema: (rg.column(i).compression, "RLE_DICTIONARY" in rg.column(i).encodings)
            for i in range(rg.num_columns)}


def test_float_columns_plain_and_uncompressed_others_snappy(tmp_path):
    rng = np.random.default_rng(0)
    t = pa.table({"k": rng.normal(size=1000), "v": rng.normal(size=1000).astype("f4"),
                  "station": pa.array([f"s{i % 7}" for i in range(1000)]), "n": np.arange(1000) % 5})
    w = _ParquetWriter(str(tmp_path / "o.parquet"), t.schema)
    for b in t.to_batches(max_chunksize=300):
        w.write(b)
    w.close()
    assert _codecs(tmp_path / "o.parquet") == {"k": ("UNCOMPRESSED", False), "v": ("UNCOMPRESSED", False),
                                               "station": ("SNAPPY", True), "n": ("SNAPPY", True)}
    assert pq.read_table(tmp_path / "o.parquet").equals(t)


def test_a_nested_column_keeps_snappy_everywhere(tmp_path):
    t = pa.table({"k": [1.0, 2.0], "s": pa.array([{"x": 1.5}, {"x": 2.5}])})
    w = _ParquetWriter(str(tmp_path / "o.parquet"), t.schema)
    w.write(t.to_batches()[0])
    w.close()
    assert {c for c, _ in _codecs(tmp_path / "o.parquet").values()} == {"SNAPPY"}
    assert pq.read_table(tmp_path / "o.parquet").equals(t)
