"""Archive sampling belongs to one run: the fraction asked for an input travels with the job
(``job.sampling``) to the reader, the reader reports its read to that run's ``Sampling``, and
the statistics are built from it. Two runs in one process never see each other's sampling,
whatever the order they are prepared and run in, and the archive reader keeps no module-level
registry."""

from __future__ import annotations

import ast
import pathlib
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from smerge.datasets import open_input
from smerge.datasets.archive.append import AppendParams, append
from smerge.datasets.archive.manifest import read_manifest
from smerge.datasets.archive.read import Budget, sample_counts
from smerge.datasets.archive.sampling import Sampling
from smerge.jobs import CGMJob, prepare, run_local
from smerge.jobs.pipeline import RunOptions, execute
from smerge.jobs.sampling import apply_sample_all, apply_samples, count_sample_stats, sample_stats

ROOT = pathlib.Path(__file__).resolve().parents[2]
N = 6000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """A: t = 0, 2, 4, ... (6,000 records) archived in runs of 8 blocks; B: t = 0.1, 3.1, ..."""
    tmp = tmp_path_factory.mktemp("scope")
    a, b = tmp / "a.parquet", tmp / "b.parquet"
    pq.write_table(pa.table({"t": np.arange(0, 2 * N, 2.0), "x": np.arange(N)}), a)
    pq.write_table(pa.table({"t": np.arange(0, 3 * N, 3.0) + 0.1, "y": np.arange(N)}), b)
    src = open_input(str(a))
    arch = tmp / "arch"
    append(str(arch), str(a), src.batches(), src.schema, AppendParams(time="t", run_blocks=8, block_rows=150, seed=3))
    return str(arch), str(b)


def _sample_size(arch, f, seed=0):
    return sum(sample_counts(read_manifest(arch), f, seed))


def _job(arch, b, out):
    return CGMJob(a=arch, b=b, output=str(out), keys_a=("t",), eps=(0.6,), overwrite=True, batch_rows=100)


def test_runs_prepared_together_keep_their_own_fractions(data, tmp_path):
    """Run 1 asks 0.25, run 2 asks 0.5; both are prepared (the archive opened) before either is
    read, and run 2 is read first. Each reads and reports its own fraction: with one registry
    for the process, run 2's request would have replaced run 1's."""
    arch, b = data
    s1 = apply_samples((("--sample-a", "0.25", arch), ("--sample-b", None, b)), spark=False)
    s2 = apply_samples((("--sample-a", "0.5", arch), ("--sample-b", None, b)), spark=False)
    p1 = prepare(replace(_job(arch, b, tmp_path / "1.parquet"), sampling=s1))
    p2 = prepare(replace(_job(arch, b, tmp_path / "2.parquet"), sampling=s2))
    r2 = sample_stats(run_local(p2), (("a", arch), ("b", b)), s2)
    r1 = sample_stats(run_local(p1), (("a", arch), ("b", b)), s1)
    assert (r1["a_sample_fraction"], r2["a_sample_fraction"]) == (0.25, 0.5)
    assert r1["a_records"] == _sample_size(arch, 0.25) < r2["a_records"] == _sample_size(arch, 0.5) < N
    assert r1["a_records_estimate"] == r1["a_records"] / 0.25 and r2["a_records_estimate"] == r2["a_records"] / 0.5
    assert s1.counters_for(arch)["blocks_read"] < s2.counters_for(arch)["blocks_read"]
    assert "b_sample_fraction" not in r1 and s1.counters_for(b) is None


def test_pipeline_runs_one_after_another_do_not_see_each_other(data, tmp_path):
    """Three runs through the pipeline in one process: 0.25, then auto, then no option. Each
    run's statistics are its own (the last one reads every record and reports no auto keys)."""
    arch, b = data
    quarter = execute(_job(arch, b, tmp_path / "q.parquet"), RunOptions(local=True, samples=("0.25", None)))
    auto = execute(_job(arch, b, tmp_path / "a.parquet"), RunOptions(local=True, samples=("auto", None), budget="600"))
    whole = execute(_job(arch, b, tmp_path / "w.parquet"), RunOptions(local=True))
    assert quarter["a_sample_fraction"] == 0.25 and quarter["a_records"] == _sample_size(arch, 0.25)
    assert "a_sample_mode" not in quarter
    assert auto["a_sample_mode"] == "auto" and auto["a_sample_budget"] == 600.0
    assert auto["a_sample_run_fractions"] and all(0 < f <= 1 for f in auto["a_sample_run_fractions"])
    assert whole["a_sample_fraction"] == 1.0 and whole["a_records"] == N
    assert not any(k.startswith("a_sample_") and k != "a_sample_fraction" for k in whole)
    assert "a_records_estimate" not in whole and "matched_estimate" not in whole


def test_a_reader_reports_to_the_sampling_it_was_opened_with(data):
    """Two sources of one archive opened with two runs' Samplings: each read's counters reach its
    own Sampling (and the source), the other's stays empty until it reads."""
    arch, _ = data
    s1, s2 = Sampling(), Sampling()
    s1.request(arch, 0.25, seed=1)
    s2.request(arch, Budget(600.0))
    src1, src2 = open_input(arch, sample=s1), open_input(arch, sample=s2)
    assert src1.num_rows == _sample_size(arch, 0.25, seed=1)
    assert s1.counters_for(arch) is None and s2.counters_for(arch) is None  # nothing read yet
    n1 = sum(bt.num_rows for bt in src1.batches())
    assert s1.counters_for(arch) is src1.counters and s2.counters_for(arch) is None
    assert n1 == src1.num_rows and src1.counters["records_read"] == n1 and src1.counters["sample_seed"] == 1
    sum(bt.num_rows for bt in src2.batches())
    assert s2.counters_for(arch) is src2.counters and s2.counters_for(arch)["sample_mode"] == "auto"
    assert "sample_mode" not in s1.counters_for(arch)
    assert s1.fraction_for(arch) == 0.25 and isinstance(s2.fraction_for(arch), Budget)


def test_the_environment_applies_when_no_option_says_otherwise(data, monkeypatch):
    arch, b = data
    monkeypatch.setenv("SMERGE_ARCHIVE_SAMPLE", "0.5")
    monkeypatch.setenv("SMERGE_ARCHIVE_SEED", "7")
    none = apply_sample_all(None, [arch, b], spark=False)
    asked = apply_sample_all("0.25", [arch, b], spark=False)
    assert none.resolve(arch) == (0.5, 7) and asked.resolve(arch) == (0.25, 7)
    assert open_input(arch, sample=none).num_rows == _sample_size(arch, 0.5, seed=7)
    assert open_input(arch, sample=asked).num_rows == _sample_size(arch, 0.25, seed=7)
    stats = count_sample_stats({"records_received": 100}, arch, asked)
    assert stats["sample_fraction"] == 0.25 and stats["records_estimate"] == 400.0


def _module_level_mutables(path: pathlib.Path) -> list[str]:
    """Names bound at module level to a dict, list or set (literal, comprehension or constructor
    call), ``__all__`` aside."""
    mutable_calls = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter"}
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            v = node.value
            call = isinstance(v, ast.Call) and getattr(v.func, "id", getattr(v.func, "attr", None)) in mutable_calls
            if call or isinstance(v, (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                found += [ast.unparse(t) for t in targets if ast.unparse(t) != "__all__"]
    return found


@pytest.mark.parametrize("module", ["datasets/archive/read.py", "datasets/archive/sampling.py", "jobs/sampling.py"])
def test_no_module_level_registry(module):
    assert _module_level_mutables(ROOT / module) == []
    from smerge.datasets.archive import read

    for gone in ("_REQUESTED", "_USED", "request_sample", "clear_requests", "used_for", "fraction_for"):
        assert not hasattr(read, gone), gone


def test_the_registry_check_can_fail(tmp_path):
    p = tmp_path / "m.py"
    p.write_text("A = 1\n_R: dict[str, int] = {}\n_U = dict()\nB = (1, 2)\n__all__ = ['A']\n")
    assert _module_level_mutables(p) == ["_R", "_U"]
