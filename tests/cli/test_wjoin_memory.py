"""A W-join too large for memory is refused (exit 2, one line naming the window or the predicate's
equality, no output) before it allocates, under an address-space limit: never the OOM killer,
never "out of memory" (issue 11)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import smerge.merge.wjoin as W

CAP = 3 << 30  # address space of the child (numba and the thread stacks reserve ~2 GB of it); the refused
# joins would need 5 GB and more without the guard
N = 2100  # records per stream, all at one instant: one S3 arrival meets N x N = 4.41M pairs of S1, S2


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CAP, CAP))


def run_capped(*args) -> tuple[int, str, float]:
    """(exit code, stderr, peak RSS in MiB) of ``smerge wjoin ... --local`` under ``CAP``."""
    p = subprocess.Popen([sys.executable, "-m", "smerge", "wjoin", *map(str, args), "--local"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_cap)
    _, status, usage = os.wait4(p.pid, 0)
    err = p.stderr.read().decode()
    p.stderr.close()
    return os.waitstatus_to_exitcode(status), err, usage.ru_maxrss / 1024


@pytest.fixture
def streams(tmp_path):
    rng = np.random.default_rng(11)
    paths = []
    for i in range(3):
        # S3's v is above every S1 v, so "S1.v < S3.v" holds for every pair and filters nothing
        v = rng.random(N) + (2.0 if i == 2 else 0.0)
        p = tmp_path / f"s{i + 1}.parquet"
        pq.write_table(pa.table({"t": np.zeros(N, np.int64), "k": np.zeros(N, np.int64), "id": np.arange(N),
                                 "v": v}), p)
        paths.append(p)
    return paths


def test_limit_is_below_the_product_of_the_test_windows():
    assert N * N > W.MAX_PARTIAL_TUPLES  # else the cases below would not reach the guard


@pytest.mark.parametrize("where, says", [
    (None, r"stream S\d would give 4,410,000 partial tuples for one S3 arrival .*window bounds \(S\d,S\d <= 10, "
           r"S\d,S\d <= 10\).*no equality links it.*narrow the window or add an equality"),
    ("S1.v < S3.v", r"stream S\d would give 4,410,000 partial tuples for one S3 arrival .*no equality links it.*"
                    r"add an equality"),
    ("S1.k = S2.k and S2.k = S3.k", r"stream S\d would give more than 4,000,000 partial tuples \(the limit\) for "
                                    r"one S3 arrival; within its window bounds \(S\d,S\d <= 10, S\d,S\d <= 10\) "
                                    r"too many records share the equality values.*more selective equality"),
    ("S1.k = S2.k and S1.v < S3.v", r"stream S\d would give (4,410,000|more than 4,000,000) partial tuples"),
])
def test_too_large_join_is_exit_2_before_allocating(streams, tmp_path, where, says):
    import re

    out = tmp_path / "out.parquet"
    args = [*streams, "--time", "t", "--window", "10", "-o", out] + (["--where", where] if where else [])
    rc, err, peak = run_capped(*args)
    assert rc == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("smerge: error: wjoin:"), err
    assert re.search(says, lines[0]), lines[0]
    assert "Traceback" not in err and "out of memory" not in err
    # refused before the step was allocated: 4.41M partial tuples in ~10 index arrays and the
    # output columns would be more than a GB; the process stays near its start-up size
    assert peak < 1024, peak
    assert not out.exists() and sorted(os.listdir(tmp_path)) == ["s1.parquet", "s2.parquet", "s3.parquet"]


def test_the_same_streams_fit_with_a_selective_equality(streams, tmp_path):
    """Under the same limit a join of the same size that an equality makes small completes."""
    out = tmp_path / "out.parquet"
    rc, err, _ = run_capped(*streams, "--time", "t", "--window", "10", "--where",
                            "S1.id = S2.id and S2.id = S3.id and S1.v < S3.v", "-o", out)
    assert rc == 0, err
    t = pq.read_table(out)
    assert t.num_rows == N and t["S1_id"].to_pylist() == list(range(N)) == t["S3_id"].to_pylist()
