"""The per-node agent: collect every interval, send to the hub, spool to disk while it is away.

Nothing is imported here: the training and inference SDK ships through ``sender`` and ``spool``,
and importing this package must not pull in the collectors (NVML, psutil) of the node agent.
"""
