"""Frequent-item counting (docs/semantics.md section 9): counts of items per time interval, exact
from raw records or estimated from a server's summarised stream.

- ``hcount``: the hCount sketch (h x m counters) and eFreq, which picks a lifetime's frequent items;
- ``itemcount``: ``ItemCounts``, one count query (``--every`` intervals or one range) over raw
  records and derived-bodies, and the time column's ticks (durations, date-times);
- ``summary``: the summarised stream's wire format, its sender (``summarize``, which ``smerge
  serve --summarize`` offers) and its receiver (``SummaryReceiver``).

The ``count`` job (``smerge.jobs.count``) runs these through the one pipeline. Layering: this
package may import ``smerge.merge``, ``smerge.datasets``, ``smerge.transport`` and
``smerge.index``; none of those imports it (a server gets its summariser handed in).
"""
