"""Where telemetry, events, training records and alerts are kept.

:mod:`.base` is the seam (the :class:`~.base.Store` protocol); :mod:`.registry`, :mod:`.batch_ids`,
:mod:`.prepare` and :mod:`.replay` are shared by every backend; :mod:`.duckdb` (embedded) and
:mod:`.remote` (a Prometheus-compatible TSDB with a meta store) are the backends, and
:mod:`.settings` builds the one the config names from its ``BACKENDS`` table.
"""
