"""Layering (STYLE.md convention 2): the engines import no CLI, Spark, netCDF or Flight code."""

from __future__ import annotations

import subprocess
import sys


def test_merge_imports_no_heavy_or_io_modules():
    code = (
        "import sys, smerge.merge, smerge.merge.cgm, smerge.merge.stats\n"
        "bad = [m for m in ('pyspark', 'typer', 'netCDF4', 'pyarrow.flight', 'click', 'tqdm') if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_installed_under_the_smerge_namespace():
    import importlib.util

    for name in ("smerge.cli", "smerge.merge", "smerge.index", "smerge.transport", "smerge.datasets"):
        assert importlib.util.find_spec(name) is not None, name
    # The folders are not installed as bare top-level packages.
    code = "import importlib.util as u; print([n for n in ('merge','index','transport','datasets','cli') if u.find_spec(n)])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout
    assert out.strip() == "[]"
