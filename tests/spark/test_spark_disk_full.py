"""A disk that fills while Spark's tasks write their parts: one line naming the output and the
cause (exit 2), nothing left behind -- as in-process -- for cgm, rtm and wjoin."""

from __future__ import annotations

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "helpers"))
from tmpfs import mounted_tmpfs  # noqa: E402

from smerge.errors import OutputError  # noqa: E402
from smerge.jobs.pipeline import RunOptions, execute  # noqa: E402
from smerge.jobs.route import Route  # noqa: E402

pytestmark = pytest.mark.slow
SPARK = Route(True, "local[2]", "spark (--master local[2])")


@pytest.fixture
def small_dir(tmp_path):
    """A 256 KiB tmpfs: room for the staging folder, not for the parts (root only)."""
    with mounted_tmpfs(tmp_path / "small", "256k") as d:
        yield d


@pytest.mark.parametrize("engine", ["cgm", "rtm", "wjoin"])
def test_a_full_disk_in_the_tasks_is_one_line(engine, tmp_path, small_dir, spark):
    from smerge.jobs.cgm import CGMJob
    from smerge.jobs.rtm import RTMJob
    from smerge.jobs.wjoin import WJoinJob

    rng = np.random.default_rng(0)
    n = 200_000
    k = np.sort(rng.uniform(0, 1e6, n))
    noise = {f"x{i}": rng.standard_normal(n) for i in range(4)}  # incompressible: several MB of parts
    pq.write_table(pa.table({"k": k, **noise}), tmp_path / "a.parquet")
    a = str(tmp_path / "a.parquet")
    out = str(small_dir / "o.parquet")
    job = {"cgm": lambda: CGMJob(a=a, b=a, keys_a=("k",), output=out),
           "rtm": lambda: RTMJob(a=a, b=a, keys_a=("k",), output=out),
           "wjoin": lambda: WJoinJob(inputs=(a, a), time=("k",), window="0", output=out)}[engine]()
    with pytest.raises(OutputError) as e:
        execute(job, RunOptions(partitions=2, spark=spark), route=SPARK)
    msg = str(e.value)
    assert "o.parquet" in msg and ("no space left" in msg or "quota" in msg), msg
    assert "\n" not in msg and e.value.exit_code == 2
    assert os.listdir(small_dir) == []  # no part, staging folder or output left
