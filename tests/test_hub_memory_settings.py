"""The hub's memory settings reach what they bound (issue 13 (d)): DuckDB's ``memory_limit`` from
``storage.memory_limit``, glibc's arena count from ``limits.malloc_arenas``, and the hub's clock
hands memory freed in the malloc arenas back after each minute's upkeep."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpuscope import procmem
from gpuscope.alert.engine import AlertChange
from gpuscope.config import load_config
from gpuscope.evaluator import Evaluator
from gpuscope.hub import Hub
from gpuscope.runtime import assemble
from gpuscope.store.duckdb import DuckDBStore
from support import freed_arena_memory


def test_storage_memory_limit_reaches_duckdb(tmp_path: Path) -> None:
    config = tmp_path / "hub.yaml"
    config.write_text(f"storage: {{path: {tmp_path / 'a.duckdb'}, memory_limit: 300MB}}\n")
    cfg = load_config(config)
    assert cfg.storage.memory_limit == "300MB"
    runtime = assemble(cfg, serve=False, evaluate_interval=None)
    try:
        store = runtime.hub.store
        assert isinstance(store, DuckDBStore)
        limit = store._cursor().execute("SELECT current_setting('memory_limit')").fetchone()
        assert limit is not None and limit[0] in {"286.1 MiB", "286.1MiB", "300.0 MB"}, limit
    finally:
        runtime.stop()


#: runs ``run(arg)`` once per argument, each in a child forked from this interpreter: the hub's modules
#: are imported once, not once per configuration, and each child starts as a fresh process would,
#: with glibc's one main arena and its own mmap threshold (nothing before the fork set either)
_EACH_IN_A_CHILD = """
import os, traceback
for arg in sys.argv[1:]:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            run(arg)
        except BaseException:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            os._exit(code)
    status = os.waitpid(pid, 0)[1]
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"child for {arg!r} failed")
"""

#: N threads allocate at once (ctypes calls leave the GIL), then malloc_info lists the arenas (one
#: <heap nr=...> each); argument: "config,info"
_ARENAS = """
import ctypes, sys, threading
from gpuscope import procmem
from gpuscope.alert.engine import AlertChange
from gpuscope.config import load_config
from gpuscope.runtime import assemble
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
def arenas_to(path):
    f = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, f)
    libc.fclose(f)
def run(arg):
    config, info = arg.split(",")
    runtime = assemble(load_config(config), serve=False, evaluate_interval=None)
    barrier = threading.Barrier(8)
    def work():
        barrier.wait()
        for _ in range(20000):
            libc.free(libc.malloc(200))
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads: t.start()
    for t in threads: t.join()
    arenas_to(info)
    runtime.stop()
arenas_to(sys.argv[1].split(",")[1] + ".parent")
"""


def test_limits_malloc_arenas_bounds_glibc_arenas(tmp_path: Path) -> None:
    limits = {"default": "", "one": "limits: {malloc_arenas: 1}\n", "glibc": "limits: {malloc_arenas: 0}\n"}
    args = []
    for name, text in limits.items():
        config = tmp_path / f"{name}.yaml"
        config.write_text(f"storage: {{path: {tmp_path / name}.duckdb}}\n{text}")
        args.append(f"{config},{tmp_path / name}.xml")
    script = _ARENAS + _EACH_IN_A_CHILD
    subprocess.run([sys.executable, "-c", script, *args], check=True, timeout=120)

    def arenas(name: str) -> int:
        return (tmp_path / f"{name}.xml").read_text().count("<heap nr=")

    assert (tmp_path / "default.xml.parent").read_text().count("<heap nr=") == 1  # the children's start
    assert arenas("default") <= 2  # the hub's default
    assert arenas("one") == 1
    assert arenas("glibc") > 2  # glibc's own: 8 per core


#: a 16 MiB block freed (glibc would raise its mmap threshold to 16 MiB), then an 8 MiB block:
#: printed is whether that one was mapped on its own (malloc's mapped bytes grew); argument: the
#: hub's config, or "-" for no hub
_MMAP = """
import ctypes, sys
from gpuscope import procmem
from gpuscope.config import load_config
from gpuscope.runtime import assemble
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
def run(config):
    runtime = assemble(load_config(config), serve=False, evaluate_interval=None) if config != "-" else None
    libc.free(libc.malloc(16 << 20))
    before = procmem.snapshot().malloc_mmap_bytes
    block = libc.malloc(8 << 20)
    print(procmem.snapshot().malloc_mmap_bytes - before >= 8 << 20)
    libc.free(block)
    if runtime is not None:
        runtime.stop()
"""


def test_the_hub_keeps_large_blocks_out_of_the_arenas_after_larger_ones_were_freed(tmp_path: Path) -> None:
    if procmem.snapshot().malloc_mmap_bytes is None:
        pytest.skip("not glibc")
    config = tmp_path / "hub.yaml"
    config.write_text(f"storage: {{path: {tmp_path / 'a.duckdb'}}}\n")
    script = _MMAP + _EACH_IN_A_CHILD
    out = subprocess.run(
        [sys.executable, "-c", script, "-", str(config)], check=True, timeout=120, capture_output=True
    )
    # glibc's own: the threshold followed the freed block; the hub's: fixed, the block mapped alone
    assert out.stdout.decode().split() == ["False", "True"]


def test_the_clock_hands_freed_arena_memory_back_after_upkeep() -> None:
    # the hub is made first: what it allocates itself is not in the measured drop
    hub = Hub(DuckDBStore(":memory:", durable=False))
    clock = Evaluator(hub, interval=0.05)
    with freed_arena_memory():
        before = procmem.rss_bytes()
        clock.start()
        try:
            deadline = time.monotonic() + 30
            while procmem.rss_bytes() > before - 60 * 2**20 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert procmem.rss_bytes() <= before - 60 * 2**20
        finally:
            clock.stop()
            hub.store.close()


def test_a_long_upkeep_does_not_hold_the_detectors_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hourly seal takes tens of seconds; evaluation goes on beside it, on time."""
    hub = Hub(DuckDBStore(":memory:", durable=False))
    release = threading.Event()
    upkeeps: list[float] = []
    evaluations: list[float] = []
    evaluate = hub.evaluate

    def seal_under_way(now: float) -> None:
        upkeeps.append(now)
        release.wait(20)

    def counted(now: float) -> list[AlertChange]:
        evaluations.append(now)
        return evaluate(now)

    monkeypatch.setattr(hub, "maintain", seal_under_way)
    monkeypatch.setattr(hub, "evaluate", counted)
    clock = Evaluator(hub, interval=0.05)
    clock.start()
    try:
        deadline = time.monotonic() + 20
        while len(evaluations) < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert upkeeps and not release.is_set()
        assert len(evaluations) >= 10
        assert hub.overload.status(time.time())["evaluation_lag_seconds"] < 1.0
    finally:
        release.set()
        clock.stop()
        hub.store.close()
