"""GPU memory sampling through NVML, with a fake ``pynvml`` module: which GPUs are the job's, how they are
numbered, and what the sampler says when no worker process matches NVML's process list (issue 15 item 6).

NVML numbers every GPU of the machine in PCI order and ignores CUDA_VISIBLE_DEVICES; the ranks see cuda:0..n-1.
"""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass

import pandas as pd
import pytest

import tutorial_lib as tl
from tutorial_lib.launcher.devices import DevicePlan
from tutorial_lib.launcher.spec import LaunchResult
from tutorial_lib.launcher.sampler import (MIG_NOTE, ORDER_NOTE, PID_MISMATCH_NOTE, MemorySampler, VisibleGPU, map_visible_gpus,
                                 parse_visible_devices)

GiB = 2**30
UUIDS = ["GPU-aaaa1111-0000-0000-0000-000000000000", "GPU-bbbb2222-0000-0000-0000-000000000000",
         "GPU-cccc3333-0000-0000-0000-000000000000", "GPU-dddd4444-0000-0000-0000-000000000000"]
RTX = "NVIDIA GeForce RTX 4090 D"


def fake_pynvml(monkeypatch, names, processes, used=None):
    """A ``pynvml`` for GPUs ``names`` (NVML order, UUIDS); ``processes[i]``: ``[(pid, bytes)]`` on GPU i."""
    used = used or {}
    nvml = types.ModuleType("pynvml")
    nvml.nvmlInit = nvml.nvmlShutdown = lambda: None
    nvml.nvmlDeviceGetCount = lambda: len(names)
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetUUID = lambda h: UUIDS[h].encode() if h == 0 else UUIDS[h]  # old nvidia-ml-py: bytes
    nvml.nvmlDeviceGetName = lambda h: names[h]
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=used.get(h, 1 * GiB), total=24 * GiB)
    nvml.nvmlDeviceGetComputeRunningProcesses = lambda h: [types.SimpleNamespace(pid=pid, usedGpuMemory=b)
                                                           for pid, b in processes.get(h, [])]
    monkeypatch.setitem(sys.modules, "pynvml", nvml)


@dataclass
class FakeProcess:
    rss: int

    def memory_info(self):
        return types.SimpleNamespace(rss=self.rss)


@dataclass
class Worker:
    process: FakeProcess
    rank: int | None


def sample(tmp_path, env, ticks=3, workers=None):
    """Run a sampler for ``ticks`` ticks in this thread over ranks 0 and 1 (pids 100, 101); return it."""
    workers = workers or {100: Worker(FakeProcess(300 * 2**20), 0), 101: Worker(FakeProcess(310 * 2**20), 1),
                          99: Worker(FakeProcess(50 * 2**20), None)}  # torchrun itself: no rank
    sampler = MemorySampler(None, tmp_path, hz=1000, sample_gpus=True, env=env)

    class Tree:
        calls = 0

        def refresh(self):
            Tree.calls += 1
            if Tree.calls == ticks:
                sampler.stop()  # not started as a thread: only sets the stop event; run() returns after this tick
            return workers

    sampler.tree = Tree()
    sampler.run()
    return sampler


def shown_text(ax) -> str:
    """The text written inside ``ax``, its line wrapping undone."""
    return " ".join(t.get_text().replace("\n", " ") for t in ax.texts)


def test_visible_indices_select_the_jobs_gpus_and_number_them_as_the_ranks_see_them(monkeypatch, tmp_path):
    # GPU 0 is busy with someone else's process (pid 555): not the job's, not sampled.
    fake_pynvml(monkeypatch, [RTX] * 4, {0: [(555, 5 * GiB)], 2: [(100, 1 * GiB)], 3: [(101, 2 * GiB)]})
    sampler = sample(tmp_path, {"CUDA_VISIBLE_DEVICES": "2,3"})
    assert [(g.index, g.nvml_index, g.uuid) for g in sampler.gpus] == [(0, 2, UUIDS[2]), (1, 3, UUIDS[3])]
    assert {(r["gpu"], r["nvml_index"]) for r in sampler.gpu_samples} == {(0, 2), (1, 3)}
    assert {(r["rank"], r["gpu"], r["gpu_used_bytes"]) for r in sampler.rss_samples} == {(0, 0, GiB), (1, 1, 2 * GiB)}
    assert sampler.per_process and sampler.notes() == []
    info = json.loads((tmp_path / "samples" / "gpu_info.json").read_text())
    assert info == {"gpus": [{"index": 0, "nvml_index": 2, "uuid": UUIDS[2], "name": RTX},
                             {"index": 1, "nvml_index": 3, "uuid": UUIDS[3], "name": RTX}],
                    "per_process": True, "notes": []}
    samples = tl.runs.read_memory_samples(tmp_path, "gpu")
    assert sorted(samples["gpu"].unique()) == [0, 1] and samples.attrs["notes"] == []


def test_uuids_in_cuda_visible_devices_are_matched_in_their_order(monkeypatch, tmp_path):
    fake_pynvml(monkeypatch, [RTX] * 4, {3: [(100, GiB)], 1: [(101, GiB)]})
    # CUDA takes a unique prefix of a UUID; the list's order is the ranks' order (cuda:0 is NVML's GPU 3).
    sampler = sample(tmp_path, {"CUDA_VISIBLE_DEVICES": f"{UUIDS[3]},GPU-bbbb"})
    assert [(g.index, g.nvml_index) for g in sampler.gpus] == [(0, 3), (1, 1)]
    assert {(r["rank"], r["gpu"]) for r in sampler.rss_samples} == {(0, 0), (1, 1)}
    sampler = sample(tmp_path, {})  # unset: every GPU, in NVML's order (same models: CUDA's order agrees)
    assert [g.nvml_index for g in sampler.gpus] == [0, 1, 2, 3] and sampler.gpus[0].uuid == UUIDS[0]


def test_no_matching_worker_pid_is_recorded_and_shown(monkeypatch, tmp_path):
    """In a container without the host PID namespace NVML lists host PIDs: nothing matches the workers."""
    fake_pynvml(monkeypatch, [RTX] * 2, {0: [(48100, 3 * GiB)], 1: [(48101, 3 * GiB)]})
    sampler = sample(tmp_path, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert sampler.pid_mismatch() and not sampler.per_process
    assert sampler.notes() == [PID_MISMATCH_NOTE]
    assert PID_MISMATCH_NOTE == ("no worker process matched NVML's process list (container without host PID "
                                 "namespace?): GPU memory is per device, not per process")
    assert not any("gpu_used_bytes" in r for r in sampler.rss_samples), "no made-up per-process numbers"
    # Everything that reads the run directory gets the note: the result, the samples, the plot.
    result = LaunchResult(run_dir=tmp_path, command=[], returncode=0, wall_time_s=1.0,
                          plan=DevicePlan("cuda", "nccl", 2, 2))
    assert result.memory_notes() == [PID_MISMATCH_NOTE]
    samples = result.memory_samples()
    assert samples.attrs["notes"] == [PID_MISMATCH_NOTE]
    ax = tl.plots.plot_memory(samples).axes[0]
    assert "RSS" in ax.get_ylabel()
    assert PID_MISMATCH_NOTE in shown_text(ax)
    fig = tl.plots.plot_run(pd.DataFrame(), samples)  # notebook 01's cell: tl.plots.plot_run(metrics, result.memory_samples())
    assert PID_MISMATCH_NOTE in shown_text(fig.axes[1])


def test_gpus_nobody_used_yet_are_no_pid_mismatch(monkeypatch, tmp_path):
    fake_pynvml(monkeypatch, [RTX] * 2, {})  # a job that failed before its first CUDA call: nothing listed
    sampler = sample(tmp_path, {"CUDA_VISIBLE_DEVICES": "0,1"})
    assert sampler.gpu_samples and not sampler.pid_mismatch() and sampler.notes() == []


def test_without_nvml_only_rss_is_sampled(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # "import pynvml" raises ImportError
    sampler = sample(tmp_path, {})
    assert sampler.rss_samples and not sampler.gpu_samples and sampler.notes() == []
    assert not (tmp_path / "samples" / "gpu.jsonl").exists() and not (tmp_path / "samples" / "gpu_info.json").exists()
    assert tl.runs.read_memory_samples(tmp_path).attrs["notes"] == []


@pytest.mark.parametrize("value, entries", [
    (None, None), ("", []), ("0,1", [0, 1]), (" 3 , 1", [3, 1]), ("0,-1,1", [0]), ("1,none,2", [1]),
    ("1gpu,2", [1, 2]), ("0,1,0", []), ("GPU-ab,GPU-cd", ["GPU-ab", "GPU-cd"]), ("GPU-ab,1", ["GPU-ab"]),
    ("0,GPU-ab", [0]), ("MIG-xyz", ["MIG-xyz"]),
])
def test_cuda_visible_devices_is_read_as_cuda_reads_it(value, entries):
    assert parse_visible_devices(value) == entries


def test_mapping_notes_what_it_cannot_know():
    two_models = [(UUIDS[0], "NVIDIA GeForce RTX 4090 D"), (UUIDS[1], "NVIDIA GeForce RTX 3090")]
    gpus, notes = map_visible_gpus([1], two_models)  # CUDA's default order puts the faster GPU first
    assert [g.nvml_index for g in gpus] == [1] and notes == [ORDER_NOTE]
    assert map_visible_gpus([1], two_models, device_order="PCI_BUS_ID")[1] == [], "PCI_BUS_ID: NVML's order"
    assert map_visible_gpus([UUIDS[1]], two_models)[1] == [], "a UUID names one GPU in any order"
    assert map_visible_gpus([0, 5, 1], two_models)[0] == [VisibleGPU(0, 0, UUIDS[0], two_models[0][1])], \
        "an index past the last GPU ends the list, as in CUDA"
    assert map_visible_gpus(["GPU-"], two_models)[0] == [], "an ambiguous UUID prefix matches nothing"
    assert map_visible_gpus(["MIG-1"], two_models) == ([], [MIG_NOTE])


@pytest.mark.integration
@pytest.mark.parametrize("start", ["warm", "cold"])
def test_every_rank_is_sampled_while_it_runs(run_root, start):
    """Each rank finishes only once the sampler has written a row for its pid (a state, not a duration: a warm
    6-step job can end before a 5 Hz sampler sees it); the samples then name both ranks with a real RSS."""
    run_dir = tl.new_run_dir("sampled", run_root)
    script = run_dir / "wait_for_sample.py"
    script.write_text(
        "import json, os, time\n"
        "import torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "deadline = time.monotonic() + 60\n"
        "def sampled():\n"
        "    try:\n"
        "        rows = [json.loads(line) for line in open('samples/rss.jsonl') if line.endswith('\\n')]\n"
        "    except OSError:\n"
        "        return False\n"
        "    return any(r['pid'] == os.getpid() for r in rows)\n"
        "while not sampled() and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "dist.barrier()\n"
        "dist.destroy_process_group()\n")
    result = tl.launch(tl.LaunchSpec(script, device="cpu", live="off", timeout_s=120, warm=start == "warm"))
    samples = result.memory_samples()
    assert set(samples["rank"]) == {0, 1} and (samples["rss_bytes"] > 0).all()
    # A cold rank's first sample can come while Python starts (7 MB seen); by its end it has imported torch.
    assert (samples.groupby("rank")["rss_bytes"].max() > 50 * 2**20).all()

