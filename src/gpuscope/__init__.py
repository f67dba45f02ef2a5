"""gpuscope: monitoring for GPU clusters and the ML work running on them."""

__version__ = "0.1.0"
