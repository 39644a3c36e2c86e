"""Helpers shared by the bench/bench_*.py scripts: machine description, timing, BENCHMARKS.md.

Stable on purpose (other bench scripts import it): add functions, do not change signatures.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Callable, Sequence

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "bench" / "data"
RESULTS = ROOT / "bench" / "results"
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
PYTHON = sys.executable
SMERGE = str(Path(sys.executable).with_name("smerge"))


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict:
    """nproc, CPU model, memory, OS and the versions that matter (no heavy imports)."""
    cpu = "unknown"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gb = None
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal"):
                mem_gb = round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    java = "not found"
    if shutil.which("java"):
        r = subprocess.run(["java", "-version"], capture_output=True, text=True)
        java = (r.stderr or r.stdout).splitlines()[0] if (r.stderr or r.stdout) else "unknown"
    return {
        "nproc": os.cpu_count(), "cpu": cpu, "memory_gb": mem_gb, "os": platform.platform(),
        "python": platform.python_version(),
        **{d: _version(d) for d in ("pyarrow", "numpy", "pandas", "numba", "netCDF4", "xarray", "pyspark")},
        "java": java,
    }


def machine_markdown(m: dict | None = None) -> str:
    m = m or machine()
    return (
        f"- CPU: {m['cpu']}, {m['nproc']} cores (nproc); memory {m['memory_gb']} GB; {m['os']}\n"
        f"- Python {m['python']}; pyarrow {m['pyarrow']}; numpy {m['numpy']}; pandas {m['pandas']}; "
        f"numba {m['numba']}; netCDF4 {m['netCDF4']}; xarray {m['xarray']}; pyspark {m['pyspark']}; {m['java']}\n"
        "- The machine is shared: other jobs may run at the same time, so every timing is the best "
        "of several interleaved repeats (the peer is timed in the same loop)."
    )


def best_of(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Smallest wall time of ``repeats`` calls (seconds) and the last result."""
    best, out = float("inf"), None
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def run_measured(cmd: Sequence[str], *, env: dict | None = None) -> tuple[float, int]:
    """Run a command under ``/usr/bin/time -v``; return (wall seconds, peak RSS in KB). Raises on failure."""
    t0 = time.perf_counter()
    r = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, env=env)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", r.stderr)
    return wall, int(m.group(1)) if m else -1


def replace_section(name: str, text: str, path: Path = BENCHMARKS_MD, *, heading: str | None = None) -> None:
    """Replace the text between ``<!-- name: begin -->`` and ``<!-- name: end -->`` (re-read just
    before); without the markers, append them under ``## heading`` when one is given."""
    begin, end = f"<!-- {name}: begin -->", f"<!-- {name}: end -->"
    path = Path(path)
    doc = path.read_text()
    i, j = doc.find(begin), doc.find(end)
    if (i < 0 or j < i) and heading:
        doc = doc.rstrip("\n") + f"\n\n## {heading}\n\n{begin}\n{end}\n"
        i, j = doc.find(begin), doc.find(end)
    if i < 0 or j < i:
        raise RuntimeError(f"{path}: markers {begin} / {end} not found")
    doc = doc[: i + len(begin)] + "\n" + text.strip("\n") + "\n" + doc[j:]
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.write_text(doc)
    os.replace(tmp, path)


def machine_section_empty(path: Path = BENCHMARKS_MD) -> bool:
    doc = path.read_text()
    m = re.search(r"<!-- machine: begin -->(.*?)<!-- machine: end -->", doc, re.S)
    return m is None or "filled in" in m.group(1) or not m.group(1).strip()


def md_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def fmt(x: object) -> str:
        if isinstance(x, float):
            return f"{x:.3f}"
        return str(x)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(fmt(x) for x in r) + " |" for r in rows]
    return "\n".join(lines)
