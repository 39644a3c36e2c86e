"""Transport: background prefetching (dual buffering) and Arrow Flight: the index server
(``flight_server``, ``flight_security``, ``flight_gate``, ``flight_protocol``), its client
(``flight_client``), bearer tokens (``tokens``) and ``grpc://`` inputs (``flight_input``).

Only this package imports ``pyarrow.flight``.
"""

from smerge.transport.prefetch import BackgroundWriter, Prefetcher

__all__ = ["BackgroundWriter", "Prefetcher"]
