"""Environment report: versions, backends, GPUs and peer access between them, CPU, memory and disk. It never raises.

``python -m tutorial_lib env`` prints it; notebook 00 shows it. Each probe is guarded on its
own, so a broken CUDA driver or a missing package shows up as a line in the report
instead of an exception (an environment check must not fail on what it checks).
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class GPUInfo:
    """One CUDA device: ``index``, ``name``, ``total_memory_bytes``, ``capability`` ("8.9")."""

    index: int
    name: str
    total_memory_bytes: int
    capability: str


@dataclass
class EnvironmentReport:
    """What the workbook runs on. Fields that could not be read are ``None``; why is in ``problems``.

    ``peer_access`` maps every pair of visible GPUs ``(a, b)``, ``a < b``, to whether CUDA reports
    peer-to-peer access both ways (``torch.cuda.can_device_access_peer``); empty with fewer than 2 GPUs.
    """

    python: str
    platform: str
    torch_version: str | None = None
    cuda_available: bool = False
    cuda_version: str | None = None
    cudnn_version: int | None = None
    nccl_version: str | None = None
    backends: dict[str, bool] = field(default_factory=dict)
    gpus: list[GPUInfo] = field(default_factory=list)
    peer_access: dict[tuple[int, int], bool] = field(default_factory=dict)
    cpu_cores_logical: int | None = None
    cpu_cores_usable: int | None = None
    ram_total_bytes: int | None = None
    ram_available_bytes: int | None = None
    disk_free_bytes: int | None = None
    disk_path: str = "."
    problems: list[str] = field(default_factory=list)

    def to_text(self) -> str:
        """The report as aligned ``name: value`` lines."""

        def gib(n: int | None) -> str:
            return "unknown" if n is None else f"{n / 2**30:.1f} GiB"

        rows = [
            ("python", self.python),
            ("platform", self.platform),
            ("torch", self.torch_version or "not importable"),
            ("cuda available", str(self.cuda_available)),
            ("cuda (torch built with)", self.cuda_version or "none"),
            ("cudnn", str(self.cudnn_version) if self.cudnn_version else "none"),
            ("nccl", self.nccl_version or "none"),
            ("distributed backends", ", ".join(f"{k}={'yes' if v else 'no'}" for k, v in self.backends.items())
             or "unknown"),
            ("gpus", str(len(self.gpus))),
        ]
        rows += [(f"  cuda:{g.index}", f"{g.name}, {gib(g.total_memory_bytes)}, sm {g.capability}") for g in self.gpus]
        rows.append(("peer access (P2P)", self.peer_access_text()))
        rows += [
            ("cpu cores (logical / usable)", f"{self.cpu_cores_logical} / {self.cpu_cores_usable}"),
            ("ram (total / available)", f"{gib(self.ram_total_bytes)} / {gib(self.ram_available_bytes)}"),
            (f"disk free at {self.disk_path}", gib(self.disk_free_bytes)),
        ]
        width = max(len(k) for k, _ in rows)
        text = "\n".join(f"{k:<{width}}  {v}" for k, v in rows)
        if self.problems:
            text += "\n\nproblems:\n" + "\n".join(f"  - {p}" for p in self.problems)
        return text

    def missing_peer_access(self) -> list[tuple[int, int]]:
        """The GPU pairs ``(a, b)`` without peer-to-peer access (either direction), in order."""
        return sorted(pair for pair, ok in self.peer_access.items() if not ok)

    def peer_access_text(self) -> str:
        """One line on peer-to-peer access between the visible GPUs, with what to try when it is missing."""
        if not self.gpus:
            return "no GPUs"
        if len(self.gpus) == 1:
            return "one GPU, no pairs to check"
        if not self.peer_access:
            return "not checked (see problems)"
        missing = self.missing_peer_access()
        if not missing:
            return (f"yes, all {len(self.peer_access)} pairs (consumer boards without NVLink can still hang in NCCL: "
                    "then try NCCL_P2P_DISABLE=1)")
        pairs = ", ".join(f"cuda:{a}<->cuda:{b}" for a, b in missing)
        return (f"missing for {len(missing)} of {len(self.peer_access)} pairs: {pairs}; NCCL may hang or fail "
                "between them: try NCCL_P2P_DISABLE=1 (LaunchSpec/run_script env=)")

    def __str__(self) -> str:
        return self.to_text()

    def _repr_pretty_(self, p, cycle) -> None:  # IPython shows the text, not the dataclass repr
        p.text(self.to_text())


def _record_problem(report: EnvironmentReport, what: str, probe) -> None:
    """Run one probe; a probe that raises leaves its fields ``None`` and adds a line to ``report.problems``."""
    try:
        probe(report)
    except Exception as e:  # noqa: BLE001 - the report must survive any broken probe
        report.problems.append(f"{what}: {type(e).__name__}: {e}")


def _torch_probe(report: EnvironmentReport) -> None:
    import torch

    report.torch_version = torch.__version__
    report.cuda_version = torch.version.cuda
    report.cuda_available = bool(torch.cuda.is_available())
    if torch.backends.cudnn.is_available():
        report.cudnn_version = torch.backends.cudnn.version()


def _dist_probe(report: EnvironmentReport) -> None:
    import torch.distributed as dist

    report.backends = {
        "gloo": dist.is_available() and dist.is_gloo_available(),
        "nccl": dist.is_available() and dist.is_nccl_available(),
        "mpi": dist.is_available() and dist.is_mpi_available(),
    }
    if report.backends["nccl"] and report.cuda_available:
        import torch

        report.nccl_version = ".".join(map(str, torch.cuda.nccl.version()))


def _gpu_probe(report: EnvironmentReport) -> None:
    import torch

    if not report.cuda_available:
        return
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        report.gpus.append(GPUInfo(i, props.name, int(props.total_memory), f"{props.major}.{props.minor}"))


def _peer_probe(report: EnvironmentReport) -> None:
    import torch

    if len(report.gpus) < 2:
        return
    indices = [g.index for g in report.gpus]
    for i, a in enumerate(indices):
        for b in indices[i + 1:]:  # directional in CUDA: a pair has it only if both directions do
            report.peer_access[(a, b)] = bool(torch.cuda.can_device_access_peer(a, b)
                                              and torch.cuda.can_device_access_peer(b, a))


def _cpu_probe(report: EnvironmentReport) -> None:
    report.cpu_cores_logical = os.cpu_count()
    report.cpu_cores_usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _ram_probe(report: EnvironmentReport) -> None:
    import psutil

    vm = psutil.virtual_memory()
    report.ram_total_bytes, report.ram_available_bytes = int(vm.total), int(vm.available)


def _disk_probe(report: EnvironmentReport) -> None:
    path = Path(report.disk_path)
    while not path.exists() and path != path.parent:
        path = path.parent
    report.disk_free_bytes = shutil.disk_usage(path).free


# (what, probe) in order: later probes read what earlier ones found (CUDA before the GPUs, GPUs before peer access).
_PROBES = [("torch", _torch_probe), ("torch.distributed", _dist_probe), ("gpus", _gpu_probe),
           ("peer access", _peer_probe), ("cpu", _cpu_probe), ("ram", _ram_probe), ("disk", _disk_probe)]


def environment_report(disk_path: str | os.PathLike = ".") -> EnvironmentReport:
    """Collect the environment report; never raises.

    Args:
        disk_path: folder whose file system's free space is reported (the run directory's, usually).

    Returns:
        An ``EnvironmentReport``; every probe that failed left its field ``None`` and added a line
        to ``report.problems``.
    """
    report = EnvironmentReport(python=sys.version.split()[0], platform=platform.platform(), disk_path=str(disk_path))
    for what, probe in _PROBES:
        _record_problem(report, what, probe)
    return report
