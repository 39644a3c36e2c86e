"""``smerge batch JOBS.toml``: several CGM merges in one Spark session (cron-friendly).

Every job is validated before Spark starts; jobs then run one after another in the same
session. A job that fails is reported and the others still run. One statistics JSON per job
(``stats``, default ``<output>.stats.json``) and a summary JSON (``--summary``, default
``<JOBS>.summary.json``). Exit code: 0 all jobs ok; 3 some job violated its ``delta`` (all
outputs written); 2 some job failed on bad input/options; 1 some job failed unexpectedly.
Relative paths in the file are relative to the file's directory.
"""

from __future__ import annotations

import json
import os
import time
import tomllib
from typing import Annotated, Any, Optional

import typer

from smerge.cli.common import (EXIT_DELTA, EXIT_INTERNAL, EXIT_OK, EXIT_USAGE, choose_route, parse_conf,
                               progress_enabled, run_guarded, split_list, tqdm_progress)
from smerge.cli.flags import flag
from smerge.errors import SmergeError, UsageError
from smerge.merge.params import DEFAULT_DELTA_WINDOWS, DEFAULT_LEAST_INCREMENT, DEFAULT_WINDOW_SIZE
from smerge.merge.values import parse_eps

app = typer.Typer(add_completion=False)

JOB_KEYS = {
    "name": str, "a": str, "b": str, "output": str, "format": str, "keys": (str, list), "keys_b": (str, list),
    "vars_a": (str, list), "vars_b": (str, list), "eps": (int, float, str, dict), "window": int,
    "increment": int, "increment_a": int, "increment_b": int, "with_ids": bool, "nan_keys": str,
    "delta": (int, float), "delta_windows": int, "adapt": bool, "unmatched": str, "stats": str, "kappa_max": bool,
    "overwrite": bool, "partitions": int,
}
PATH_KEYS = ("a", "b", "output", "unmatched", "stats")


def _names(v) -> tuple[str, ...] | None:
    if v is None:
        return None
    return tuple(v) if isinstance(v, list) else split_list(v)


def load_jobs(path: str) -> tuple[dict, list[dict]]:
    """(spark settings, jobs with defaults applied and paths resolved); raises UsageError."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such jobs file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a jobs file; name the TOML file") from None
    except OSError as e:
        raise UsageError(f"{path}: cannot read the jobs file ({e.strerror or e})") from None
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                         "save the jobs file as UTF-8") from None
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path}: not valid TOML ({e})") from None
    unknown = set(doc) - {"spark", "defaults", "job"}
    if unknown:
        raise UsageError(f"{path}: unknown section(s) {', '.join(sorted(unknown))}; use [spark], [defaults], [[job]]")
    spark = dict(doc.get("spark", {}))
    bad = set(spark) - {"master", "partitions", "conf"}
    if bad:
        raise UsageError(f"{path}: [spark] has unknown key(s) {', '.join(sorted(bad))}; use master, partitions, conf")
    defaults = dict(doc.get("defaults", {}))
    jobs = doc.get("job", [])
    if not isinstance(jobs, list) or not jobs:
        raise UsageError(f"{path}: no [[job]] tables; each job needs at least a = ... and b = ...")
    base = os.path.dirname(os.path.abspath(path))
    out = []
    for i, raw in enumerate(jobs):
        j = {**defaults, **raw}
        name = str(j.get("name", f"job{i + 1}"))
        for k, v in j.items():
            if k not in JOB_KEYS:
                raise UsageError(f"{path}: job {name!r} has unknown key {k!r}; known: {', '.join(sorted(JOB_KEYS))}")
            if not isinstance(v, JOB_KEYS[k]) or (isinstance(v, bool) and JOB_KEYS[k] is int):
                raise UsageError(f"{path}: job {name!r}: {k} = {v!r} has the wrong type")
        for k in ("a", "b"):
            if k not in j:
                raise UsageError(f"{path}: job {name!r} has no {k!r} (input path)")
        if j.get("adapt") and j.get("delta") is None:
            raise UsageError(f"{path}: job {name!r}: adapt = true tunes K to hold the moving drop rate at or under "
                             "delta; give delta = D too")
        for k in PATH_KEYS:
            if k in j and "://" not in j[k]:
                j[k] = os.path.join(base, os.path.expanduser(j[k]))
        if "output" not in j and "://" in j["a"]:  # A at a URL: the default output goes beside the file
            from smerge.jobs import default_output

            j["output"] = os.path.join(base, default_output(j["a"], j["b"]))
        j["name"] = name
        out.append(j)
    names = [j["name"] for j in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"{path}: job names must be unique; repeated: {', '.join(dup)}")
    return spark, out


def make_job(j: dict[str, Any]):
    from smerge.jobs import CGMJob, default_output

    output = j.get("output") or os.path.join(os.path.dirname(j["a"]), default_output(j["a"], j["b"]))
    inc = j.get("increment", DEFAULT_LEAST_INCREMENT)
    eps = j.get("eps", 0.0)
    if isinstance(eps, str):
        eps = parse_eps(eps)
    return CGMJob(
        a=j["a"], b=j["b"], output=output, format=j.get("format"), keys_a=_names(j.get("keys")),
        keys_b=_names(j.get("keys_b")), vars_a=_names(j.get("vars_a")), vars_b=_names(j.get("vars_b")),
        eps=eps, window_size=j.get("window", DEFAULT_WINDOW_SIZE), least_increment_a=j.get("increment_a", inc),
        least_increment_b=j.get("increment_b", inc), with_ids=j.get("with_ids", False),
        nan_keys=j.get("nan_keys", "error"), delta=j.get("delta"), delta_windows=j.get("delta_windows", DEFAULT_DELTA_WINDOWS),
        adapt=j.get("adapt", False),
        unmatched=j.get("unmatched"), stats=j.get("stats") or f"{output.rstrip('/' + os.sep)}.stats.json",
        kappa_max=j.get("kappa_max", False), overwrite=j.get("overwrite", False),
        command=f"smerge batch (job {j['name']})",
    )


def check_batch_paths(jobs: list[dict[str, Any]], summary_path: str, jobs_file: str | None = None) -> None:
    """Before any job runs: no two outputs of the file (outputs, unmatched files, stats, the
    summary) share a real path or lie inside a folder output, no output of a job is an input of
    any job nor the jobs file itself (``smerge.datasets.outputs.check_distinct``), and the summary
    can be written (``check_target``: not a directory, its folder exists and is writable); exit 2.
    A job whose options are bad is left to fail on its own when it runs."""
    from smerge.datasets.outputs import check_distinct, check_target, local_real
    from smerge.datasets.writers import is_dataset_path

    inputs: list[str] = [jobs_file] if jobs_file else []
    outputs: list[tuple[str, str, bool]] = []
    for j in jobs:
        try:
            cj = make_job(j)
        except SmergeError:
            continue
        inputs += [cj.a, cj.b]
        who = f"job {j['name']!r}"
        outputs.append((f"{who} output", cj.output, is_dataset_path(cj.output, cj.format)))
        if cj.unmatched:
            outputs += [(f"{who} unmatched", f"{cj.unmatched}.{s}.parquet", False) for s in ("a", "b")]
        outputs.append((f"{who} stats", cj.stats, False))
    outputs.append(("--summary", summary_path, False))
    if jobs_file:
        own = local_real(jobs_file)
        for opt, path, _ in outputs:
            if local_real(path.rstrip("/" + os.sep) or path) == own:
                raise UsageError(f"{opt} {path!r} is the jobs file {jobs_file!r}, an input that is never written: "
                                 "choose another path")
    check_distinct(inputs, outputs)
    check_target(summary_path, overwrite=True, folder=False, inputs=inputs, opt="--summary")


@app.command("batch")
def batch(
    jobs_file: Annotated[str, typer.Argument(help="TOML file with [spark], [defaults] and [[job]] tables.")],
    master: Annotated[Optional[str], typer.Option("--master", help="Spark master URL (overrides [spark] master). Default auto: "
                                                  "every job in-process when all jobs' local inputs total at most the "
                                                  "threshold of `smerge cgm --master`, else one Spark local[*] session.")] = None,
    partitions: Annotated[Optional[int], typer.Option("--partitions", help="Spark partitions per job (overrides the file).")] = None,
    conf: Annotated[Optional[list[str]], typer.Option("--conf", help="Spark setting KEY=VALUE (repeatable; overrides the file).")] = None,
    local: Annotated[bool, typer.Option("--local", help="Run every job in-process, no JVM.")] = False,
    summary: Annotated[Optional[str], typer.Option("--summary", help="Summary JSON path (default <JOBS>.summary.json).")] = None,
    stats: Annotated[Optional[str], typer.Option("--stats", help="The run's statistics JSON: the summary (the same "
                                                                  "file as --summary).")] = None,
    json_: Annotated[bool, typer.Option("--json", help="Print the summary JSON instead of one line per job.")] = False,
    progress: Annotated[Optional[bool], typer.Option("--progress/--no-progress", help="Progress bar on stderr.")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", help="Show Spark's own log output.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks of unexpected errors.")] = False,
) -> None:
    """Run several CGM merges from a TOML file in one Spark session (or, small inputs, in-process); one stats JSON per job."""

    def body() -> int:
        t_run = time.perf_counter()
        if summary is not None and stats is not None:
            raise UsageError("--stats and --summary name the same file (the run's statistics): give one")
        spark_cfg, jobs = load_jobs(jobs_file)
        summary_path = summary or stats or f"{os.path.splitext(jobs_file)[0]}.summary.json"
        check_batch_paths(jobs, summary_path, jobs_file)
        file_conf = spark_cfg.get("conf", {})
        if not isinstance(file_conf, dict):
            raise UsageError(f"{jobs_file}: [spark] conf must be a table of KEY = \"VALUE\"")
        spark_conf = {str(k): str(v) for k, v in file_conf.items()}
        spark_conf.update(parse_conf(conf))
        # One route for the whole file (one session or none): auto decides on all jobs' inputs.
        from smerge.jobs import needs_spark_readers

        readers = False
        if not local:
            for j in jobs:
                try:
                    readers = readers or needs_spark_readers(make_job(j), spark_conf)
                except SmergeError:
                    pass  # the job fails on its own when it runs
        route = choose_route(local=local, master=master or spark_cfg.get("master"),
                             inputs=[p for j in jobs for p in (j["a"], j["b"])], conf=spark_conf,
                             spark_readers=readers)
        on_spark, the_master = route.spark, route.master
        default_parts = partitions or spark_cfg.get("partitions")
        bar = tqdm_progress(progress_enabled(progress))
        session = None
        session_seconds = 0.0
        records = []
        try:
            for j in jobs:
                rec: dict[str, Any] = {"name": j["name"], "a": j["a"], "b": j["b"]}
                t = time.perf_counter()
                try:
                    from smerge.jobs.pipeline import RunOptions, execute

                    cj = make_job(j)  # paths in the file are already absolute (load_jobs)
                    rec["output"], rec["stats"] = cj.output, cj.stats
                    if on_spark and session is None:
                        from smerge.spark.session import split_conf, start_session

                        t0 = time.perf_counter()
                        session = start_session(the_master, split_conf(spark_conf)[0], verbose=verbose)
                        session_seconds = time.perf_counter() - t0
                    # the file's route for every job, in the one session: the pipeline of every command
                    result = execute(cj, RunOptions(partitions=j.get("partitions", default_parts), conf=spark_conf,
                                                    progress=bar, verbose=verbose, spark=session), route=route)
                    rec.update(status="delta_violated" if result.get("delta_ok") is False else "ok",
                               matched=result["matched"], a_records=result["a_records"],
                               b_records=result["b_records"], match_pct=result["match_pct"],
                               delta_ok=result.get("delta_ok"), total_seconds=result["total_seconds"])
                except SmergeError as e:
                    rec.update(status="failed", exit_code=e.exit_code, error=e.message(flag))
                except Exception as e:  # one job's internal error does not stop the others
                    if debug:
                        import traceback

                        traceback.print_exc()
                    msg = str(e).splitlines()[0] if str(e) else ""
                    rec.update(status="failed", exit_code=EXIT_INTERNAL, error=f"{type(e).__name__}: {msg}")
                rec.setdefault("total_seconds", time.perf_counter() - t)
                records.append(rec)
        finally:
            if session is not None:
                session.stop()
        codes = [r.get("exit_code", 0) for r in records if r["status"] == "failed"]
        code = (EXIT_INTERNAL if EXIT_INTERNAL in codes else EXIT_USAGE) if codes else (
            EXIT_DELTA if any(r["status"] == "delta_violated" for r in records) else EXIT_OK)
        doc = {"jobs_file": os.path.abspath(jobs_file), "execution": "spark" if on_spark else "local",
               "master": the_master if on_spark else None, "route": route.why,
               "session_seconds": session_seconds, "session_start_seconds": session_seconds,
               "total_seconds": time.perf_counter() - t_run,
               "jobs": records, "ok": sum(r["status"] == "ok" for r in records),
               "delta_violated": sum(r["status"] == "delta_violated" for r in records),
               "failed": sum(r["status"] == "failed" for r in records), "exit_code": code}
        from smerge.jobs import write_stats

        write_stats(summary_path, doc, opt="--summary")  # the summary of each run replaces the last one
        for r in records:  # one stderr line per failed job, also with --json
            if r["status"] == "failed":
                typer.echo(f"smerge batch: job {r['name']} failed: {r['error']}", err=True)
        if json_:
            typer.echo(json.dumps(doc, indent=2, default=float))
        else:
            for r in records:
                if r["status"] == "failed":
                    typer.echo(f"{r['name']}: FAILED: {r['error']}")
                else:
                    typer.echo(f"{r['name']}: {r['status']}  matched {r['matched']:,} "
                               f"({r['match_pct']:.2f}% of A)  {r['total_seconds']:.2f} s -> {r['output']}")
            typer.echo(f"{doc['ok']} ok, {doc['delta_violated']} delta violated, {doc['failed']} failed"
                       f" (route: {route.why})")
        return code

    run_guarded(body, debug=debug)
