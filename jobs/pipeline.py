"""The one run pipeline: Job -> route -> prepare -> run (in-process or on Spark) -> statistics.

Every command that runs an engine goes through ``execute(job, options)``: ``smerge cgm``,
``rtm``, ``wjoin`` and ``count`` (one job each) and ``smerge batch`` (its jobs one after another,
in one Spark session when they run on Spark). A CLI command is options -> Job -> ``execute`` -> print.
What differs between engines is a row of ``ENGINES``: how a job of that kind is prepared and run,
which inputs decide its route and which archive inputs it samples; the skeleton is written once:

1. the route (``smerge.jobs.route``): ``--local``, ``--master``, spark-submit, or the inputs' size
   (an engine without a Spark runner, ``count``, always runs in-process);
2. the run's sampling (``smerge.jobs.sampling``): a ``Sampling`` with the fraction asked for each
   archive input, put on the job (``job.sampling``) for the code that opens the inputs; the
   archive reads report to it, and the statistics of step 6 are built from it;
3. on Spark, every local path made absolute (executors resolve paths from their own folder);
4. prepare (inputs opened for their metadata, parameters and outputs checked) -- on Spark, for
   inputs only Spark's readers open, inside the session;
5. run in-process or on Spark, with the progress factory;
6. the statistics every route reports alike: ``route`` (which route ran and why),
   ``total_seconds`` (the whole run, the Spark session's start included), ``session_seconds``
   (that start, 0 in-process), ``output`` as the user named it, the sampling estimates; the
   ``--stats`` file rewritten with them.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from smerge.jobs.route import Route, choose_route, under_spark_submit
from smerge.errors import param


@dataclass(frozen=True)
class RunOptions:
    """Where and how to run a job (the options every engine command shares)."""

    local: bool = False
    master: str | None = None
    partitions: int | None = None
    conf: Mapping[str, str] = field(default_factory=dict)
    progress: Callable | None = None
    verbose: bool = False
    spark: Any = None  # a running session to use (batch); it is not stopped
    # --sample-a / --sample-b (cgm, rtm) or --sample (wjoin) as given, and --budget
    samples: tuple = ()
    budget: str | None = None


@dataclass(frozen=True)
class Engine:
    """What the pipeline needs of one engine; every callable takes the job (or prepared run)."""

    name: str
    prepare: Callable  # job -> prepared run
    run_local: Callable  # (prep, progress=) -> statistics
    run_spark: Callable | None  # (prep, master=, partitions=, conf=, progress=, verbose=, spark=) -> statistics;
    # None: no Spark route (the run is in-process whatever the options say)
    inputs: Callable  # job -> the input paths that decide the route
    request_samples: Callable  # (job, options, spark) -> the run's Sampling
    sample_stats: Callable  # (result, job) -> None; from job.sampling
    spark_prepared: Callable = lambda job, conf: False  # True: prepared inside the session (URL inputs)


def _on_spark(module: str, runner: str) -> Callable:
    """The Spark runner ``module.runner``, imported when a run goes to Spark (never before)."""
    def run(prep, **kw):
        import importlib

        return getattr(importlib.import_module(module), runner)(prep, **kw)

    return run


def _merge_engine(name: str, prepare: Callable, run_local: Callable, module: str, runner: str, **more) -> Engine:
    """cgm and rtm: inputs A and B, sampled with --sample-a / --sample-b."""
    from smerge.jobs.sampling import apply_samples, sample_stats

    return Engine(
        name=name, prepare=prepare, run_local=run_local, run_spark=_on_spark(module, runner),
        inputs=lambda j: (j.a, j.b),
        request_samples=lambda j, o, spark: apply_samples(_pairs(j, o), spark=spark, budget=o.budget),
        sample_stats=lambda r, j: sample_stats(r, (("a", j.a), ("b", j.b)), j.sampling), **more)


def _cgm() -> Engine:
    from smerge.jobs.cgm import prepare, run_local
    from smerge.jobs.inputs import needs_spark_readers

    return _merge_engine("cgm", prepare, run_local, "smerge.spark.cgm.runner", "run_cgm_spark",
                         spark_prepared=needs_spark_readers)


def _rtm() -> Engine:
    from smerge.jobs.rtm import prepare_rtm, run_rtm

    return _merge_engine("rtm", prepare_rtm, run_rtm, "smerge.spark.rtm", "run_rtm_spark")


def _sample_every_input(inputs: Callable) -> Callable:
    """wjoin's and count's ``--sample F|auto``: every archive input of the job read with F."""
    from smerge.jobs.sampling import apply_sample_all

    return lambda j, o, spark: apply_sample_all(o.samples[0] if o.samples else None, inputs(j), spark=spark,
                                                budget=o.budget)


def _wjoin() -> Engine:
    from smerge.jobs.sampling import wjoin_sample_stats
    from smerge.jobs.wjoin import prepare, run_local

    return Engine(
        name="wjoin", prepare=prepare, run_local=run_local,
        run_spark=_on_spark("smerge.spark.wjoin", "run_wjoin_spark"), inputs=lambda j: j.inputs,
        request_samples=_sample_every_input(lambda j: j.inputs),
        sample_stats=lambda r, j: wjoin_sample_stats(r, j.inputs, j.sampling))


def _count() -> Engine:
    from smerge.jobs.count import prepare, run_local
    from smerge.jobs.sampling import count_sample_stats

    return Engine(
        name="count", prepare=prepare, run_local=run_local, run_spark=None, inputs=lambda j: (j.source,),
        request_samples=_sample_every_input(lambda j: (j.source,)),
        sample_stats=lambda r, j: count_sample_stats(r, j.source, j.sampling))


def _pairs(job, options: RunOptions):
    a, b = (tuple(options.samples) + (None, None))[:2]
    return ((param.sample_a, a, job.a), (param.sample_b, b, job.b))


ENGINES = {"CGMJob": _cgm, "RTMJob": _rtm, "WJoinJob": _wjoin, "CountJob": _count}


def engine_for(job) -> Engine:
    try:
        return ENGINES[type(job).__name__]()
    except KeyError:
        raise TypeError(f"no engine runs a {type(job).__name__}") from None


def in_process_route(command: str) -> Route:
    """The route of a command that runs in-process only (count; gen, index build, archive append)."""
    return Route(False, None, f"local ({command} runs in-process; it has no Spark route)")


def route_for(job, options: RunOptions) -> Route:
    engine = engine_for(job)
    if engine.run_spark is None:
        return in_process_route(engine.name)
    spark_prepared = not options.local and engine.spark_prepared(job, dict(options.conf))
    return choose_route(local=options.local, master=options.master, inputs=tuple(engine.inputs(job)),
                        conf=dict(options.conf), spark_readers=spark_prepared)


def execute(job, options: RunOptions = RunOptions(), *, route: Route | None = None,
            before_run: Callable[[Any], None] | None = None) -> dict:
    """Run ``job`` (a ``CGMJob``, ``RTMJob``, ``WJoinJob`` or ``CountJob``) the way ``options``
    say and return its statistics. ``route``: decided already (``route_for``); ``before_run(job)``:
    a last check by the caller once the route is known and paths are final (the CLI's ``--plot``
    file)."""
    t0 = time.perf_counter()
    engine = engine_for(job)
    conf = dict(options.conf)
    route = route or route_for(job, options)
    spark_prepared = route.spark and engine.spark_prepared(job, conf)
    job = replace(job, sampling=engine.request_samples(job, options, route.spark))  # this run's, no other's
    named = job  # paths as the user named them (the statistics show them so on every route)
    if route.spark:  # executors resolve relative paths from their own working folder
        from smerge.jobs.paths import absolute_path, with_absolute_paths

        job = with_absolute_paths(job)
        if spark_prepared and job.output is None:
            from smerge.jobs.outputs import default_output

            job = replace(job, output=absolute_path(default_output(job.a, job.b)))
    if before_run is not None:
        before_run(job)
    prep = job if spark_prepared else engine.prepare(job)
    if route.spark and prep is not job:
        from smerge.jobs.paths import absolute_output

        absolute_output(prep)
    if not route.spark:
        result = engine.run_local(prep, progress=options.progress)
    else:
        master = route.master
        if master is not None and under_spark_submit() and options.master in (None, "auto"):
            master = None  # the master and settings spark-submit configured
        result = engine.run_spark(prep, master=master, partitions=options.partitions, conf=conf,
                                  progress=options.progress, verbose=options.verbose, spark=options.spark)
    engine.sample_stats(result, job)
    for name in ("a", "b"):  # inputs as named (Spark made them absolute for its executors)
        if isinstance(result.get(name), str) and isinstance(getattr(named, name, None), str):
            result[name] = getattr(named, name)
    if "inputs" in result and getattr(named, "inputs", None):
        result["inputs"] = list(named.inputs)
    return finish(result, route, t0, named_output=named.output, stats_path=job.stats,
                  overwrite=getattr(job, "overwrite", False))


def finish(result: dict, route: Route, t0: float, *, named_output: str | None, stats_path: str | None,
           overwrite: bool = False) -> dict:
    """The statistics every route reports alike (see the module doc), and the ``--stats`` file."""
    result["route"] = route.why
    result["session_seconds"] = float(result.get("session_start_seconds") or 0.0)
    result["total_seconds"] = time.perf_counter() - t0
    out = result.get("output")
    if named_output is not None and isinstance(out, str) and os.path.isabs(out) and not os.path.isabs(named_output) \
            and "://" not in named_output:
        result["output"] = named_output  # as the user named it
    elif named_output is None and isinstance(out, str) and os.path.isabs(out):
        try:
            result["output"] = os.path.relpath(out)  # the default, in the working folder
        except ValueError:
            pass
    if stats_path:
        from smerge.jobs.outputs import write_stats

        write_stats(stats_path, result)  # this run wrote (and claimed) it already: rewritten in place
    return result


__all__ = ["RunOptions", "Engine", "ENGINES", "engine_for", "in_process_route", "route_for", "execute", "finish"]
