"""The archive modules are imported only when a run needs them: a `smerge cgm --local` process
over Parquet inputs with no sampling option loads neither `smerge.datasets.archive.manifest` nor
`smerge.datasets.archive.read` (about 40 ms of start-up; only the light `probe` is imported); with
an archive input it does, and reads it."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

PROBE = """
import json, sys
sys.argv = ["smerge", "cgm", *sys.argv[1:], "--keys", "k", "--eps", "0.05", "--local"]
from smerge.cli.main import main
rc = main()
print(json.dumps({"rc": rc, "manifest": "smerge.datasets.archive.manifest" in sys.modules,
                  "read": "smerge.datasets.archive.read" in sys.modules}))
"""


def probe(tmp_path, *args, env=None):
    import os

    r = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, cwd=tmp_path,
                       env={**os.environ, **(env or {})})
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def inputs(tmp_path):
    k = np.arange(2000.0)
    pq.write_table(pa.table({"k": k, "v": np.arange(2000)}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"k": k + 0.01, "w": np.arange(2000)}), tmp_path / "b.parquet")
    return tmp_path / "a.parquet", tmp_path / "b.parquet"


def test_parquet_inputs_do_not_import_the_archive_modules(tmp_path):
    a, b = inputs(tmp_path)
    got = probe(tmp_path, a, b, "-o", tmp_path / "o.parquet")
    assert got == {"rc": 0, "manifest": False, "read": False}
    assert pq.read_table(tmp_path / "o.parquet").num_rows == 2000


def test_an_archive_input_imports_them_and_is_read(tmp_path):
    from smerge.cli.main import main

    a, b = inputs(tmp_path)
    assert main(["archive", "append", str(tmp_path / "arch"), str(a), "--time", "k", "--block-rows", "100"]) == 0
    got = probe(tmp_path, tmp_path / "arch", b, "-o", tmp_path / "o.parquet", "--sample-a", "0.5", "--stats",
                tmp_path / "s.json")
    assert got == {"rc": 0, "manifest": True, "read": True}
    stats = json.load(open(tmp_path / "s.json"))
    assert stats["a_sample_fraction"] == 0.5 and 0 < stats["matched"] < 2000
