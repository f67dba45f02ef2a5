"""Start-up of the ``gpuscope`` command: what a hub (or any subcommand) pays before it does anything.

For each command line, the median wall time of ``--runs`` fresh interpreters and the number of
modules loaded (``sys.modules`` at exit: the same on a loaded machine as on an idle one). Then a
real ``gpuscope hub`` from start to its first answer on ``/api/v1/health``, the wait that test
helpers and service managers sit through.

Anchors, same run: the bare interpreter (``python -c pass``) and ``import numpy, httpx, rich``,
libraries every subcommand loads anyway; the CLI's own cost is the difference. ``--before SRC``
also runs each gpuscope command on another source tree (e.g. ``git archive`` of an older commit),
its runs taking turns with this tree's, so both see the same machine load.

usage: python bench/bench_cli_start.py [--runs 7] [--hub-runs 3] [--before SRC]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import console, gpuscope_hub, print_table

#: prints the number of loaded modules when the interpreter exits, after the command ran
COUNT_MODULES = "import atexit, sys; atexit.register(lambda: print(len(sys.modules), file=sys.stderr))"

COMMANDS: dict[str, list[str]] = {
    "anchor: python -c pass": ["-c", "pass"],
    "anchor: import numpy, httpx, rich.console": ["-c", "import numpy, httpx, rich.console"],
    "gpuscope --help": ["-m", "gpuscope.cli", "--help"],
    "gpuscope hub --help": ["-m", "gpuscope.cli", "hub", "--help"],
    "gpuscope agent --help": ["-m", "gpuscope.cli", "agent", "--help"],
    "gpuscope loadgen --help": ["-m", "gpuscope.cli", "loadgen", "--help"],
}


def run_once(args: list[str], src: Path | None = None) -> tuple[float, int]:
    """Wall seconds of one fresh interpreter running ``args``, and the modules it had loaded."""
    if args[0] == "-m":  # run the module after registering the counter, as ``-m`` would
        code = f"{COUNT_MODULES}; import runpy; sys.argv = {[args[1], *args[2:]]!r}; "
        code += f"runpy.run_module({args[1]!r}, run_name='__main__', alter_sys=True)"
    else:
        code = f"{COUNT_MODULES}; {args[1]}"
    t0 = time.perf_counter()
    env = os.environ if src is None else {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"{args} exited {done.returncode}:\n{done.stderr}")
    return wall, int(done.stderr.strip().splitlines()[-1])


def hub_to_health(runs: int) -> list[float]:
    """Seconds from starting a real hub process to its first answer on /api/v1/health."""
    out = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            with gpuscope_hub(Path(tmp) / "hub.duckdb"):
                out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7, help="fresh interpreters per command line (7)")
    ap.add_argument("--hub-runs", type=int, default=3, help="hubs started to their health answer (3)")
    ap.add_argument("--before", type=Path, default=None, help="another src/ to compare, runs taking turns")
    a = ap.parse_args()
    load0 = os.getloadavg()[0]
    rows = []
    for name, args in COMMANDS.items():
        trees: list[tuple[str, Path | None]] = [(name, None)]
        if a.before is not None and args[0] == "-m":
            trees.insert(0, (f"{name} (before)", a.before.resolve()))
        runs: dict[str, list[tuple[float, int]]] = {label: [] for label, _ in trees}
        for _ in range(a.runs):
            for label, src in trees:
                runs[label].append(run_once(args, src))
        for label, done in runs.items():
            walls = [w for w, _ in done]
            rows.append([label, f"{statistics.median(walls):.3f}", f"{min(walls):.3f}", str(done[-1][1])])
            console.print(f"{label}: {statistics.median(walls):.3f} s")
    if a.hub_runs > 0:
        health = hub_to_health(a.hub_runs)
        rows.append(
            [
                "gpuscope hub: start to /api/v1/health",
                f"{statistics.median(health):.3f}",
                f"{min(health):.3f}",
                "-",
            ]
        )
    load1 = os.getloadavg()[0]
    print_table(
        f"start-up, median of {a.runs} runs ({os.cpu_count()} cores, load {load0:.1f} -> {load1:.1f})",
        ["command", "median s", "min s", "modules loaded"],
        rows,
    )


if __name__ == "__main__":
    main()
