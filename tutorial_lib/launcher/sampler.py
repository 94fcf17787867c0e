"""Sample each worker's memory from outside while a job runs.

RSS per rank comes from psutil (about 2 ms a tick for a few processes); on NVIDIA machines
the used memory of the job's GPUs, and each worker process's share of it, come from NVML
(nvidia-ml-py). Samples are appended to ``<run_dir>/samples/rss.jsonl`` and ``gpu.jsonl`` and
kept in memory for the live view; ``gpu_info.json`` says which GPUs were sampled and how to read them.

GPU numbers. NVML sees every GPU of the machine, numbered in PCI bus order, and ignores
``CUDA_VISIBLE_DEVICES``; the ranks see ``cuda:0..n-1``: the GPUs that ``CUDA_VISIBLE_DEVICES``
lists (indices or ``GPU-<uuid>``s), in that order. ``map_visible_gpus`` matches the two by UUID and
numbers every sample by the CUDA index the ranks see (``cuda:LOCAL_RANK`` on one node). Indices in
``CUDA_VISIBLE_DEVICES`` count in CUDA's order: NVML's PCI order with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``;
CUDA's default (``FASTEST_FIRST``) puts faster GPUs first, which is PCI order too when all GPUs are the
same model. With different models and no ``PCI_BUS_ID`` the numbers assume PCI order and a note says so.

Per-process GPU memory is matched by PID. In a container without the host's PID namespace NVML
reports host PIDs, so no worker matches: the sampler then says so (``MemorySampler.notes()``,
``PID_MISMATCH_NOTE``) instead of letting the plot fall back to RSS silently.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from ..i18n import N_
from .devices import parse_visible_devices
from .processes import ProcessTree

log = logging.getLogger(__name__)

PID_MISMATCH_NOTE = N_("no worker process matched NVML's process list (container without host PID namespace?): "
                     "GPU memory is per device, not per process")
ORDER_NOTE = N_("these GPUs are of different models and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers the fastest "
              "first, NVML by PCI bus; the GPU numbers of the samples assume PCI order (set "
              "CUDA_DEVICE_ORDER=PCI_BUS_ID in LaunchSpec env= to make them exact)")
MIG_NOTE = N_("CUDA_VISIBLE_DEVICES names MIG instances: their memory is not sampled")
# A job's GPU counts as in use once NVML lists a process on it or its used memory grew this much
# (a CUDA context alone is a few hundred MiB); only then does "no worker matched" mean something.
ACTIVITY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class VisibleGPU:
    """One GPU of the job.

    Attributes:
        index: the CUDA index the ranks see (``cuda:index``).
        nvml_index: NVML's (and ``nvidia-smi``'s) index of the same GPU.
        uuid: ``"GPU-..."``, the same in NVML and CUDA.
        name: the model, e.g. ``"NVIDIA GeForce RTX 4090 D"``.
    """

    index: int
    nvml_index: int
    uuid: str
    name: str


def map_visible_gpus(visible: list[int | str] | None, nvml_gpus: list[tuple[str, str]], *,
                     device_order: str | None = None) -> tuple[list[VisibleGPU], list[str]]:
    """Match the GPUs a job's ranks see to NVML's GPUs; pure.

    Args:
        visible: ``parse_visible_devices`` of the job's ``CUDA_VISIBLE_DEVICES`` (``None``: every GPU).
        nvml_gpus: ``(uuid, name)`` of every GPU, in NVML's order.
        device_order: the job's ``CUDA_DEVICE_ORDER`` (``None``: CUDA's default, ``FASTEST_FIRST``).

    Returns:
        The job's GPUs in the ranks' order (``VisibleGPU.index`` = 0, 1, ...) and notes on what could
        not be matched exactly (``ORDER_NOTE``, ``MIG_NOTE``). An index past the last GPU, or a UUID
        that matches no GPU or several, ends the list as it ends CUDA's.
    """
    notes = []
    by_index = visible is None or any(isinstance(entry, int) for entry in visible)
    if by_index and device_order != "PCI_BUS_ID" and len({name for _, name in nvml_gpus}) > 1:
        notes.append(ORDER_NOTE)
    gpus: list[VisibleGPU] = []
    for entry in range(len(nvml_gpus)) if visible is None else visible:
        if isinstance(entry, int):
            nvml_index = entry if entry < len(nvml_gpus) else None
        elif entry.startswith("GPU-"):
            matches = [i for i, (uuid, _) in enumerate(nvml_gpus) if uuid.startswith(entry)]
            nvml_index = matches[0] if len(matches) == 1 else None
        else:
            notes.append(MIG_NOTE)
            nvml_index = None
        if nvml_index is None or any(g.nvml_index == nvml_index for g in gpus):
            break
        gpus.append(VisibleGPU(len(gpus), nvml_index, *nvml_gpus[nvml_index]))
    return gpus, notes


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # older nvidia-ml-py returns bytes


class _NVML:
    """Used memory of the job's GPUs and per-process GPU memory through NVML, or nothing when unavailable."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.gpus: list[VisibleGPU] = []
        self.notes: list[str] = []
        self.handles: list = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self.pynvml = pynvml
        except Exception:  # noqa: BLE001 - no driver, no GPU, or no package: sample RSS only
            return
        try:
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            described = [(_text(pynvml.nvmlDeviceGetUUID(h)), _text(pynvml.nvmlDeviceGetName(h))) for h in handles]
            self.gpus, self.notes = map_visible_gpus(parse_visible_devices(env.get("CUDA_VISIBLE_DEVICES")), described,
                                                     device_order=env.get("CUDA_DEVICE_ORDER"))
            self.handles = [handles[g.nvml_index] for g in self.gpus]
        except Exception:  # noqa: BLE001
            log.debug("NVML could not describe the GPUs", exc_info=True)
            self.gpus, self.handles = [], []

    def sample(self) -> tuple[list[dict], dict[int, tuple[int, int | None]], bool]:
        """One reading: rows per job GPU, ``{pid: (cuda index, bytes or None)}``, and whether any process was listed."""
        gpus, per_pid, listed = [], {}, False
        for gpu, h in zip(self.gpus, self.handles):
            try:
                info = self.pynvml.nvmlDeviceGetMemoryInfo(h)
                gpus.append({"gpu": gpu.index, "nvml_index": gpu.nvml_index, "used_bytes": int(info.used),
                             "total_bytes": int(info.total)})
                for p in self.pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                    listed = True
                    used = p.usedGpuMemory  # None where the driver does not report it
                    index, total = per_pid.get(p.pid, (gpu.index, None))
                    per_pid[p.pid] = (index, total if used is None else (total or 0) + int(used))
            except Exception:  # noqa: BLE001
                continue
        return gpus, per_pid, listed

    def close(self) -> None:
        if hasattr(self, "pynvml"):
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
        env: the environment of the job's ranks (``None``: ``os.environ``); its ``CUDA_VISIBLE_DEVICES``
            and ``CUDA_DEVICE_ORDER`` say which GPUs are the job's and how the ranks number them.

    After ``stop()``: ``gpus`` (the job's GPUs, ``VisibleGPU``), ``per_process`` (whether any worker's PID
    was found in NVML's process lists) and ``notes()``.
    """

    def __init__(self, tree: ProcessTree, run_dir: Path, hz: float = 5.0, sample_gpus: bool = False,
                 env: Mapping[str, str] | None = None) -> None:
        super().__init__(name="tutorial_lib-memory-sampler", daemon=True)
        self.tree = tree
        self.folder = Path(run_dir) / "samples"
        self.period_s = 1.0 / hz
        self.sample_gpus = sample_gpus
        self.env = dict(os.environ if env is None else env)
        self.rss_samples: list[dict] = []
        self.gpu_samples: list[dict] = []
        self.gpus: list[VisibleGPU] = []
        self.per_process = False
        self._mapping_notes: list[str] = []
        self._gpu_in_use = False
        self._first_used: dict[int, int] = {}
        self._stop_event = threading.Event()
        self._t0 = time.monotonic()

    def stop(self) -> None:
        """Stop sampling and wait (up to 5 s) for the thread to close its files."""
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=5)

    def pid_mismatch(self) -> bool:
        """NVML sampled the job's GPUs and they were in use, yet no worker's PID was in NVML's process lists."""
        return bool(self.gpu_samples) and self._gpu_in_use and not self.per_process

    def notes(self) -> list[str]:
        """What a reader of the GPU samples must know: ``PID_MISMATCH_NOTE``, ``ORDER_NOTE``, ``MIG_NOTE``."""
        return ([PID_MISMATCH_NOTE] if self.pid_mismatch() else []) + self._mapping_notes

    def run(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        nvml = _NVML(self.env) if self.sample_gpus else None
        if nvml:
            self.gpus, self._mapping_notes = nvml.gpus, nvml.notes
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
        if self.gpus:
            (self.folder / "gpu_info.json").write_text(json.dumps({
                "gpus": [asdict(g) for g in self.gpus], "per_process": self.per_process, "notes": self.notes()}))

    def _tick(self, rss_file, gpu_file, nvml) -> None:
        workers = self.tree.refresh()
        now = round(time.monotonic() - self._t0, 3)
        gpus, per_pid, listed = nvml.sample() if nvml else ([], {}, False)
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
                self.per_process = True
                row["gpu"], used = per_pid[pid]
                if used is not None:
                    row["gpu_used_bytes"] = used
            self.rss_samples.append(row)
            rss_file.write(json.dumps(row) + "\n")
        for g in gpus:
            first = self._first_used.setdefault(g["gpu"], g["used_bytes"])
            self._gpu_in_use = self._gpu_in_use or listed or g["used_bytes"] - first >= ACTIVITY_BYTES
            row = {"time_s": now, **g}
            self.gpu_samples.append(row)
            gpu_file.write(json.dumps(row) + "\n")
        rss_file.flush()
        gpu_file.flush()
