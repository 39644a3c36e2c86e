"""Layering: the engines import no CLI, Spark, netCDF or Flight code, and
only ``smerge.spark`` imports pyspark; the packages import each other without a cycle, lower
layers never import higher ones, and no module grows past ``MAX_MODULE_LINES``."""

from __future__ import annotations

import ast
import configparser
import pathlib
import subprocess
import sys
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _package_dirs() -> dict[str, str]:
    """Installed package -> its folder in the repository (setup.cfg's package_dir)."""
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    out = {}
    for line in cfg["options"]["package_dir"].strip().splitlines():
        package, folder = (s.strip() for s in line.split("="))
        out[package] = folder
    return out


# The folders installed under the smerge namespace ("smerge" is the package root's folder).
PACKAGES = {folder: package for package, folder in _package_dirs().items()}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def _import_nodes(path: pathlib.Path, module: str) -> list[tuple[ast.stmt, list[str]]]:
    """Every import statement of ``path`` (at the top or inside functions) with the absolute
    module names it may load: ``from P import x`` counts as ``P`` and ``P.x`` (x may be a module)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.append((node, [a.name for a in node.names]))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importing module's package
                pkg = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                pkg = pkg[:len(pkg) - (node.level - 1)]
                base = ".".join(pkg + ([base] if base else []))
            out.append((node, [base] + [f"{base}.{a.name}" for a in node.names]))
    return out


def _imports(path: pathlib.Path) -> set[str]:
    """Every module ``path`` imports, at the top or inside functions (absolute names)."""
    names = set()
    for node, mods in _import_nodes(path, ""):
        if isinstance(node, ast.Import):
            names.update(mods)
        elif node.module and node.level == 0:
            names.add(node.module)
    return names


def _node(name: str, roots: set[str]) -> str | None:
    """The graph node of module ``name``: each module of the package root's folder is its own
    node (``smerge.errors``, ``smerge.plot`` ...), every other module counts as its package
    (``smerge.merge.rtm`` -> ``smerge.merge``); None outside smerge or for a name that is not
    a module (``from smerge import __version__`` is an edge to ``smerge`` through its first name)."""
    parts = name.split(".")
    if parts[0] != "smerge":
        return None
    if len(parts) == 1:
        return "smerge"
    head = "smerge." + parts[1]
    return head if head in roots else None


def import_graph() -> dict[tuple[str, str], list[str]]:
    """(importer, imported) -> where: ``file:line: statement`` for every import between two nodes."""
    mods = _modules()
    roots = {m if m.count(".") == 1 else ".".join(m.split(".")[:2]) for m in mods if m != "smerge"}
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in mods.items():
        src = _node(module, roots)
        for node, names in _import_nodes(path, module):
            for dst in {d for d in (_node(n, roots) for n in names) if d is not None and d != src}:
                where = f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}"
                edges[(src, dst)].append(where)
    return dict(edges)


def _find_cycle(edges) -> list[str] | None:
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        path.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                return path[path.index(m):] + [m]
            if m not in state and (found := visit(m)):
                return found
        path.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def _explain(edges, pairs) -> str:
    return "\n".join(f"{a} -> {b}:\n    " + "\n    ".join(edges[(a, b)]) for a, b in pairs)


def test_the_import_graph_sees_every_package():
    edges = import_graph()
    nodes = {n for e in edges for n in e}
    assert {"smerge.merge", "smerge.datasets", "smerge.index", "smerge.transport", "smerge.jobs", "smerge.spark",
            "smerge.cli", "smerge.errors", "smerge.__main__"} <= nodes
    assert ("smerge.__main__", "smerge.cli") in edges and ("smerge.jobs", "smerge.merge") in edges
    # in-function imports count: smerge.cli imports smerge.spark only inside functions
    assert ("smerge.cli", "smerge.spark") in edges
    assert _find_cycle({("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")}) == ["a", "b", "c", "a"]
    assert _find_cycle({("a", "b"), ("b", "c"), ("a", "c")}) is None


def test_no_package_cycle():
    edges = import_graph()
    cycle = _find_cycle(edges)
    assert cycle is None, "package cycle " + " -> ".join(cycle) + ":\n" + _explain(edges, zip(cycle, cycle[1:]))


# Lowest first: a package imports only packages of its own layer or lower ones. The engines know
# no I/O; the readers and writers no index; the index no server; the frequent-item counting and
# the public API modules (plot, xarray) no jobs; only the CLI knows every package.
LAYERS = (
    ("smerge", "smerge.errors", "smerge.memory"),
    ("smerge.merge",),
    ("smerge.datasets",),
    ("smerge.index",),
    ("smerge.transport",),
    ("smerge.counting", "smerge.plot", "smerge.xarray"),
    ("smerge.jobs",),
    ("smerge.spark",),
    ("smerge.cli",),
    ("smerge.__main__",),
)


def test_layers_import_only_lower_layers():
    rank = {n: i for i, layer in enumerate(LAYERS) for n in layer}
    edges = import_graph()
    unknown = sorted({n for e in edges for n in e} - set(rank))
    assert unknown == [], f"place {unknown} in LAYERS"
    up = sorted((a, b) for a, b in edges if rank[b] > rank[a])
    assert up == [], "imports of a higher layer:\n" + _explain(edges, up)


def test_engines_import_no_io_index_server_or_runner():
    edges = import_graph()
    bad = [("smerge.merge", b) for b in ("smerge.datasets", "smerge.index", "smerge.transport", "smerge.counting",
                                         "smerge.jobs", "smerge.spark", "smerge.cli") if ("smerge.merge", b) in edges]
    assert bad == [], _explain(edges, bad)


def test_only_smerge_spark_imports_pyspark():
    mods = _modules()
    assert "smerge.spark.session" in mods and "smerge.jobs.cgm" in mods  # the scan sees the packages
    users = {m for m, p in mods.items() if any(n == "pyspark" or n.startswith("pyspark.") for n in _imports(p))}
    assert users, "no module imports pyspark: the scan is broken"
    assert sorted(m for m in users if not m.startswith("smerge.spark.")) == []


def test_only_smerge_transport_imports_flight():
    mods = _modules()
    users = {m for m, p in mods.items()  # ``from pyarrow import flight`` counts too
             if any(n == "pyarrow.flight" or n.startswith("pyarrow.flight.") for _, names in _import_nodes(p, m)
                    for n in names)}
    assert "smerge.transport.flight_server" in users  # the scan sees it
    assert sorted(m for m in users if not m.startswith("smerge.transport.")) == []


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


MAX_MODULE_LINES = 500
# Modules still over the limit while they are being split (remove each once it is under):
LONG_MODULES: dict[str, str] = {}


def test_no_module_is_longer_than_the_limit():
    folders = sorted(set(PACKAGES) | {"counting"})
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
               for f in folders if (ROOT / f).is_dir() for p in (ROOT / f).rglob("*.py")}
    assert "merge/rtm.py" in lengths and "cli/main.py" in lengths  # the scan sees the folders
    long = sorted(f"{p} ({n} lines)" for p, n in lengths.items() if n > MAX_MODULE_LINES and p not in LONG_MODULES)
    assert long == [], f"split these modules by concern (at most {MAX_MODULE_LINES} lines each)"
    stale = sorted(p for p in LONG_MODULES if lengths.get(p, 0) <= MAX_MODULE_LINES)
    assert stale == [], "remove these from LONG_MODULES: they are gone or short enough now"
