"""The options shared by smerge's commands, declared once (same names, same help everywhere).

Every command that reads records takes ``ProgressOpt``, ``JsonOpt``, ``StatsOpt`` and
``DebugOpt``; every command with one output takes ``OutputOpt`` (or its own ``-o``) and
``OverwriteOpt`` (tests/cli/test_contract.py walks every command and checks it).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from smerge.jobs.route import AUTO_CONF_KEY, AUTO_ENV, AUTO_MAX_BYTES

KeysOpt = Annotated[Optional[str], typer.Option("--keys", help="Merge keys K1,K2,.. (same names in both inputs). "
                                                "netCDF default: the coordinate variables of the chosen variables' dimensions.")]
KeysBOpt = Annotated[Optional[str], typer.Option("--keys-b", help="B's key names when they differ from A's.")]
VarsAOpt = Annotated[Optional[str], typer.Option("--vars-a", help="A's payload variables/columns (default: all).")]
VarsBOpt = Annotated[Optional[str], typer.Option("--vars-b", help="B's payload variables/columns (default: all).")]
EpsOpt = Annotated[str, typer.Option("--eps", help="Tolerance: one value, or per key: lat=0.01,lon=0.01,time=0.")]
WindowOpt = Annotated[int, typer.Option("--window", help="Window size N (records).")]
OutputOpt = Annotated[Optional[str], typer.Option("-o", "--output", help="Output (.parquet .nc .zarr .csv .arrow, a folder for a Parquet dataset, or an s3://... URL); default <stemA>+<stemB>.parquet.")]
FormatOpt = Annotated[Optional[str], typer.Option("--format", help="Output format: parquet, csv, arrow, netcdf, zarr (default: from the extension).")]
OverwriteOpt = Annotated[bool, typer.Option("--overwrite", help="Allow replacing an existing output.")]
IdsOpt = Annotated[bool, typer.Option("--with-ids", help="Add a_row, b_row (0-based row ids in the input streams).")]
UnmatchedOpt = Annotated[Optional[str], typer.Option("--unmatched", help="Write unmatched records to PREFIX.a.parquet and PREFIX.b.parquet.")]
StatsOpt = Annotated[Optional[str], typer.Option("--stats", help="Write the run's statistics as JSON to this path.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the statistics JSON on stdout instead of the summary.")]
DeltaOpt = Annotated[Optional[float], typer.Option("--delta", help="Check the best-effort delta-merge: allowed moving drop rate (0-1). Exit 3 when violated.")]
DeltaWOpt = Annotated[int, typer.Option("--delta-windows", help="M, the number of report windows in the moving average.")]
AdaptOpt = Annotated[bool, typer.Option("--adapt", help="Tune K_A, K_B between report windows to hold the moving drop "
                                        "rate at or under --delta at the least merge time (needs --delta; docs/cgm.md).")]
KappaOpt = Annotated[bool, typer.Option("--kappa-max", help="Also compute kappa_max (full sort-merge; holds all keys in memory).")]
LocalOpt = Annotated[bool, typer.Option("--local", help="Run in-process, no JVM (always).")]
MasterOpt = Annotated[Optional[str], typer.Option("--master", help="Spark master URL (local[*], local[N], spark://HOST:7077, "
                                                  "yarn, ...): always runs on Spark. Default auto: in-process when the "
                                                  f"local inputs total at most {AUTO_MAX_BYTES / 1e9:g} GB (--conf "
                                                  f"{AUTO_CONF_KEY}=N, ${AUTO_ENV}), else Spark local[*].")]
PartOpt = Annotated[Optional[int], typer.Option("--partitions", help="Spark partitions (default: the engine's choice).")]
ConfOpt = Annotated[Optional[list[str]], typer.Option("--conf", help="Spark setting KEY=VALUE (repeatable).")]
ProgressOpt = Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr (default: when stderr is a terminal).")]
NanOpt = Annotated[str, typer.Option("--nan-keys", help="NaN or missing keys: 'error' (default) or 'unmatched' (counted).")]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks of unexpected errors.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help="Show Spark's own log output.")]
