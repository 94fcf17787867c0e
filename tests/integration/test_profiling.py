"""Notebook 08's measurements: profiler traces read into intervals, the timeline, SDPA backends, and the profiler's
output noise. Synthetic traces pin the arithmetic; one real 2-rank launch pins the event names torch writes."""

import json
import subprocess
import sys

import pytest
import torch
from matplotlib.figure import Figure

import tutorial_lib as tl
from tutorial_lib.torchrun.noise import NoiseFilter, is_noise
from tutorial_lib.runs.rundir import LESSONS_DIR

MAIN, GLOO_A, GLOO_B = 100, 201, 202


def x(name, ts_us, dur_us, tid=MAIN, cat="cpu_op", **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts_us, "dur": dur_us, "args": args}


def cpu_step(k, t0):
    """One recorded DDP step on gloo, in µs from t0: forward 0-1000, backward 1000-3000 (two autograd ops),
    bucket 0's all-reduce 2000-4000 and bucket 1's 3100-3500 on gloo threads, optimizer 4200-4700, then the loss's
    all-reduce 4800-4900."""
    return [
        x(f"ProfilerStep#{k}", t0, 5000, cat="user_annotation"),
        x("DistributedDataParallel.forward", t0, 1000, cat="user_annotation"),
        x("autograd::engine::evaluate_function: AddmmBackward0", t0 + 1000, 1200),
        x("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", t0 + 2500, 500),
        x("c10d::allreduce_", t0 + 1900, 50),
        x("gloo:all_reduce", t0 + 2000, 2000, tid=GLOO_A, cat="user_annotation"),
        x("gloo:all_reduce", t0 + 3100, 400, tid=GLOO_B, cat="user_annotation"),
        x("Optimizer.step#AdamW.step", t0 + 4200, 500, cat="user_annotation"),
        x("gloo:all_reduce", t0 + 4800, 100, tid=GLOO_A, cat="user_annotation"),
    ]


def write_traces(folder, traces):
    metrics = folder / "metrics"
    metrics.mkdir(parents=True)
    for rank, events in traces.items():
        (metrics / f"trace_rank{rank}.json").write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return folder


@pytest.fixture
def cpu_run(tmp_path):
    # rank 1 starts 10 ms later: times are from the first recorded step of any rank
    return write_traces(tmp_path, {0: cpu_step(2, 1_000_000) + cpu_step(3, 1_006_000),
                                   1: cpu_step(2, 1_010_000)})


def test_cpu_trace_becomes_one_interval_per_phase_and_collective(cpu_run):
    iv = tl.runs.read_trace_intervals(cpu_run)
    assert list(iv.columns) == ["rank", "step", "phase", "lane", "where", "name", "start_ms", "end_ms", "duration_ms"]
    first = iv[(iv["rank"] == 0) & (iv["step"] == 3)]  # ProfilerStep#2 is the script's step 3
    assert list(zip(first["phase"], first["start_ms"], first["end_ms"])) == [
        ("forward", 0.0, 1.0), ("backward", 1.0, 3.0), ("all-reduce", 2.0, 4.0), ("all-reduce", 3.1, 3.5),
        ("optimizer", 4.2, 4.7), ("other collective", 4.8, 4.9)]
    assert set(first.loc[first["phase"] == "all-reduce", "where"]) == {f"gloo thread {GLOO_A}", f"gloo thread {GLOO_B}"}
    assert sorted(iv.groupby("rank")["step"].unique().map(list)) == [[3], [3, 4]]
    assert iv[iv["rank"] == 1]["start_ms"].min() == 10.0


def test_step_breakdown_measures_overlap_and_exposed_all_reduce(cpu_run):
    b = tl.runs.step_breakdown(tl.runs.read_trace_intervals(cpu_run)).loc[(0, 3)]
    assert b["forward_ms"] == 1.0 and b["backward_ms"] == 2.0 and b["optimizer_ms"] == pytest.approx(0.5)
    assert b["allreduce_ms"] == 2.0, "the union of the two buckets' all-reduces (2-4 ms), not the loss's"
    assert b["overlap_ms"] == 1.0 and b["exposed_allreduce_ms"] == 1.0
    assert b["comm_compute_ratio"] == pytest.approx(2.0 / 3.0)
    overlaps = tl.runs.overlap_intervals(tl.runs.read_trace_intervals(cpu_run))
    assert list(overlaps.itertuples(index=False, name=None)) == [(0, 3, 2.0, 3.0), (0, 4, 8.0, 9.0),
                                                                 (1, 3, 12.0, 13.0)]


def test_gpu_kernels_take_the_phase_of_the_cpu_interval_that_launched_them(tmp_path):
    t0 = 5_000_000

    def launch(correlation, ts):
        return x("cudaLaunchKernel", ts, 5, cat="cuda_runtime", correlation=correlation)

    def kernel(name, correlation, ts, dur, stream):
        return x(name, ts, dur, tid=stream, cat="kernel", correlation=correlation, device=0, stream=stream)

    events = [x("ProfilerStep#2", t0, 5000, cat="user_annotation"),
              x("DistributedDataParallel.forward", t0, 1000, cat="user_annotation"),
              x("autograd::engine::evaluate_function: AddmmBackward0", t0 + 1000, 1000, tid=300),  # autograd's thread
              x("Optimizer.step#AdamW.step", t0 + 3000, 500, cat="user_annotation"),
              launch(1, t0 + 100), kernel("sm90_xmma_gemm_f32", 1, t0 + 1500, 400, 7),
              launch(2, t0 + 1200), kernel("sm90_xmma_gemm_f32", 2, t0 + 2000, 800, 7),
              launch(3, t0 + 1300), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                                           3, t0 + 2500, 600, 21),
              launch(4, t0 + 3100), kernel("multi_tensor_apply_kernel", 4, t0 + 3200, 100, 7),
              launch(5, t0 + 3600), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                                           5, t0 + 3700, 50, 21),
              kernel("orphan_kernel_without_launch", 99, t0 + 100, 10, 7),
              # the GPU's copies of the annotations, spanning their kernels: not host phases or steps
              x("ProfilerStep#2", t0 + 1500, 2250, tid=7, cat="gpu_user_annotation"),
              x("DistributedDataParallel.forward", t0 + 1500, 1500, tid=7, cat="gpu_user_annotation")]
    iv = tl.runs.read_trace_intervals(write_traces(tmp_path, {0: events}))
    assert list(zip(iv["phase"], iv["lane"], iv["where"])) == [
        ("forward", "compute", "cuda:0 stream 7"), ("backward", "compute", "cuda:0 stream 7"),
        ("all-reduce", "communication", "cuda:0 stream 21"), ("optimizer", "compute", "cuda:0 stream 7"),
        ("other collective", "communication", "cuda:0 stream 21")]
    b = tl.runs.step_breakdown(iv).loc[(0, 3)]
    assert b["backward_ms"] == pytest.approx(0.8) and b["allreduce_ms"] == pytest.approx(0.6)
    assert b["overlap_ms"] == pytest.approx(0.3), "the NCCL kernel overlaps the backward GEMM on the GPU (2.5-2.8 ms)"


def ddp_step(k, t0, buckets):
    """One recorded DDP step on gloo (µs from t0) whose backward runs 5 autograd ops, 0-4, 400 µs apart; DDP issues
    bucket i's all-reduce (``c10d::allreduce_``, with its recorded shape) inside the op of ``buckets[i]``; gloo runs
    each on its thread before the optimizer; the loss's all-reduce comes after it."""
    events = [x(f"ProfilerStep#{k}", t0, 9000, cat="user_annotation"),
              x("DistributedDataParallel.forward", t0, 1000, cat="user_annotation")]
    events += [x(f"autograd::engine::evaluate_function: Op{i}", t0 + 1000 + 400 * i, 300) for i in range(5)]
    for i, (op, elements) in enumerate(buckets):
        issued = t0 + 1000 + 400 * op + 100
        recorded = {"Input Dims": [[[elements]], [], [], [], [], []],
                    "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"]}
        events.append(x("c10d::allreduce_", issued, 50, **recorded))
        events.append(x("gloo:all_reduce", issued + 60, 2000, tid=GLOO_A + i, cat="user_annotation",
                        **{"Input Dims": [[elements]], "Input type": ["float"]}))
    events += [x("Optimizer.step#AdamW.step", t0 + 6000, 500, cat="user_annotation"),
               x("c10d::allreduce_", t0 + 6600, 50, **{"Input Dims": [[[1]], [], [], [], [], []]}),
               x("gloo:all_reduce", t0 + 6700, 100, tid=GLOO_A, cat="user_annotation",
                 **{"Input Dims": [[1]], "Input type": ["float"]})]
    return events


def test_allreduce_launches_say_which_bucket_was_issued_while_backward_still_ran(tmp_path):
    """Notebook 08's overlap criterion, from the order of events: two buckets (the first issued in op 2 of 0-4) meet
    it, the same model in one bucket (issued in the last op) is its control and must not."""
    two = write_traces(tmp_path / "two", {0: ddp_step(2, 1_000_000, [(2, 1000), (4, 500)]),
                                          1: ddp_step(2, 1_000_000, [(2, 1000), (4, 500)])})
    one = write_traces(tmp_path / "one", {0: ddp_step(2, 1_000_000, [(4, 1500)])})
    launches = tl.runs.read_allreduce_launches(two)
    assert list(launches.columns) == ["rank", "step", "bucket", "issued_ms", "elements", "element_bytes", "bytes",
                                      "backward_ops_after"]
    rank0 = launches[launches["rank"] == 0]
    assert rank0[["step", "bucket", "elements", "bytes", "backward_ops_after"]].values.tolist() == [
        [3, 0, 1000, 4000, 2], [3, 1, 500, 2000, 0]], "the loss's all-reduce after the optimizer is left out"
    assert rank0["issued_ms"].tolist() == [1.9, 2.7]
    control = tl.runs.read_allreduce_launches(one)
    assert control[["bucket", "elements", "bytes", "backward_ops_after"]].values.tolist() == [[0, 1500, 6000, 0]]
    assert launches.groupby(["rank", "step"])["bytes"].sum().tolist() == [6000, 6000] == [control["bytes"].sum()] * 2


def test_allreduce_launches_read_nccls_dtype_and_say_nan_without_recorded_shapes(tmp_path):
    t0 = 2_000_000
    nccl = [x("ProfilerStep#2", t0, 5000, cat="user_annotation"),
            x("autograd::engine::evaluate_function: Op0", t0 + 1000, 300),
            x("c10d::allreduce_", t0 + 1100, 80, **{"Input Dims": [[[8, 4], [3]]]}),
            x("record_param_comms", t0 + 1110, 50, **{"Collective name": "allreduce", "dtype": "BFloat16"}),
            x("autograd::engine::evaluate_function: Op1", t0 + 1400, 300),
            x("Optimizer.step#AdamW.step", t0 + 3000, 500, cat="user_annotation")]
    bare = [x("ProfilerStep#2", t0, 5000, cat="user_annotation"), x("c10d::allreduce_", t0 + 1100, 80)]
    row = tl.runs.read_allreduce_launches(write_traces(tmp_path / "nccl", {0: nccl})).iloc[0]
    assert (row["elements"], row["element_bytes"], row["bytes"], row["backward_ops_after"]) == (35, 2, 70, 1)
    row = tl.runs.read_allreduce_launches(write_traces(tmp_path / "bare", {0: bare})).iloc[0]
    assert row[["elements", "element_bytes", "bytes"]].isna().all(), "no shapes recorded: unknown, not 0"


@pytest.mark.parametrize("content, message", [
    (None, "no trace_rank\\*.json .* --profile-steps N"),
    ("{not json", "cannot read the profiler trace"),
    ('{"traceEvents": 3}', "is not a Chrome trace"),
    ('{"traceEvents": []}', "holds no recorded step"),
])
def test_bad_trace_folders_raise_metrics_error_naming_the_problem(tmp_path, content, message):
    (tmp_path / "metrics").mkdir()
    if content is not None:
        (tmp_path / "metrics" / "trace_rank0.json").write_text(content)
    with pytest.raises(tl.errors.MetricsError, match=message):
        tl.runs.read_trace_intervals(tmp_path)


def test_overlap_of_an_unknown_phase_is_refused(cpu_run):
    with pytest.raises(ValueError, match="phase must be one of .* got 'allreduce'"):
        tl.runs.overlap_intervals(tl.runs.read_trace_intervals(cpu_run), "allreduce", "backward")


def test_timeline_draws_two_rows_per_rank_and_the_overlap(cpu_run):
    iv = tl.runs.read_trace_intervals(cpu_run)
    fig = tl.plots.plot_timeline(iv, tl.runs.overlap_intervals(iv), title="t")
    assert isinstance(fig, Figure)
    (ax,) = fig.axes
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 0 compute", "rank 0 communication",
                                                            "rank 1 compute", "rank 1 communication"]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "forward", "backward", "optimizer", "all-reduce", "other collective", "all-reduce during backward"]


def test_ddp_train_refuses_a_profile_longer_than_the_run(tmp_path):
    out = subprocess.run([sys.executable, LESSONS_DIR / "ddp_train.py", "--max-steps", "4", "--profile-steps", "3"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--profile-steps 3 needs --max-steps >= 5 (the first 2 steps are not recorded), got --max-steps 4" in out.stderr


def test_one_process_writes_a_trace_without_all_reduce(tmp_path):
    out = subprocess.run([sys.executable, LESSONS_DIR / "ddp_train.py", "--max-steps", "4", "--profile-steps", "2",
                          "--metrics-dir", "metrics"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    iv = tl.runs.read_trace_intervals(tmp_path)
    assert sorted(iv["step"].unique()) == [3, 4]
    assert set(iv["phase"]) == {"backward", "optimizer"}, "no DDP (no forward annotation) and nothing to all-reduce"


@pytest.mark.integration
def test_two_ranks_trace_ddp_buckets_before_the_optimizer_on_gloo(run_root):
    """The event names of this torch version: DDP's forward, autograd's ops, the optimizer, gloo's all-reduces."""
    result = tl.run_script("ddp_train", ["--max-steps", 4, "--profile-steps", 2, "--input-dim", 256, "--hidden-dim",
                                         512, "--dataset-size", 256], runs_dir=run_root, device="cpu",
                           nproc_per_node=2, timeout_s=120)
    iv = tl.runs.read_trace_intervals(result.run_dir)
    assert sorted(iv["rank"].unique()) == [0, 1] and sorted(iv["step"].unique()) == [3, 4]
    per_step = iv.groupby(["rank", "step"])["phase"].value_counts().unstack(fill_value=0)
    assert (per_step[["forward", "backward", "optimizer"]] == 1).all().all()
    assert (per_step["all-reduce"] == 2).all(), "two DDP buckets: the output and hidden layers, then the input layer"
    assert (per_step["other collective"] == 1).all(), "the logged loss's all-reduce, after the optimizer"
    assert (iv[iv["phase"] != "other collective"]["where"].str.startswith(("cpu thread", "gloo thread"))).all()


@pytest.mark.integration
def test_two_buckets_are_issued_during_backward_and_one_bucket_is_not(run_root):
    """The real traces of this torch version: notebook 08's criterion holds for DDP's default buckets, every step on
    every rank, and fails for --bucket-cap-mb large enough for one bucket; the bytes are the gradients' either way."""
    args = ["--max-steps", 4, "--profile-steps", 2, "--input-dim", 256, "--hidden-dim", 512, "--dataset-size", 256]
    runs = {cap: tl.run_script("ddp_train", args + (["--bucket-cap-mb", cap] if cap else []), runs_dir=run_root,
                               device="cpu", nproc_per_node=2, timeout_s=120) for cap in (None, 1000)}
    grad_bytes = 4 * (256 * 512 + 512 + 512 * 512 + 512 + 512 * 8 + 8)
    for cap, result in runs.items():
        launches = tl.runs.read_allreduce_launches(result.run_dir)
        per_step = launches.groupby(["rank", "step"])
        assert sorted(per_step.groups) == [(0, 3), (0, 4), (1, 3), (1, 4)]
        assert (per_step["bytes"].sum() == grad_bytes).all() and (launches["element_bytes"] == 4).all(), launches
        first = launches[launches["bucket"] == 0]["backward_ops_after"]
        assert (per_step.size() == (2 if cap is None else 1)).all(), launches
        assert (first > 0).all() if cap is None else (first == 0).all(), launches
        assert (per_step["backward_ops_after"].last() == 0).all(), "the last bucket comes with the last gradient"


@pytest.mark.parametrize("line", [
    "USDT:2026-11-30 23:51:58 22779:22779 SyncActivityProfilerHandler.cpp:52] profiler_start",  # torch 2.13
    "USDT:2026-11-30 23:51:58 22779:22779 SyncActivityProfilerHandler.cpp:59] profiler_stop",
    "ERROR:2026-11-30 23:52:11 22851:22851 DeviceProperties.cpp:47] gpuGetDeviceCount failed with code 35",  # 2.8
])
def test_the_profilers_start_and_stop_lines_are_version_noise(line):
    assert is_noise(line) and NoiseFilter().kind(0, line) == NoiseFilter.VERSION


def test_a_real_error_line_is_not_noise():
    assert not is_noise("ERROR: something failed in my script")


def test_sdpa_backends_on_cpu_match_math_and_name_the_default():
    table = tl.probes.sdpa_backends("cpu", seq_len=64, repeats=2)
    assert table["backend"].tolist()[:2] == ["MATH", "FLASH_ATTENTION"]
    runs = table[table["available"]]
    assert set(runs["backend"]) >= {"MATH"} and (runs["max_abs_diff_vs_math"] < 1e-4).all()
    assert runs["median_ms"].gt(0).all() and table.set_index("backend").loc["MATH", "speedup_vs_math"] == 1.0
    assert table.attrs["default"] in set(runs["backend"])
    assert (table.loc[~table["available"], "why_not"].str.len() > 0).all(), "a backend that did not run says why"


def test_default_backend_is_math_where_only_math_may_run():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tutorial_lib.probes.attention import default_backend
    q = torch.randn(1, 2, 16, 8)
    with sdpa_kernel(SDPBackend.MATH):
        assert default_backend(q, q, q) == "MATH"


@pytest.mark.parametrize("kwargs, message", [
    ({"device": "tpu"}, "device must be 'cpu' or 'cuda', got 'tpu'"),
    ({"repeats": 0}, "repeats must be an integer >= 1, got 0"),
    ({"seq_len": 1.5}, "seq_len must be an integer >= 1, got 1.5"),
])
def test_sdpa_backends_refuses_bad_arguments(kwargs, message):
    with pytest.raises(tl.ConfigError, match=message):
        tl.probes.sdpa_backends(**kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without GPUs")
def test_sdpa_backends_on_cuda_without_a_gpu_says_so():
    with pytest.raises(tl.ConfigError, match="device='cuda' but torch.cuda.is_available\\(\\) is False"):
        tl.probes.sdpa_backends("cuda")
