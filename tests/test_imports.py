"""Layering (STYLE.md convention 2): the engines import no CLI, Spark, netCDF or Flight code, and
only ``smerge.spark`` imports pyspark."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# The folders installed under the smerge namespace (setup.cfg's package_dir).
PACKAGES = {"smerge": "smerge", "cli": "smerge.cli", "merge": "smerge.merge", "index": "smerge.index",
            "transport": "smerge.transport", "datasets": "smerge.datasets", "jobs": "smerge.jobs",
            "spark": "smerge.spark"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions (absolute names)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_smerge_spark_imports_pyspark():
    mods = _modules()
    assert "smerge.spark.session" in mods and "smerge.jobs.cgm" in mods  # the scan sees the packages
    users = {m for m, p in mods.items() if any(n == "pyspark" or n.startswith("pyspark.") for n in _imports(p))}
    assert users, "no module imports pyspark: the scan is broken"
    assert sorted(m for m in users if not m.startswith("smerge.spark.")) == []


def test_no_module_imports_the_old_flat_paths():
    # core/spark*.py, core/jobs.py, rtm_job.py, wjoin_job.py moved to spark/ and jobs/ (no shims left)
    old = {"smerge.spark_frames", "smerge.spark_tasks", "smerge.spark_netcdf", "smerge.spark_parquet",
           "smerge.spark_rtm", "smerge.spark_wjoin", "smerge.rtm_job", "smerge.wjoin_job"}
    files = list(_modules().values()) + sorted((ROOT / "tests").rglob("*.py")) + sorted((ROOT / "bench").rglob("*.py"))
    bad = [(str(p.relative_to(ROOT)), n) for p in files for n in _imports(p) if n in old]
    assert bad == []
    for name in old:
        code = f"import importlib.util as u; print(u.find_spec({name!r}) is None)"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.strip() == "True", name


def test_root_folder_keeps_only_the_package_root():
    assert sorted(p.name for p in (ROOT / "smerge").glob("*.py")) == [
        "__init__.py", "__main__.py", "errors.py", "memory.py", "plot.py", "xarray.py"]


def _loaded_after(imports: str, watch: tuple[str, ...]) -> list[str]:
    code = (f"import sys\n{imports}\n"
            f"print(','.join(m for m in {watch!r} if m in sys.modules))\n")
    return [m for m in subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                      check=True).stdout.strip().split(",") if m]


def test_merge_imports_no_heavy_or_io_modules():
    bad = _loaded_after("import smerge.merge, smerge.merge.cgm, smerge.merge.stats",
                        ("pyspark", "typer", "netCDF4", "pyarrow.flight", "click", "tqdm"))
    assert bad == []


def test_cli_jobs_and_readers_do_not_load_pyspark():
    # The CLI starts Spark only for a run that goes there (lazily); the in-process jobs never do.
    loaded = _loaded_after("import smerge.cli.main, smerge.jobs, smerge.jobs.rtm, smerge.jobs.wjoin, smerge.merge, "
                           "smerge.datasets", ("pyspark", "smerge.spark", "py4j"))
    assert loaded == []
    # the check sees pyspark when it is loaded
    assert _loaded_after("import smerge.spark.session\nimport pyspark.sql", ("pyspark",)) == ["pyspark"]


def test_spark_package_root_imports_nothing():
    # executors import only the modules their tasks need (smerge.spark.cgm.tasks and what it imports)
    loaded = _loaded_after("import smerge.spark.cgm.tasks", ("pyspark", "smerge.spark.session", "smerge.spark.runner",
                                                         "smerge.spark.cgm.runner"))
    assert loaded == []


def test_installed_under_the_smerge_namespace():
    import importlib.util

    for name in ("smerge.cli", "smerge.merge", "smerge.index", "smerge.transport", "smerge.datasets", "smerge.jobs",
                 "smerge.spark"):
        assert importlib.util.find_spec(name) is not None, name
    # The folders are not installed as bare top-level packages.
    code = ("import importlib.util as u; "
            "print([n for n in ('merge','index','transport','datasets','cli','jobs','spark') if u.find_spec(n)])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/").stdout
    assert out.strip() == "[]"
