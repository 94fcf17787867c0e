"""Every shipped lesson as a learner gets it (issue 48): the one file copied alone into an empty folder and launched
from there with ``torchrun --nproc-per-node 2``, in a Python that has torch and nothing else, with no workbook
variable set. It must do what it says and write nothing outside that folder.

The Python is a virtual environment made here (no pip) whose site-packages links torch and what torch requires, and
nothing else: no numpy, no tutorial_lib. A lesson that needs more gets only what it says it needs: train_hf.py
transformers (with everything transformers requires), ft_train.py torchft and numpy, and the lessons in
``NUMPY_THROUGH_TORCH`` numpy, which torch's own APIs use there without pip's torch installing it. The folder holds
only the lesson and the files it imports plainly (``COPIED_WITH``: ``train_lm.py``'s ``lm_model.py``, ``lm_data.py``
and ``lm_checkpoint.py``), so ``import _workbook`` (the workbook's sibling module, which a lesson may use only when
present) finds nothing. HOME and TMPDIR point at empty folders of their own: afterwards they may hold only the empty
folders torch itself makes (torchrun's log folder, inductor's cache folder).

A launch costs seconds (torchrun and two ranks each import torch), so ``PARALLEL`` lessons run at once, in the
background, from the first test that needs one; each lesson's test waits for its own. Arguments are each lesson's
smallest that still train a few steps (or show its point). ``tests/integration/test_training_scripts.py`` also runs
every lesson as ``python x.py`` from an empty folder, from the lessons folder itself (siblings in reach), in the
test venv; ``test_lesson_scripts.py`` and others launch them through the workbook.
"""

from __future__ import annotations

import ast
import concurrent.futures
import importlib.metadata
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import venv
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import job_processes
from tutorial_lib.runs.rundir import LESSONS_DIR, available_scripts, sibling_modules

pytestmark = pytest.mark.integration

LESSONS = available_scripts()
# What a learner copies with a lesson: the files beside it that it imports plainly (train_lm.py's lm_model.py, ..., as
# nanoGPT's train.py imports model.py), never the workbook's optional instruments (_workbook.py).
COPIED_WITH = {name: [m for m in sibling_modules(LESSONS_DIR / f"{name}.py") if not m.startswith("_")]
               for name in LESSONS}
CUDA_RANKS = torch.cuda.device_count() >= 2  # each rank a GPU of its own; else the lessons run (or refuse) on CPU
# Launches at once: one alone keeps less than one of two cores busy (torchrun imports torch before its ranks start;
# measured: 166 CPU-s in 194 s for all of them one after another).
PARALLEL = 2
LAUNCH_TIMEOUT_S = 300

# What a lesson may import besides the standard library and torch: the library it teaches, as its docstring says.
# safetensors comes with transformers (a requirement of it: checked below); peft only for --lora-rank.
OWN_LIBRARIES = {"train_hf": {"transformers", "safetensors", "peft"}, "ft_train": {"torchft"}}
# Lessons whose torch APIs need numpy, which pip's torch does not install: torch.distributed's object collectives
# (gather_object, send_object_list, ...) pickle through ``Tensor.numpy()``. Each docstring says so.
NUMPY_THROUGH_TORCH = {"checkpoint_train": "DCP gathers its save plans with gather_object",
                       "pipeline_parallel": "PipelineStage sends the stages' shapes with send_object_list"}
# The distributions each lesson's Python has besides torch (each with everything it requires).
PACKAGES = {"train_hf": ("transformers",), "ft_train": ("torchft", "numpy"),
            **{name: ("numpy",) for name in NUMPY_THROUGH_TORCH}}

TORCHRUN = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
# Per lesson, the commands a learner types in the folder: (torchrun or python, the lesson's arguments).
COMMANDS = {
    "checkpoint_train": [("torchrun", ["--max-steps", 2, "--save-every", 2, "--dataset-size", 64, "--hidden-dim", 16])],
    "collective_mismatch": [("torchrun", ["--max-steps", 2, "--dim", 16])],
    "collectives_check": [("torchrun", ["--sizes-bytes", 4096, "--iters", 1, "--warmup-iters", 0])],
    "compile_train": [("torchrun", ["--max-steps", 2, "--n-layers", 1, "--dim", 16])],
    "context_parallel_float8": [("torchrun", ["--seq-len", 8, "--n-heads", 2, "--head-dim", 8, "--matmul-size", 16])],
    "dataloader_bench": [("torchrun", ["--dataset-size", 8, "--input-dim", 8, "--epochs", 1, "--num-workers", 0, 1,
                                       "--sample-delay-ms", 0])],
    "ddp_knobs": [("torchrun", ["--lessons", "static_graph", "--max-steps", 3, "--hidden-dim", 16, "--n-layers", 2])],
    "ddp_train": [("torchrun", ["--max-steps", 2])],  # being slimmed (issue 48): its plainest command line
    "distributed_eval": [("torchrun", [])],
    "fsdp_knobs": [("torchrun", ["--lessons", "reshard", "--dim", 16, "--n-layers", 1])],
    "fsdp_train": [("torchrun", ["--max-steps", 2, "--dim", 32, "--n-layers", 1, "--seq-len", 16, "--vocab-size", 64])],
    "ft_train": [("torchrun", ["--max-steps", 2, "--dataset-size", 256, "--log-every", 1])],
    "grad_accum": [("torchrun", ["--max-steps", 1, "--grad-accum-steps", 2])],
    "model_parallel": [("torchrun", ["--max-steps", 2, "--batch-size", 8])],
    "pipeline_parallel": [("torchrun", ["--schedules", "gpipe", "--microbatches", 2, "--input-dim", 16,
                                        "--hidden-dim", 32, "--batch-size", 8])],
    "sampler_demo": [("torchrun", [])],
    # its default, SyncBatchNorm, needs GPUs (on CPU it says so and exits 1: one process shows it); --batchnorm plain
    # runs on CPU too
    "sync_batchnorm": [("python", []), ("torchrun", ["--batchnorm", "plain", "--steps", 2])],
    "tensor_parallel": [("torchrun", ["--lessons", "model", "--max-steps", 2, "--dim", 32])],
    "train_hf": [("python", ["--create-tiny-model", "tiny"]),  # its docstring's CPU recipe: a tiny model, then train
                 ("torchrun", ["--model", "tiny", "--max-steps", 2, "--seq-len", 32, "--corpus-bytes", 65536])],
    "train_lm": [("torchrun", ["--max-steps", 2, "--n-layers", 1, "--d-model", 32, "--block-size", 32,
                               "--corpus-bytes", 65536, "--log-every", 1])],
    "uneven_inputs": [("torchrun", ["--join", "--pg-timeout-s", 60])],  # the fix; without --join it hangs by design
    "unused_params": [("torchrun", ["--loss-uses", "both", "--max-steps", 2, "--hidden-dim", 16])],
}
# What a copied lesson may leave in its folder (besides itself).
WRITES = {"checkpoint_train": {"checkpoints"}, "train_hf": {"tiny"}}
# What torch itself leaves in TMPDIR, empty: torchrun's log folder and inductor's cache folder.
TORCH_TEMP = re.compile(r"torchelastic_\w+|torchinductor_\w+")
# What the probe reports importable in the lesson's folder, before the launch.
PROBED = ("_workbook", "tutorial_lib", "numpy", "transformers", "torchft")
PROBE = ("import importlib.util, json; print(json.dumps({m: importlib.util.find_spec(m) is not None for m in "
         f"{PROBED!r}}}))")


# --- A Python with only the given distributions ---------------------------------------------------------------------

def requirement_closure(names) -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions ``names`` and, recursively, everything they require (no extras)."""
    found, todo = {}, list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name not in found:
            found[name] = dist = importlib.metadata.distribution(name)
            todo += [r.name for r in map(Requirement, dist.requires or [])
                     if r.marker is None or r.marker.evaluate({"extra": ""})]
    return found


def top_level_entries(dist: importlib.metadata.Distribution) -> set[str]:
    """The names a distribution puts in site-packages (packages, modules, its .dist-info), from its RECORD."""
    if dist.files is None:  # no RECORD (not installed by pip): its top_level.txt, else its name
        tops = set((dist.read_text("top_level.txt") or canonicalize_name(dist.metadata["Name"])).split())
        return tops | {Path(str(dist._path)).name} if hasattr(dist, "_path") else tops
    return {f.parts[0] for f in dist.files
            if f.parts[0] not in ("..", "__pycache__") and not f.parts[0].endswith(".pth")}


def link(source: Path, target: Path):
    """Symlink ``source`` at ``target``; two distributions sharing a namespace folder (google/, nvidia/) from
    different site-packages get a real folder whose entries are linked one by one."""
    if not target.exists() and not target.is_symlink():
        target.symlink_to(source)
    elif target.resolve() != source.resolve() and source.is_dir() and target.is_dir():
        if target.is_symlink():
            first = target.resolve()
            target.unlink()
            target.mkdir()
            for entry in first.iterdir():
                (target / entry.name).symlink_to(entry)
        for entry in source.iterdir():
            link(entry, target / entry.name)


def python_with_only(folder: Path, names) -> Path:
    """A virtual environment in ``folder`` (no pip) whose site-packages links the distributions ``names`` and
    everything they require, nothing else; its python."""
    venv.EnvBuilder(symlinks=True, with_pip=False).create(folder)
    site = next(folder.glob("lib/python*/site-packages"))
    for dist in requirement_closure(names).values():
        base = Path(dist.locate_file(""))
        for top in sorted(top_level_entries(dist)):
            if (base / top).exists():
                link(base / top, site / top)
    return folder / "bin" / "python"


# --- Launching a copied lesson ---------------------------------------------------------------------------------------

@dataclass
class Command:
    argv: list[str]
    returncode: int | None  # None: killed after LAUNCH_TIMEOUT_S
    stdout: str
    stderr: str
    seconds: float


@dataclass
class Run:
    name: str
    base: Path  # folder/ (the learner's), home/ and tmp/ (HOME and TMPDIR)
    listing_before: list[str]
    importable: dict[str, bool]
    commands: list[Command] = field(default_factory=list)
    left_processes: list[str] = field(default_factory=list)

    @property
    def folder(self) -> Path:
        return self.base / "folder"

    @property
    def seconds(self) -> float:
        return sum(c.seconds for c in self.commands)

    def json(self, path: str) -> dict:
        return json.loads((self.folder / path).read_text())

    def last_row(self, path: str) -> dict:
        return json.loads((self.folder / path).read_text().splitlines()[-1])

    def per_rank(self, pattern: str) -> list[dict]:
        return [self.json(pattern.format(rank)) for rank in (0, 1)]

    def output(self, i: int = -1) -> str:
        return self.commands[i].stdout

    def failure(self, i: int = -1) -> str:
        c = self.commands[i]
        return f"{' '.join(c.argv)} exited {c.returncode} after {c.seconds:.0f} s; stdout:\n{c.stdout[-3000:]}\n" \
               f"stderr:\n{c.stderr[-5000:]}"


def learner_environment(home: Path, tmp: Path) -> dict[str, str]:
    """This process's environment without PYTHONPATH, PYTHONHOME, VIRTUAL_ENV or any of the workbook's variables
    (TUTORIAL_*: runs folder, live view, observer, warm starts); HOME and TMPDIR empty folders of their own.
    PYTHONWARNINGS stays: as in every script the tests launch, torch's deprecations are errors.
    PYTHONUNBUFFERED goes (this machine's environment sets it; a learner's shell need not). torchrun runs its ranks
    with ``python -u`` anyway, so a lesson whose ranks print writes each line in one write: ``print`` writes its text
    and its newline apart, and another rank's line can fall between them (CI: "batches_committed 2group 0 step 2")."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("TUTORIAL_")
           and k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONUNBUFFERED")}
    env.update(HOME=str(home), TMPDIR=str(tmp))
    return env


class Launcher:
    """Launches the selected lessons ``PARALLEL`` at a time in the background; ``run(name)`` waits for one."""

    def __init__(self, names, tmp_path_factory):
        self.tmp_path_factory = tmp_path_factory
        self.pythons: dict[tuple[str, ...], Path] = {}
        self.live: set[subprocess.Popen] = set()
        self.lock = threading.Lock()
        self.stopping = False
        self.pool = concurrent.futures.ThreadPoolExecutor(PARALLEL, thread_name_prefix="lesson")
        self.futures = {name: self.pool.submit(self.launch, name) for name in names}

    def run(self, name: str) -> Run:
        return self.futures[name].result()

    def python_for(self, name: str) -> Path:
        """The Python of ``name``: torch and ``PACKAGES[name]``, each with what it requires (made once per set)."""
        packages = PACKAGES.get(name, ())
        with self.lock:
            if packages not in self.pythons:
                folder = self.tmp_path_factory.mktemp("python")
                self.pythons[packages] = python_with_only(folder, ["torch", *packages])
            return self.pythons[packages]

    def launch(self, name: str) -> Run:
        python = self.python_for(name)
        with self.lock:
            base = self.tmp_path_factory.mktemp(name)
        folder, home, tmp = base / "folder", base / "home", base / "tmp"
        for path in (folder, home, tmp):
            path.mkdir()
        for file in (f"{name}.py", *COPIED_WITH[name]):
            shutil.copy2(LESSONS_DIR / file, folder)
        env = learner_environment(home, tmp)
        probe = subprocess.run([str(python), "-c", PROBE], cwd=folder, env=env, capture_output=True, text=True,
                               timeout=60, check=True)
        run = Run(name, base, sorted(os.listdir(folder)), json.loads(probe.stdout))
        for kind, args in COMMANDS[name]:
            argv = [str(python), *(TORCHRUN if kind == "torchrun" else ()), f"{name}.py", *map(str, args)]
            run.commands.append(self.command(argv, folder, env))
            if self.stopping:
                break
        left = job_processes(str(base) + os.sep)  # a rank's cwd is the folder
        run.left_processes = [" ".join(p.info["cmdline"] or []) for p in left]
        for p in left:
            p.kill()
        return run

    def command(self, argv: list[str], cwd: Path, env: dict[str, str]) -> Command:
        start = time.monotonic()
        # a session of its own: on a timeout the whole job (torchrun and its ranks) is killed
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        with self.lock:
            self.live.add(proc)
        try:
            stdout, stderr = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
            returncode = proc.returncode
        except subprocess.TimeoutExpired:
            self.kill(proc)
            stdout, stderr = proc.communicate()
            returncode = None
        finally:
            with self.lock:
                self.live.discard(proc)
        return Command(argv, returncode, stdout, stderr, time.monotonic() - start)

    @staticmethod
    def kill(proc: subprocess.Popen):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def close(self):
        """Stop what is still running (an interrupted session) and wait for the threads."""
        self.stopping = True
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self.lock:
            for proc in list(self.live):
                self.kill(proc)
        self.pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def launcher(request, tmp_path_factory):
    selected = [item.callspec.params["name"] for item in request.session.items
                if getattr(item, "module", None) is request.module
                and getattr(item, "originalname", None) == "test_the_lesson_runs_copied_alone"]
    launcher = Launcher(selected, tmp_path_factory)
    yield launcher
    launcher.close()


# --- What each lesson does -------------------------------------------------------------------------------------------

def steps_done(run: Run, pattern: str, steps: int):
    rows = [run.last_row(pattern.format(rank)) for rank in (0, 1)]
    assert [(r["rank"], r["step"], r["world_size"]) for r in rows] == [(0, steps, 2), (1, steps, 2)], rows


def check_checkpoint_train(run):
    # alone: the checkpoint, no metrics (the per-step records and save timings are _workbook.py's, issue 48)
    assert len(re.findall(r"^step 2: saved step-2 \(dcp\) loss_global \d+\.\d+$", run.output(), re.M)) == 2
    assert sorted(os.listdir(run.folder / "checkpoints")) == ["step-2"], "complete, no .tmp-step-2 left"
    assert run.json("checkpoints/step-2/checkpoint.json")["step"] == 2
    assert not (run.folder / "metrics").exists()


def check_collective_mismatch(run):
    steps_done(run, "metrics/rank{}.jsonl", 2)
    assert "rank 0: 2 steps done" in run.output() and "rank 1: 2 steps done" in run.output()


def check_collectives_check(run):
    for r in run.per_rank("metrics/collectives_rank{}.json"):
        assert r["world_size"] == 2 and len(r["checks"]) == 3 and all(c["ok"] for c in r["checks"]), r["checks"]
        assert r["backend"] == ("nccl" if CUDA_RANKS else "gloo")
    assert "rank 0: 3 collectives correct" in run.output() and "rank 1: 3 collectives correct" in run.output()


def check_compile_train(run):
    for rank, r in enumerate(run.per_rank("metrics/compile_rank{}.json")):
        last = r["rows"][-1]
        assert (last["form"], last["step"], last["rank"], last["world_size"]) == ("compile-then-ddp", 2, rank, 2)
        assert last["graphs"] >= 1
    assert "rank 1 compile-then-ddp step 2" in run.output()


def check_context_parallel_float8(run):
    # Alone it writes no JSON (that is _workbook.py's, issue 48): it prints why each technique did or did not run.
    assert not (run.folder / "metrics").exists()
    if not CUDA_RANKS:  # both are GPU-only: on CPU each says why it did not run
        # torch's CPU attention has no sharding strategy; without numpy, context parallelism does not even import
        assert re.search(r"^context_parallel: did not run on 2 rank\(s\): (NotImplementedError|ModuleNotFoundError: "
                         r"No module named 'numpy')", run.output(), re.M), run.output()
        assert "float8: did not run on 2 rank(s): float8 matmuls (torch._scaled_mm) need a CUDA GPU" in run.output()


def check_dataloader_bench(run):
    for r in run.per_rank("metrics/loader_rank{}.json"):
        assert [(row["num_workers"], row["persistent_workers"], row["samples"]) for row in r["rows"]] == \
            [(0, False, 4), (1, False, 4), (1, True, 4)], "8 samples, 4 per rank, with and without a worker process"


def check_ddp_knobs(run):
    for r in run.per_rank("metrics/ddp_knobs_rank{}.json"):
        assert set(r["static_graph"]) >= {"True", "False"}
    assert "static_graph: True vs False: the same losses" in run.output()


def check_ddp_train(run):
    # what a learner sees, on both ranks: the global loss; its metrics files are _workbook.py's (issue 48)
    assert len(re.findall(r"^step 2/2: loss \d+\.\d+ \(this rank's \d+\.\d+\), epoch 0$", run.output(), re.M)) == 2
    assert not (run.folder / "metrics").exists()


def check_distributed_eval(run):
    ranks = run.per_rank("metrics/eval_rank{}.json")
    for r in ranks:
        assert r["gathered"] == r["exact"] and r["exact"]["samples"] == 11 and r["naive"]["samples"] == 12
    assert sorted(ranks[0]["shard_indices"] + ranks[1]["shard_indices"]) == list(range(11)), "each sample once"
    assert "gathered: loss" in run.output()


def check_fsdp_knobs(run):
    for r in run.per_rank("metrics/knobs_rank{}.json"):
        assert r["world_size"] == 2 and set(r["reshard"]) == {"default (None)", "True", "False"}
    assert "reshard (rank 0 of 2): reshard_after_forward=False" in run.output()


def check_fsdp_train(run):
    # alone: both ranks print the same global loss each step; the JSON records are _workbook.py's (issue 48)
    losses = re.findall(r"^step (\d)/2 loss_global (\S+) step_time_s", run.output(), re.M)
    assert sorted(step for step, _ in losses) == ["1", "1", "2", "2"], run.output()
    assert len({loss for step, loss in losses if step == "2"}) == 1, "one global loss"
    assert not (run.folder / "metrics").exists()


def check_ft_train(run):
    # alone: no records (they are _workbook.py's, issue 48); each rank prints its committed steps
    last = re.findall(r"^group 0 step 2 loss \d+\.\d+ participants 1 batches_committed (\d+)$", run.output(), re.M)
    assert last == ["2", "2"], run.output()
    assert not (run.folder / "metrics").exists()


def check_grad_accum(run):
    steps_done(run, "metrics/rank{}.jsonl", 1)
    assert run.last_row("metrics/rank0.jsonl")["all_reduce_calls"] == 1, "no_sync: one all-reduce round per step"
    p0, p1 = (torch.load(run.folder / "metrics" / f"params_rank{rank}.pt") for rank in (0, 1))
    assert all(torch.equal(p0[k], p1[k]) for k in p0), "replicas stay identical"


def check_model_parallel(run):
    steps_done(run, "metrics/rank{}.jsonl", 2)
    for r in run.per_rank("metrics/mp_rank{}.json"):
        assert r["max_abs_diff_vs_one_device"] < 1e-5
        if not torch.cuda.is_available():
            assert r["split_across_devices"] is False
    if not torch.cuda.is_available():  # it needs 2 devices per rank to split the model for real, and says so
        assert "both halves on cpu: fewer than 2 devices for this rank, so the split is only logical" in run.output()


def check_pipeline_parallel(run):
    # alone: each stage prints its gradients against the unsplit model's, the last its loss (the stages' timelines and
    # pp_rank<R>.json are _workbook.py's, issue 48)
    lines = re.findall(r"^stage (\d) of 2, gpipe(, scale_grads=False)?, 2 micro-batch\(es\): (?:loss (\S+) \(unsplit "
                       r"(\S+)\), )?gradients within (\S+) of the unsplit model's$", run.output(), re.M)
    assert sorted((stage, control) for stage, control, *_ in lines) == [
        ("0", ""), ("0", ", scale_grads=False"), ("1", ""), ("1", ", scale_grads=False")], run.output()
    for stage, control, loss, unsplit, diff in lines:
        assert bool(loss) == (stage == "1"), "the last stage holds the loss"
        assert stage == "0" or abs(float(loss) - float(unsplit)) <= 1e-5, "the mean micro-batch loss: the unsplit one"
        assert (float(diff) <= 1e-6) == (control == ""), "scale_grads=False: the gradients m times too large"
    assert not (run.folder / "metrics").exists()


def check_sampler_demo(run):
    for r in run.per_rank("metrics/sampler_rank{}.json"):
        assert r["world_size"] == 2 and r["dataset_size"] == 11
    assert "without set_epoch (the mistake), epoch 1" in run.output()


def check_sync_batchnorm(run):
    refused, plain = run.commands
    if torch.cuda.is_available():
        assert refused.returncode == 0, run.failure(0)
        assert run.json("metrics/syncbn_rank0.json")["max_abs_diff_vs_global"] < 1e-5
    else:  # SyncBatchNorm needs GPUs: it says so and exits 1; the CPU part runs
        assert refused.returncode == 1, run.failure(0)
        assert "sync_batchnorm.py needs CUDA GPUs: SyncBatchNorm does not run on CPU" in refused.stderr
    assert plain.returncode == 0, run.failure(1)
    for r in run.per_rank("metrics/batchnorm_rank{}.json"):
        assert len(r["sync_buffers=True"]["batch_mean"]) == 2
    assert "plain BatchNorm, 2 steps" in plain.stdout


def check_tensor_parallel(run):
    # alone: rank 0 prints each step's loss beside one process's (the JSON is _workbook.py's, issue 48)
    steps = re.findall(r"^model, (TP|TP \+ SP), step (\d+): loss ([\d.]+), one process ([\d.]+)$", run.output(), re.M)
    assert [(layout, step) for layout, step, _, _ in steps] == [("TP", "1"), ("TP", "2"), ("TP + SP", "1"),
                                                                ("TP + SP", "2")], run.output()
    assert all(abs(float(loss) - float(one)) < 1e-4 for _, _, loss, one in steps), "the one-process losses"
    assert "model: done on 2 rank(s)" in run.output()


def check_train_hf(run):
    assert run.commands[0].returncode == 0, run.failure(0)
    assert {"config.json", "model.safetensors"} <= set(os.listdir(run.folder / "tiny"))
    # alone: rank 0 prints each step's global loss; the JSON records and --track-memory are _workbook.py's (issue 48)
    assert re.search(r"^step 1/2 loss \d+\.\d{4} lr \S+$", run.output(), re.M), run.output()
    assert re.search(r"^step 2/2 loss \d+\.\d{4} lr \S+$", run.output(), re.M), run.output()
    assert not (run.folder / "metrics").exists()


def check_train_lm(run):
    # alone: rank 0 prints each step's global loss and the held-out loss; the JSON records are _workbook.py's (issue 48)
    assert re.search(r"^step 1/2 loss \d+\.\d{4} lr \S+ tokens/s \d+$", run.output(), re.M), run.output()
    assert re.search(r"^step 2/2 loss \d+\.\d{4} eval_loss \d+\.\d{4} lr ", run.output(), re.M), run.output()
    assert not (run.folder / "metrics").exists()  # and its model came from lm_model.py beside it: nothing else has one


def check_uneven_inputs(run):
    assert [run.last_row(f"metrics/rank{rank}.jsonl")["step"] for rank in (0, 1)] == [4, 6], "rank 1: 2 extra batches"
    assert run.output().count("all ranks finished") == 2


def check_unused_params(run):
    steps_done(run, "metrics/rank{}.jsonl", 2)
    assert "rank 0: 2 steps done" in run.output() and "rank 1: 2 steps done" in run.output()


CHECKS = {name.removeprefix("check_"): check for name, check in list(globals().items()) if name.startswith("check_")}


def test_every_lesson_has_a_command_and_a_check():
    assert sorted(COMMANDS) == sorted(CHECKS) == LESSONS


@pytest.mark.parametrize("name", LESSONS)
def test_the_lesson_runs_copied_alone(launcher, name):
    run = launcher.run(name)
    print(f"{name}: {run.seconds:.1f} s ({', '.join(f'{c.seconds:.1f}' for c in run.commands)}), stdout "
          f"{', '.join(str(len(c.stdout)) for c in run.commands)} chars")
    assert run.listing_before == sorted([f"{name}.py", *COPIED_WITH[name]]), "the folder holds only the lesson"
    numpy = "numpy" in PACKAGES.get(name, ()) or "transformers" in PACKAGES.get(name, ())
    assert run.importable == {"_workbook": False, "tutorial_lib": False, "numpy": numpy,
                              "transformers": name == "train_hf", "torchft": name == "ft_train"}, run.importable
    assert all(c.returncode is not None for c in run.commands), f"killed after {LAUNCH_TIMEOUT_S} s:\n{run.failure()}"
    assert not run.left_processes, run.left_processes
    assert run.commands[-1].returncode == 0, run.failure()
    CHECKS[name](run)
    imported = {*COPIED_WITH[name], "__pycache__"} if COPIED_WITH[name] else set()  # and Python's bytecode cache
    assert set(os.listdir(run.folder)) <= {f"{name}.py", *imported, "metrics", *WRITES.get(name, ())}, \
        os.listdir(run.folder)
    assert sorted(os.listdir(run.base)) == ["folder", "home", "tmp"]
    assert list((run.base / "home").iterdir()) == [], "nothing written to HOME"
    temp = list((run.base / "tmp").iterdir())
    assert all(TORCH_TEMP.fullmatch(p.name) for p in temp), [p.name for p in temp]
    files = [str(p.relative_to(run.base)) for d in temp for p in d.rglob("*") if not p.is_dir()]
    assert files == [], f"files written to TMPDIR: {files}"


# --- What the lessons import -----------------------------------------------------------------------------------------

def guarded_by_import_error(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    """Whether ``node`` sits in the body of a ``try`` that catches ImportError (or ModuleNotFoundError)."""
    child, parent = node, parents.get(node)
    while parent is not None:
        if isinstance(parent, ast.Try) and child in parent.body:
            caught = [h.type for h in parent.handlers]
            names = {n.id for t in caught if t is not None for n in ast.walk(t) if isinstance(n, ast.Name)}
            if names & {"ImportError", "ModuleNotFoundError"}:
                return True
        child, parent = parent, parents.get(parent)
    return False


def imports(tree: ast.Module) -> list[tuple[int, str, bool]]:
    """(line, module, guarded) for every import statement at any depth, relative ones as ``.name``, and every
    ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = ["." * node.level + (node.module or "")]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and ((isinstance(node.func, ast.Name) and node.func.id == "__import__")
                   or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module"))):
            names = [node.args[0].value]
        else:
            continue
        found += [(node.lineno, name, guarded_by_import_error(node, parents)) for name in names]
    return found


@pytest.mark.parametrize("name", LESSONS)
def test_the_lesson_imports_only_the_standard_library_and_torch(name):
    """Or the library it teaches (``OWN_LIBRARIES``). Anything else only inside ``try: ... except ImportError``,
    whose fallback the copied run above exercises: its Python has none of those modules, nor _workbook.py. The files
    copied with it (``COPIED_WITH``: train_lm.py's lm_model.py) it imports plainly, and they import only the same."""
    allowed = set(sys.stdlib_module_names) | {"torch"} | OWN_LIBRARIES.get(name, set())
    for file in (f"{name}.py", *COPIED_WITH[name]):
        found = imports(ast.parse((LESSONS_DIR / file).read_text()))
        assert not [f"line {line}: {module}" for line, module, _ in found if module.startswith(".")], \
            "a relative import: a copied file is in no package"
        unguarded = [f"line {line}: {module}" for line, module, guarded in found
                     if module.split(".")[0] not in allowed | {Path(m).stem for m in COPIED_WITH[name]}
                     and not guarded]
        assert unguarded == [], f"{file} imports beyond the standard library, torch and its siblings: {unguarded}"


def test_the_import_check_sees_nested_and_guarded_imports():
    source = ("import os\ndef f():\n    import numpy\n"
              "try:\n    import _workbook\nexcept ImportError:\n    _workbook = None\n"
              "try:\n    from . import x\nexcept (OSError, ModuleNotFoundError):\n    pass\n"
              "try:\n    import pandas\nexcept Exception:\n    pass\nimportlib.import_module('yaml')\n")
    assert imports(ast.parse(source)) == [(1, "os", False), (3, "numpy", False), (5, "_workbook", True),
                                          (9, ".", True), (13, "pandas", False), (16, "yaml", False)]


def test_what_the_lessons_need_besides_torch_is_what_torch_and_transformers_need():
    """The lessons given numpy need it through torch itself (its object collectives); the day torch pickles without
    numpy, drop them from NUMPY_THROUGH_TORCH. Each says so in its docstring. safetensors comes with transformers."""
    import inspect

    import torch.distributed.distributed_c10d as c10d
    assert ".numpy()" in inspect.getsource(c10d._tensor_to_object), "torch's object collectives no longer need numpy"
    for name in NUMPY_THROUGH_TORCH:
        assert "numpy" in ast.get_docstring(ast.parse((LESSONS_DIR / f"{name}.py").read_text())), name
    assert "safetensors" in {Requirement(r).name for r in importlib.metadata.requires("transformers")}
