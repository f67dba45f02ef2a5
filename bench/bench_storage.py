"""Storage efficiency (bytes per sample on disk) and store-level append rate: DuckDBStore vs VictoriaMetrics.

Both store the same generated GPU telemetry in the same run: 64 GPUs x 30 metrics x 1 Hz x 2 h by
default. Values are float32 (what DuckDBStore keeps) and VictoriaMetrics receives their shortest
decimal form, so neither gets more information than the other. Budget (DESIGN §6): <= 0.8
bytes/sample; anchor: VictoriaMetrics, measured after a forced flush and again once its merges
finish (its steady state).

DuckDBStore is driven like the hub drives it: one append thread per node (agent batches of 5 s),
and upkeep (rollups, which seal each closed hour into a zstd Parquet chunk) every 5 minutes of
data time. Reported: everything on disk (database file, WAL, chunk files: raw telemetry plus
1-minute and 1-hour rollups), the raw telemetry alone, and the same data never sealed (kept in
DuckDB's own table) to show what sealing buys.

The generated telemetry follows what H100s under a training job report: utilisation pinned near
100 % with data-loader dips and checkpoint pauses, bursts on idle GPUs, DCGM activity ratios that
follow utilisation (3 decimals), power in mW with load-dependent noise, temperature as a
first-order response to power at 0.1 C, mostly constant clocks and memory, rare throttle events,
monotone counters (energy in mJ, violation time, ECC), noisy PCIe/NVLink throughput (KB
resolution), and per-node timestamp jitter of a few ms. ``--data common`` uses instead the
generator of ``bench/common.py`` that the ingest benchmark uses.

usage: python bench/bench_storage.py [--gpus 64] [--hours 2] [--data gpu|common] [--no-vm]
       [--seal-interval 60]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import duckdb
import httpx
import numpy as np

from common import Fleet, console, dir_bytes, print_table, telemetry_ticks, victoria_metrics
from gpuscope.model import Batch, Frame
from gpuscope.store.duckdb import DuckDBStore
from gpuscope.store.sealing import DEFAULT_SEAL_INTERVAL_S

GPUS_PER_NODE = 8
MAINTAIN_S = 300  # data seconds between maintenance calls (the hub runs it every minute)
METRICS = [
    "gpu_utilization_percent", "gpu_sm_active_ratio", "gpu_sm_occupancy_ratio", "gpu_tensor_active_ratio",
    "gpu_dram_active_ratio", "gpu_memory_utilization_percent", "gpu_memory_used_bytes",
    "gpu_memory_free_bytes", "gpu_memory_reserved_bytes", "gpu_memory_total_bytes", "gpu_temp_celsius",
    "gpu_memory_temp_celsius",
    "gpu_power_watts", "gpu_power_limit_watts", "gpu_energy_joules_total", "gpu_sm_clock_mhz",
    "gpu_memory_clock_mhz", "gpu_clock_event_reasons", "gpu_throttle_sw_power", "gpu_throttle_hw_slowdown",
    "gpu_throttle_sw_thermal", "gpu_throttle_hw_thermal", "gpu_throttle_hw_power_brake",
    "gpu_violation_power_seconds_total", "gpu_ecc_sbe_volatile_total", "gpu_ecc_dbe_volatile_total",
    "gpu_pcie_tx_bytes_per_second", "gpu_pcie_rx_bytes_per_second", "gpu_pcie_replay_total",
    "gpu_nvlink_tx_bytes_per_second",
]  # fmt: skip
M = {name: j for j, name in enumerate(METRICS)}


@dataclass
class Telemetry:
    ts: np.ndarray  # (ticks, nodes) seconds
    values: np.ndarray  # (ticks, gpus, metrics) float32, NaN = not reported
    names: list[str]
    entities: list[dict[str, str]]

    @property
    def samples(self) -> int:
        return int(np.count_nonzero(~np.isnan(self.values)))


class GpuFleet:
    """Per-second H100 telemetry with state carried across chunks (temperatures, counters)."""

    def __init__(self, gpus: int, seed: int) -> None:
        self.g = gpus
        self.rng = np.random.default_rng(seed)
        self.busy = np.arange(gpus) < gpus * 3 // 4  # a quarter of the fleet sits idle
        self.temp = 45 + self.rng.normal(0, 2, gpus)
        self.energy = 1e6 * (1 + self.rng.random(gpus))
        self.violation = np.zeros(gpus)
        self.sbe = self.rng.integers(0, 4, gpus).astype(float)
        self.mem_used = np.where(self.busy, 72_000 * 2**20, 0).astype(float)

    def chunk(self, t0: int, n: int) -> np.ndarray:
        rng, g, busy = self.rng, self.g, self.busy
        v = np.zeros((n, g, len(METRICS)))
        t = t0 + np.arange(n)
        util = np.where(busy, 100.0, 0.0) * np.ones((n, 1))
        dips = busy & (rng.random((n, g)) < 0.05)  # data-loader stalls
        util = np.where(dips, rng.integers(20, 95, (n, g)), util)
        ckpt = (t % 600) < 20  # checkpoint pauses every 10 minutes
        util[ckpt] = np.where(busy, rng.integers(0, 10, (int(ckpt.sum()), g)), 0)
        bursts = ~busy & (rng.random((n, g)) < 0.02)
        util = np.where(bursts, rng.integers(1, 60, (n, g)), util)
        u = util / 100.0
        v[..., M["gpu_utilization_percent"]] = util
        for name, scale, noise in (
            ("gpu_sm_active_ratio", 0.92, 0.01),
            ("gpu_sm_occupancy_ratio", 0.45, 0.01),
            ("gpu_tensor_active_ratio", 0.55, 0.02),
            ("gpu_dram_active_ratio", 0.35, 0.01),
        ):
            v[..., M[name]] = np.round(np.clip(u * scale + rng.normal(0, noise, (n, g)), 0, 1), 3)
        v[..., M["gpu_memory_utilization_percent"]] = np.clip(
            np.round(u * 40 + rng.normal(0, 1, (n, g))), 0, 100
        )
        total, reserved = 81_559 * 2**20, 529 * 2**20
        steps = (t // 900 % 3)[:, None] * 256 * 2**20  # allocator growth and release
        used = np.where(busy, self.mem_used + steps, 0)
        v[..., M["gpu_memory_used_bytes"]] = used
        v[..., M["gpu_memory_free_bytes"]] = total - used - reserved
        v[..., M["gpu_memory_reserved_bytes"]] = reserved
        v[..., M["gpu_memory_total_bytes"]] = total
        power = np.round(70 + u * 600 + rng.normal(0, 8, (n, g)) * (0.3 + u), 3)
        temps = np.empty((n, g))
        for k in range(n):
            target = 35 + power[k] * 0.065 + (np.arange(g) % 8) * 0.7
            self.temp += (target - self.temp) * 0.05 + rng.normal(0, 0.15, g)
            temps[k] = self.temp
        v[..., M["gpu_temp_celsius"]] = np.round(temps, 1)
        v[..., M["gpu_memory_temp_celsius"]] = np.round(temps + 8)
        v[..., M["gpu_power_watts"]] = power
        v[..., M["gpu_power_limit_watts"]] = 700.0
        energy = self.energy + np.cumsum(power, axis=0)
        self.energy = energy[-1]
        v[..., M["gpu_energy_joules_total"]] = np.round(energy, 3)
        throttled = rng.random((n, g)) < 0.001
        v[..., M["gpu_sm_clock_mhz"]] = np.where(throttled, 1755.0, np.where(busy, 1980.0, 345.0))
        v[..., M["gpu_memory_clock_mhz"]] = 2619.0
        v[..., M["gpu_clock_event_reasons"]] = np.where(throttled, 4.0, 0.0)
        v[..., M["gpu_throttle_sw_power"]] = throttled
        violation = self.violation + np.cumsum(throttled, axis=0)
        self.violation = violation[-1]
        v[..., M["gpu_violation_power_seconds_total"]] = violation
        self.sbe = self.sbe + (rng.random(g) < 0.0005)
        v[..., M["gpu_ecc_sbe_volatile_total"]] = self.sbe
        for name, level, noise in (
            ("gpu_pcie_tx_bytes_per_second", 2e9, 5e7),
            ("gpu_pcie_rx_bytes_per_second", 1.5e9, 5e7),
            ("gpu_nvlink_tx_bytes_per_second", 4e10, 1e9),
        ):
            v[..., M[name]] = np.round(
                np.clip(np.where(busy, level * u + rng.normal(0, noise, (n, g)), 0), 0, None), -3
            )
        return v.astype(np.float32)


def generate(kind: str, gpus: int, seconds: int, t0: float, seed: int = 1) -> Telemetry:
    nodes = -(-gpus // GPUS_PER_NODE)
    rng = np.random.default_rng(seed + 1)
    jitter = np.round(rng.normal(0, 0.003, (seconds, nodes)), 3)  # each node stamps its own reads
    ts = t0 + np.arange(seconds)[:, None] + np.abs(jitter)
    if kind == "common":
        fleet = Fleet(nodes, GPUS_PER_NODE)
        ticks = list(telemetry_ticks(fleet, seconds, seed=seed, t0=t0))
        values = np.stack([v for _, _, v in ticks]).astype(np.float32)[:, :gpus]
        return Telemetry(ts, values, list(ticks[0][1]), fleet.entities[:gpus])
    gen = GpuFleet(gpus, seed)
    values = np.concatenate([gen.chunk(int(t0) + s, min(600, seconds - s)) for s in range(0, seconds, 600)])
    entities = [{"node": f"node-{i // GPUS_PER_NODE}", "gpu": str(i % GPUS_PER_NODE)} for i in range(gpus)]
    for i, e in enumerate(entities):
        if gen.busy[i]:
            e["job"] = "llm-pretrain"
    return Telemetry(ts, values, list(METRICS), entities)


def node_batches(data: Telemetry, batch_seconds: int) -> list[list[Batch]]:
    """Per node, the batches its agent sends: ``batch_seconds`` one-second frames each."""
    per_node: list[list[Batch]] = []
    ticks, gpus, _ = data.values.shape
    for n in range(-(-gpus // GPUS_PER_NODE)):
        rows = slice(n * GPUS_PER_NODE, min((n + 1) * GPUS_PER_NODE, gpus))
        ents = data.entities[rows]
        batches = []
        for k0 in range(0, ticks, batch_seconds):
            frames = [
                Frame(float(data.ts[k, n]), data.names, ents, data.values[k, rows].astype(np.float64))
                for k in range(k0, min(k0 + batch_seconds, ticks))
            ]
            batches.append(Batch(f"node-{n}", frames=frames, batch_id=f"node-{n}:{k0}"))
        per_node.append(batches)
    return per_node


def ingest(store: DuckDBStore, per_node: list[list[Batch]]) -> float:
    """Append every node's batches from one thread per node (like agents); returns wall seconds."""
    errors: list[BaseException] = []

    def run(batches: list[Batch]) -> None:
        try:
            for b in batches:
                store.append(b)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(b,)) for b in per_node]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - started


def raw_only_bytes(path: Path, tmp: Path) -> int:
    """Used bytes of the database file without the rollup tables (hot rows and small tables)."""
    copy = tmp / "raw-only.duckdb"
    shutil.copyfile(path, copy)
    con = duckdb.connect(str(copy))
    for table in ("rollup_1m", "rollup_1h"):
        con.execute(f"DROP TABLE {table}")
    con.execute("CHECKPOINT")
    block, used = con.execute("SELECT block_size, used_blocks FROM pragma_database_size()").fetchone()  # type: ignore[misc]
    con.close()
    return int(block) * int(used)


def measure_duckdb(
    data: Telemetry, tmp: Path, batch_seconds: int, seal: bool, seal_interval_s: int
) -> dict[str, float]:
    """Ingest like a hub does: agents' batches from threads, and every ``MAINTAIN_S`` of data time
    (or seal interval, if shorter) the hub's maintenance (rollups, which also seal the hot rows into
    Parquet pieces and merge each closed hour's)."""
    path = tmp / ("sealed.duckdb" if seal else "unsealed.duckdb")
    store = DuckDBStore(str(path), seal_interval_s=seal_interval_s if seal else 3600 * 24 * 365 * 100)
    per_node = node_batches(data, batch_seconds)
    append_s = maintain_s = maintain_cpu_s = 0.0
    t0 = float(data.ts.min())
    per_phase = min(MAINTAIN_S, seal_interval_s) // batch_seconds
    for k in range(0, max(len(b) for b in per_node), per_phase):
        append_s += ingest(store, [b[k : k + per_phase] for b in per_node])
        started, cpu = time.perf_counter(), time.process_time()  # DuckDB's threads included
        store.rollup(t0 + (k + per_phase) * batch_seconds)
        store.compact(t0 + (k + per_phase) * batch_seconds)  # a hub's upkeep runs both
        maintain_s += time.perf_counter() - started
        maintain_cpu_s += time.process_time() - cpu
    end = float(data.ts.max())
    store.rollup(end + 3600 + 120)  # then the data ages: every hour is sealed and rolled up
    store.checkpoint()
    stats = store.stats()
    store.close()
    samples = data.samples
    return {
        "samples": samples,
        "append_samples_per_s": samples / append_s,
        "batches_per_s": sum(len(b) for b in per_node) / append_s,
        "maintain_s_per_hour": maintain_s / (data.values.shape[0] / 3600),
        "maintain_cpu_s_per_hour": maintain_cpu_s / (data.values.shape[0] / 3600),
        "commits": stats["commits"],
        "disk_bytes": stats["disk_bytes"],
        "chunk_bytes": stats["chunk_bytes"],
        "raw_bytes": stats["chunk_bytes"] + raw_only_bytes(path, tmp),
    }


def _vm_merges(client: httpx.Client) -> int:
    """Merges VictoriaMetrics reports as running (its /metrics)."""
    lines = client.get("/metrics").text.splitlines()
    return sum(int(float(line.split()[-1])) for line in lines if line.startswith("vm_active_merges{"))


def _vm_part_rows(datadir: Path) -> int:
    """Rows in finished on-disk parts: each part directory is named ``rows_blocks_min_max_id``."""
    total = 0
    for partition in (datadir / "data").glob("*/*"):
        for part in partition.iterdir():
            fields = part.name.split("_")
            if len(fields) == 5 and fields[0].isdigit() and (part / "metaindex.bin").exists():
                total += int(fields[0])
    return total


def _settle(client: httpx.Client, datadir: Path, samples: int, deadline: float) -> int:
    """Wait until finished parts hold every sample, no merge runs and the data dir has not
    changed for 3 s; return its size. (VictoriaMetrics' own row counters run ahead of the
    files, so the part directories are what is checked.)"""
    stable, last = 0, -1
    while time.monotonic() < deadline and stable < 3:
        time.sleep(1)
        size = dir_bytes(datadir)
        done = _vm_part_rows(datadir) >= samples and _vm_merges(client) == 0 and size == last
        stable = stable + 1 if done else 0
        last = size
    if stable < 3:
        console.print("[yellow]VictoriaMetrics did not settle before the deadline[/yellow]")
    return dir_bytes(datadir)


def measure_vm(data: Telemetry) -> dict[str, float] | None:
    with victoria_metrics() as vm:
        if vm is None:
            return None
        url, datadir = vm
        samples = data.samples
        gpus = data.values.shape[1]
        node_of = [i // GPUS_PER_NODE for i in range(gpus)]
        ts_ms = [[str(round(x * 1000)) for x in data.ts[:, n]] for n in range(data.ts.shape[1])]
        import_seconds = 0.0
        with httpx.Client(base_url=url, timeout=600) as client:
            for j, name in enumerate(data.names):  # one request per metric: ~460k lines
                lines: list[str] = []
                for i, ent in enumerate(data.entities):
                    labels = ",".join(f'{k}="{v}"' for k, v in sorted(ent.items()))
                    prefix = f"{name}{{{labels}}} "
                    col = data.values[:, i, j]
                    texts = col.astype(str).tolist()  # shortest decimal that reads back as the same float32
                    stamps = ts_ms[node_of[i]]
                    lines.extend(prefix + texts[k] + " " + stamps[k] for k in np.nonzero(~np.isnan(col))[0])
                body = ("\n".join(lines) + "\n").encode()
                started = time.perf_counter()
                client.post("/api/v1/import/prometheus", content=body).raise_for_status()
                import_seconds += time.perf_counter() - started
            client.get("/internal/force_flush").raise_for_status()
            flushed = _settle(client, datadir, samples, deadline=time.monotonic() + 120)
            client.get("/internal/force_merge").raise_for_status()
            _settle(client, datadir, samples, deadline=time.monotonic() + 300)
            merged = dir_bytes(datadir)
        return {
            "samples": samples,
            "import_samples_per_s": samples / import_seconds,
            "flushed_bytes": flushed,
            "merged_bytes": merged,
        }


def measure_snapshot(gpus: int = 8192, metrics: int = 40, calls: int = 30) -> tuple[float, float]:
    """p50 and p95 seconds of a fleet snapshot (every metric of every GPU) at the store level."""
    store = DuckDBStore(":memory:", durable=False)
    rng = np.random.default_rng(3)
    ents = [{"node": f"node-{i // 8}", "gpu": str(i % 8), "job": f"job-{i // 64}"} for i in range(gpus)]
    names = [f"gpu_metric_{j}" for j in range(metrics)]
    for t in range(3):
        store.append(Batch("fleet", frames=[Frame(float(t), names, ents, rng.random((gpus, metrics)))]))
    times = []
    for _ in range(calls):
        started = time.perf_counter()
        store.snapshot()
        times.append(time.perf_counter() - started)
    store.close()
    return float(np.percentile(times, 50)), float(np.percentile(times, 95))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--hours", type=float, default=2.0)
    ap.add_argument("--data", choices=["gpu", "common"], default="gpu")
    ap.add_argument("--batch-seconds", type=int, default=5, help="frames per agent batch")
    ap.add_argument("--no-vm", action="store_true", help="skip the VictoriaMetrics anchor")
    ap.add_argument("--seal-interval", type=int, default=int(DEFAULT_SEAL_INTERVAL_S), help="seconds")
    ap.add_argument("--no-unsealed", action="store_true", help="skip the never-sealed comparison")
    a = ap.parse_args()
    seconds = int(a.hours * 3600)
    t0 = float(
        int(time.time() - seconds - 7200) // 3600 * 3600
    )  # recent (VictoriaMetrics retention), on an hour
    console.print(f"generating {a.gpus} GPUs x {seconds} s ({a.data} telemetry)")
    data = generate(a.data, a.gpus, seconds, t0)
    console.print(f"{data.samples:,} samples, {len(data.names)} metrics")
    rows: list[list[str]] = []
    with tempfile.TemporaryDirectory(prefix="bench-storage-") as tmp_name:
        tmp = Path(tmp_name)
        ours = measure_duckdb(data, tmp, a.batch_seconds, True, a.seal_interval)
        n = ours["samples"]
        rows.append(
            [
                "gpuscope DuckDBStore, all on disk (raw + rollups)",
                f"{ours['disk_bytes'] / n:.3f}",
                f"{ours['disk_bytes']:,}",
                f"{ours['append_samples_per_s']:,.0f}",
            ]
        )
        rows.append(
            [
                "gpuscope DuckDBStore, raw telemetry (Parquet chunks + db)",
                f"{ours['raw_bytes'] / n:.3f}",
                f"{ours['raw_bytes']:,}",
                "",
            ]
        )
        if not a.no_unsealed:
            plain = measure_duckdb(data, tmp, a.batch_seconds, False, a.seal_interval)
            rows.append(
                [
                    "  same, never sealed (DuckDB table only)",
                    f"{plain['raw_bytes'] / n:.3f}",
                    f"{plain['raw_bytes']:,}",
                    f"{plain['append_samples_per_s']:,.0f}",
                ]
            )
        vm = None if a.no_vm else measure_vm(data)
        if vm is not None:
            rows.append(
                [
                    "VictoriaMetrics 1.79 after force_flush",
                    f"{vm['flushed_bytes'] / n:.3f}",
                    f"{vm['flushed_bytes']:,}",
                    f"{vm['import_samples_per_s']:,.0f} (HTTP import)",
                ]
            )
            rows.append(
                [
                    "VictoriaMetrics 1.79 after merges (anchor)",
                    f"{vm['merged_bytes'] / n:.3f}",
                    f"{vm['merged_bytes']:,}",
                    "",
                ]
            )
    print_table(
        f"storage, {a.gpus} GPUs x {len(data.names)} metrics x 1 Hz x {a.hours:g} h = {n:,} samples "
        f"(budget <= 0.8 bytes/sample)",
        ["system", "bytes/sample", "bytes", "append samples/s"],
        rows,
    )
    print(
        f"DuckDBStore appends: {data.ts.shape[1]} agent threads, {ours['batches_per_s']:,.0f} durable "
        f"batches/s in {ours['commits']:,} group commits; upkeep (seal, rollups, retention) "
        f"{ours['maintain_s_per_hour']:.2f} s ({ours['maintain_cpu_s_per_hour']:.2f} CPU-s) per hour of data"
    )
    p50, p95 = measure_snapshot()
    print_table(
        "fleet snapshot at the store level (budget: p95 <= 100 ms for the whole overview query)",
        ["query", "p50 ms", "p95 ms"],
        [["snapshot(): 8,192 GPUs x 40 metrics", f"{p50 * 1e3:.1f}", f"{p95 * 1e3:.1f}"]],
    )


if __name__ == "__main__":
    main()
