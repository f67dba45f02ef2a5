"""argparse ``type`` functions for numbers a user types: a bad value is refused by argparse, naming
its option (``argument --port: ...``, exit status 2), before anything starts or binds."""

from __future__ import annotations

import argparse
import math


def port_number(value: str) -> int:
    """A TCP port to listen on, 1-65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535 (got {value!r})") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"must be a port number from 1 to 65535 (got {port})")
    return port


def positive_seconds(value: str) -> float:
    """A length of time in seconds, more than 0."""
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds more than 0 (got {value!r})") from None
    if not (seconds > 0 and math.isfinite(seconds)):
        raise argparse.ArgumentTypeError(f"must be a number of seconds more than 0 (got {value})")
    return seconds
