"""Sample each worker's memory from outside while a job runs.

RSS per rank comes from psutil (about 2 ms a tick for a few processes); on NVIDIA machines
the GPUs' used memory, and each worker process's share of it, come from NVML (nvidia-ml-py).
Samples are appended to ``<run_dir>/samples/rss.jsonl`` and ``gpu.jsonl`` and kept in memory
for the live view.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

import psutil

from .processes import ProcessTree

log = logging.getLogger(__name__)


class _NVML:
    """Per-GPU used memory and per-process GPU memory through NVML, or nothing when unavailable."""

    def __init__(self) -> None:
        self.handles = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception:  # noqa: BLE001 - no driver, no GPU, or no package: sample RSS only
            self.handles = []

    def sample(self) -> tuple[list[dict], dict[int, int]]:
        gpus, per_pid = [], {}
        for i, h in enumerate(self.handles):
            try:
                info = self.pynvml.nvmlDeviceGetMemoryInfo(h)
                gpus.append({"gpu": i, "used_bytes": int(info.used), "total_bytes": int(info.total)})
                for p in self.pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    per_pid[p.pid] = per_pid.get(p.pid, 0) + int(p.usedGpuMemory or 0)
            except Exception:  # noqa: BLE001
                continue
        return gpus, per_pid

    def close(self) -> None:
        if self.handles:
            try:
                self.pynvml.nvmlShutdown()
            except Exception:  # noqa: BLE001
                pass


class MemorySampler(threading.Thread):
    """Background thread: refresh the process tree and sample memory ``hz`` times a second.

    Args:
        tree: the job's ``ProcessTree`` (the sampler also keeps its record of workers current).
        run_dir: samples go to ``run_dir/samples/``.
        hz: samples per second (> 0).
        sample_gpus: also sample NVML (only useful when the job uses CUDA).
    """

    def __init__(self, tree: ProcessTree, run_dir: Path, hz: float = 5.0, sample_gpus: bool = False) -> None:
        super().__init__(name="tutorial_lib-memory-sampler", daemon=True)
        self.tree = tree
        self.folder = Path(run_dir) / "samples"
        self.period_s = 1.0 / hz
        self.sample_gpus = sample_gpus
        self.rss_samples: list[dict] = []
        self.gpu_samples: list[dict] = []
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def stop(self) -> None:
        """Stop sampling and wait (up to 5 s) for the thread to close its files."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)

    def run(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        nvml = _NVML() if self.sample_gpus else None
        with open(self.folder / "rss.jsonl", "a") as rss_file, open(self.folder / "gpu.jsonl", "a") as gpu_file:
            while not self._stop_event.is_set():
                try:
                    self._tick(rss_file, gpu_file, nvml)
                except Exception:  # noqa: BLE001 - sampling must never break a run
                    log.debug("memory sample failed", exc_info=True)
                self._stop_event.wait(self.period_s)
        if nvml:
            nvml.close()
        if not self.gpu_samples:
            (self.folder / "gpu.jsonl").unlink(missing_ok=True)

    def _tick(self, rss_file, gpu_file, nvml) -> None:
        workers = self.tree.refresh()
        now = round(time.monotonic() - self._t0, 3)
        gpus, per_pid = nvml.sample() if nvml else ([], {})
        for pid, w in workers.items():
            if w.rank is None:
                continue
            try:
                rss = w.process.memory_info().rss
            except psutil.Error:
                continue
            if rss == 0:  # an exiting (zombie) process: no longer a memory reading
                continue
            row = {"time_s": now, "rank": w.rank, "pid": pid, "rss_bytes": int(rss)}
            if pid in per_pid:
                row["gpu_used_bytes"] = per_pid[pid]
            self.rss_samples.append(row)
            rss_file.write(json.dumps(row) + "\n")
        for g in gpus:
            row = {"time_s": now, **g}
            self.gpu_samples.append(row)
            gpu_file.write(json.dumps(row) + "\n")
        rss_file.flush()
        gpu_file.flush()
