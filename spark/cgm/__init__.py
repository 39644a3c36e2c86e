"""Spark execution of the CGM merge (the modules only ``smerge cgm`` uses on Spark).

``runner`` (``run_cgm_spark``: the driver side), ``plan`` (chunk statistics, k1 scans, the
partitions' bounds), ``windows`` (the partitions' windows and the expected-pairs estimate),
``tasks`` (the partition task and the ownership rule; what executors import), ``rows`` (a
task's map from stream positions to values), ``seams`` (seam pairs resolved on the driver),
``assemble`` (the final outputs from the parts). The modules every runner shares stay in
``smerge.spark``.

Nothing is imported here: executors import ``smerge.spark.cgm.tasks`` alone.
"""
