"""Issue 10, item 2: a damaged persisted index is refused by ``smerge serve --index`` at start
(exit 2, one line), never a crash or a wrong answer; ``BIndex.load`` raises InputError."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.datasets import open_input
from smerge.errors import InputError
from smerge.index import BIndex, build_index
from smerge.merge.range_source import Box

pytestmark = pytest.mark.slow
SMERGE = [sys.executable, "-m", "smerge"]


def _cap_memory():
    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))


def _build(d, seed: int, n: int = 20000):
    rng = np.random.default_rng(seed)
    t = pa.table({"t": rng.integers(0, 40, n).astype(float), "y": rng.integers(0, 40, n).astype(float),
                  "v": rng.random(n)})
    pq.write_table(t, d / f"b{seed}.parquet")
    build_index(open_input(str(d / f"b{seed}.parquet"), keys=["t", "y"]), str(d / f"idx{seed}")).close()
    return d / f"idx{seed}"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    d = tmp_path_factory.mktemp("idx")
    return _build(d, 0), _build(d, 1)


def _edit_meta(p, fn):
    meta = json.loads((p / "meta.json").read_text())
    meta = fn(meta)
    (p / "meta.json").write_text(json.dumps(meta))


def _resign(meta):
    from smerge.index.format import meta_digest

    meta["meta_sha256"] = meta_digest(meta)
    return meta


def _overwrite(path, offset_frac, data):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.seek(int(size * offset_frac))
        f.write(data)


def _order(p, fn):
    o = np.load(p / "order.npy")
    np.save(p / "order.npy", fn(o))


DAMAGE = {
    "rtree random overwrites": lambda p, o: [_overwrite(p / "rtree.dat", f, os.urandom(64)) for f in (0.1, 0.5, 0.9)],
    "rtree truncated": lambda p, o: os.truncate(p / "rtree.dat", os.path.getsize(p / "rtree.dat") // 2),
    "rtree empty": lambda p, o: open(p / "rtree.idx", "w").close(),
    "rtree missing": lambda p, o: os.remove(p / "rtree.dat"),
    "rtree from another index": lambda p, o: [shutil.copy(o / f, p / f) for f in ("rtree.dat", "rtree.idx")],
    "order shuffled": lambda p, o: _order(p, lambda a: np.random.default_rng(0).permutation(a)),
    "order zeroed": lambda p, o: _order(p, np.zeros_like),
    "order 2-D": lambda p, o: _order(p, lambda a: a.reshape(2, -1)),
    "order out of range": lambda p, o: _order(p, lambda a: a + 10**6),
    "order garbage": lambda p, o: (p / "order.npy").write_bytes(b"not numpy"),
    "data 4 KiB garbage": lambda p, o: _overwrite(p / "data.parquet", 0.5, os.urandom(4096)),
    "data swapped, same length": lambda p, o: (p / "data.parquet").write_bytes(
        (o / "data.parquet").read_bytes()[:os.path.getsize(p / "data.parquet")].ljust(
            os.path.getsize(p / "data.parquet"), b"\0")),
    "data missing": lambda p, o: os.remove(p / "data.parquet"),
    "meta keys reordered": lambda p, o: _edit_meta(p, lambda m: {**m, "keys": m["keys"][::-1]}),
    "meta keys reordered, checksum redone": lambda p, o: _edit_meta(p, lambda m: _resign({**m, "keys": m["keys"][::-1]})),
    "meta missing key": lambda p, o: _edit_meta(p, lambda m: _resign({k: v for k, v in m.items() if k != "keys"})),
    "meta bad key": lambda p, o: _edit_meta(p, lambda m: _resign({**m, "keys": ["t", "nope"]})),
    "meta a JSON list": lambda p, o: (p / "meta.json").write_text("[1, 2]"),
    "meta not JSON": lambda p, o: (p / "meta.json").write_text("{oops"),
    "meta of format 1": lambda p, o: _edit_meta(p, lambda m: {**m, "version": 1}),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_damaged_index_refused_at_start_with_exit_2(built, tmp_path, kind):
    good, other = built
    p = tmp_path / "idx"
    shutil.copytree(good, p)
    DAMAGE[kind](p, other)
    with pytest.raises(InputError, match="damaged index|not supported|not an smerge index"):
        BIndex.load(str(p))
    r = subprocess.run(SMERGE + ["serve", "--index", str(p), "--port", "0"], capture_output=True, text=True,
                       timeout=120, preexec_fn=_cap_memory)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("smerge: error: ") and "Traceback" not in r.stderr, r.stderr
    assert r.stdout == ""


@pytest.mark.parametrize("kind", ["order shuffled", "order zeroed", "order out of range", "order 2-D",
                                  "meta bad key", "rtree empty"])
def test_structural_checks_hold_without_checksums(built, tmp_path, kind):
    good, other = built
    p = tmp_path / "idx"
    shutil.copytree(good, p)
    DAMAGE[kind](p, other)
    with pytest.raises(InputError, match="damaged index"):
        BIndex.load(str(p), verify=False)


def test_serving_leaves_the_index_verifiable(built, tmp_path):
    good, _ = built
    p = tmp_path / "idx"
    shutil.copytree(good, p)
    before = {f: (p / f).read_bytes() for f in os.listdir(p)}
    for _ in range(2):
        idx = BIndex.load(str(p))
        idx.scan_max_rows = 0  # the R-tree path
        assert idx.range_query(Box((0.0, 0.0), (10.0, 10.0)), limit=5).rows.size == 5
        idx.close()
    assert {f: (p / f).read_bytes() for f in os.listdir(p)} == before
