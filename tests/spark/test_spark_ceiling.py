"""``--kappa-max`` on Spark reports the figures of --local: the ceiling (a maximum matching of the
eps-graph), the method that found it and the greedy unbounded-window figure, for one key (the
sweep) and for several (Hopcroft-Karp), through ``smerge.jobs.pipeline.execute`` as every command."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.jobs.pipeline import RunOptions, execute
from smerge.jobs.route import Route

pytestmark = pytest.mark.slow
SPARK = Route(True, "local[2]", "spark (--master local[2])")


def data(tmp_path):
    """B: A's records with their time jittered by up to 0.4, arriving up to ~3 time units out of
    order, a tenth of them missing; with eps 0.5 on time a greedy pairing loses records that a
    maximum matching keeps (records are denser than eps)."""
    rng = np.random.default_rng(7)
    n = 3000
    t = np.sort(rng.uniform(0, 1000, n))
    lat, lon = rng.integers(0, 3, n).astype(float), rng.integers(0, 3, n).astype(float)
    pq.write_table(pa.table({"time": t, "lat": lat, "lon": lon, "v": np.arange(n)}), tmp_path / "a.parquet")
    o = np.argsort(t + rng.uniform(0, 3, n), kind="stable")
    o = o[rng.random(n)[o] > 0.1]
    tb = t + rng.uniform(-0.4, 0.4, n)
    pq.write_table(pa.table({"time": tb[o], "lat": lat[o], "lon": lon[o], "w": o}), tmp_path / "b.parquet")
    return str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")


@pytest.mark.parametrize("keys,eps,method", [
    (("time",), 0.5, "matching, 1 key"),
    (("time", "lat", "lon"), (0.5, 0.5, 0.5), "matching, eps-graph"),
])
def test_kappa_max_on_spark_is_the_local_figures(keys, eps, method, tmp_path, spark, monkeypatch):
    from smerge.jobs.cgm import CGMJob

    monkeypatch.chdir(tmp_path)
    a, b = data(tmp_path)

    def job(out):
        return CGMJob(a=a, b=b, keys_a=keys, eps=eps, output=out, kappa_max=True, window_size=50,
                      least_increment_a=10, least_increment_b=10)

    local = execute(job("local.parquet"), RunOptions(local=True))
    on_spark = execute(job("spark.parquet"), RunOptions(partitions=2, spark=spark), route=SPARK)
    assert on_spark["execution"] == "spark"
    figures = ("kappa_max", "kappa_max_method", "kappa_greedy")
    assert {k: on_spark[k] for k in figures} == {k: local[k] for k in figures}
    assert local["kappa_max_method"] == method
    # the case is one where the figures differ: the greedy figure is under the ceiling, and so is every run
    assert local["kappa_greedy"] < local["kappa_max"]
    assert max(local["match_pct"], on_spark["match_pct"]) / 100 <= local["kappa_max"]
