"""The observer's records read back (tutorial_lib.runs.observed), and the launch settings that turn it on.

Records here are written by the observer's own ``Recorder`` (tutorial_lib/child/observer.py, loaded by its path as the
rank runner loads it), so the reader is tested on the lines a rank writes; real ranks are in
tests/integration/test_observer.py.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import tutorial_lib as tl
from tutorial_lib.child import protocol
from tutorial_lib.errors import ConfigError, MetricsError
from tutorial_lib.launcher.plan import plan_launch
from tutorial_lib.runs import observed, rundir

CHILD = Path(tl.__file__).resolve().parent / "child"


def child_observer():
    """child/observer.py loaded by its path (its module name is the rank runner's: one copy per process)."""
    spec = importlib.util.spec_from_file_location("_tutorial_lib_child_observer", CHILD / "observer.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_rank(run_dir: Path, rank: int, records: list[tuple[str, dict]], restart: int = 0) -> Path:
    """Write ``records`` as rank ``rank``'s observer would: a start record first, then each ``(record, fields)``."""
    folder = rundir.observed_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    recorder = child_observer().Recorder(str(folder / rundir.observed_name(rank, restart)))
    recorder.write("start", schema=observed.SCHEMA, rank=rank, local_rank=rank, world_size=2, restart=restart)
    for record, fields in records:
        recorder.write(record, **fields)
    os.close(recorder.fd)
    return folder / rundir.observed_name(rank, restart)


def collective(kind: str, step: int, backward: int | None, nbytes: int = 64) -> tuple[str, dict]:
    return "collective", dict(op=kind, kind=kind, torch_op=f"c10d::{kind}", group="0", group_seq=0,
                              input_bytes=nbytes, output_bytes=nbytes, dtype="float32", shapes=[[nbytes // 4]],
                              reduce_op=None, step=step, backward=backward, thread="MainThread")


def tensor(values: list[float]) -> dict:
    data = base64.b64encode(struct.pack(f"<{len(values)}f", *values)).decode()  # a CPU tensor's bytes, little-endian
    return dict(shape=[len(values)], dtype="float32", numel=len(values), bytes=4 * len(values), sha1="0" * 40,
                norm=sum(v * v for v in values) ** 0.5, sum=sum(values), data=data)


# Two optimizer steps of two micro-batches each, the first under no_sync: one all-reduce in each step's second backward.
ACCUMULATED = [("group", dict(name="0", desc="default_pg", size=2, rank=0, ranks=[0, 1], backend="gloo")),
               ("backward", dict(index=1, step=1, loss=0.5, tensors=1, shape=[], dtype="float32")),
               ("backward", dict(index=2, step=1, loss=0.25, tensors=1, shape=[], dtype="float32")),
               collective("all_reduce", 1, 2),
               ("optimizer_step", dict(step=1, optimizer="SGD", optimizer_id=1, lr=[0.1], state_bytes=0, params=[
                   dict(index=0, param_group=0, name="weight", grad=tensor([0.5, -1.0]), value=tensor([1.0, 2.0]))])),
               ("backward", dict(index=3, step=2, loss=0.125, tensors=1, shape=[], dtype="float32")),
               ("backward", dict(index=4, step=2, loss=None, tensors=1, shape=[3], dtype="float32")),
               collective("all_reduce", 2, 4),
               ("optimizer_step", dict(step=2, optimizer="SGD", optimizer_id=1, lr=[0.1], state_bytes=0, params=[])),
               collective("barrier", 3, None, 0),
               ("end", dict(exit_code=0, initial_seed=0))]


def test_counts_per_step_and_per_backward_come_from_the_records(tmp_path):
    for rank in (0, 1):
        write_rank(tmp_path, rank, ACCUMULATED)
    run = tl.runs.read_observed(tmp_path, ranks=2)
    rank0 = run[0]
    assert rank0.per_step("all_reduce") == [1, 1] and rank0.per_backward("all_reduce") == [0, 1, 0, 1]
    assert rank0.losses() == [0.5, 0.25, 0.125, None] and rank0.complete and rank0.exit_code == 0
    assert [c.group_size for c in rank0.collectives] == [2, 2, 2]
    assert rank0.collectives_of("barrier", step=3)[0].input_bytes == 0
    grad = rank0.steps[0].param("weight").grad.tensor()
    assert grad.tolist() == [0.5, -1.0] and str(grad.dtype) == "torch.float32"
    assert run.gathered(1, 0, "value").tolist() == [1.0, 2.0]  # replicated: rank 0's


def test_the_per_step_table_has_a_row_per_rank_and_step_with_each_kinds_count(tmp_path):
    write_rank(tmp_path, 0, ACCUMULATED)
    write_rank(tmp_path, 1, ACCUMULATED[:4] + [collective("all_reduce", 1, 2)] + ACCUMULATED[4:])  # one more in step 1
    rows = tl.runs.read_observed(tmp_path, ranks=2).per_step_counts("all_reduce", "barrier")
    assert rows == [{"rank": rank, "step": step, "all_reduce": n, "barrier": 0}
                    for rank, step, n in [(0, 1, 1), (0, 2, 1), (1, 1, 2), (1, 2, 1)]]  # the barrier: after step 2


def test_a_rank_killed_mid_write_leaves_every_earlier_record_readable(tmp_path):
    path = write_rank(tmp_path, 0, ACCUMULATED[:4])
    with open(path, "a") as f:  # what a kill in the middle of a write leaves: a line without its end
        f.write('{"seq": 5, "record": "optimizer_st')
    rank0 = tl.runs.read_observed(tmp_path)[0]
    assert len(rank0.backwards) == 2 and len(rank0.collectives) == 1 and rank0.steps == []
    assert not rank0.complete and rank0.exit_code is None


def test_the_steps_recorded_so_far_are_counted_without_reading_the_record(tmp_path):
    """What a check polls while the ranks run (15.1's replica groups): the optimizer steps in the observer's own lines,
    a line cut by a kill not counted, 0 before the rank wrote anything."""
    assert observed.observed_steps(tmp_path) == 0
    path = write_rank(tmp_path, 0, ACCUMULATED[:5])
    assert observed.observed_steps(tmp_path) == 1 == len(tl.runs.read_observed(tmp_path)[0].steps)
    with open(path, "a") as f:
        f.write('{"seq": 6, "record": "optimizer_step", "step": 2')
    assert observed.observed_steps(tmp_path) == 1 and observed.observed_steps(tmp_path, rank=1) == 0
    write_rank(tmp_path / "b", 0, ACCUMULATED)
    assert observed.observed_steps(tmp_path / "b") == 2 == len(tl.runs.read_observed(tmp_path / "b")[0].steps)


@pytest.mark.parametrize("change, says", [
    (lambda lines: lines[:2] + lines[3:], "out of the observer's sequence"),  # a line taken out
    (lambda lines: lines + [json.dumps({"seq": len(lines) + 1, "record": "backward"})], "after the end record"),
    (lambda lines: lines[:1] + [lines[0].replace('"seq": 1', '"seq": 2')] + lines[2:], "sequence"),  # a second start
    (lambda lines: ["not json"] + lines[1:], "not JSON"),
])
def test_a_record_changed_after_it_was_written_is_refused(tmp_path, change, says):
    path = write_rank(tmp_path, 0, ACCUMULATED)
    lines = path.read_text().splitlines()
    path.chmod(0o644)
    path.write_text("\n".join(change(lines)) + "\n")
    with pytest.raises(MetricsError, match=says):
        tl.runs.read_observed(tmp_path)


def test_a_record_of_another_schema_or_rank_is_refused(tmp_path):
    path = write_rank(tmp_path, 0, [])
    path.chmod(0o644)
    path.write_text(path.read_text().replace('"rank": 0', '"rank": 1'))
    with pytest.raises(MetricsError, match="the file is rank 0's"):
        tl.runs.read_observed(tmp_path)
    path.write_text(path.read_text().replace(f'"schema": {observed.SCHEMA}', '"schema": 99'))
    with pytest.raises(MetricsError, match=f"reads schema {observed.SCHEMA}"):
        tl.runs.read_observed(tmp_path)


def test_an_unobserved_run_says_how_to_observe_and_a_missing_rank_is_named(tmp_path):
    with pytest.raises(MetricsError, match="launch with observe=True"):
        tl.runs.read_observed(tmp_path)
    write_rank(tmp_path, 0, [])
    with pytest.raises(MetricsError, match="no rank1.jsonl"):
        tl.runs.read_observed(tmp_path, ranks=2)


def test_the_last_attempt_is_read_unless_another_is_asked_for(tmp_path):
    write_rank(tmp_path, 0, [("seed", dict(seed=1, function="torch.manual_seed", step=1))])
    write_rank(tmp_path, 0, [("seed", dict(seed=2, function="torch.manual_seed", step=1))], restart=1)
    assert tl.runs.read_observed(tmp_path)[0].seeds == [2]
    assert tl.runs.read_observed(tmp_path, restart=0)[0].seeds == [1]


def test_the_record_is_created_read_only_and_never_overwritten(tmp_path):
    path = write_rank(tmp_path, 0, [])
    assert path.stat().st_mode & 0o777 == 0o444
    with pytest.raises(FileExistsError):
        child_observer().Recorder(str(path))


def test_the_observer_and_the_reader_agree_on_names_and_schema():
    child = child_observer()
    assert child.SCHEMA == observed.SCHEMA
    assert [child.record_name(r, k) for r in (0, 3) for k in (0, 2)] == \
        [rundir.observed_name(r, k) for r in (0, 3) for k in (0, 2)]
    assert child.records.WRAPPER_CLASSES  # its sibling (observer_torch.py) loaded by its path too


def test_where_the_script_called_is_recorded_and_read_as_call_sites(tmp_path):
    """The observer keeps the script's own frames (here this test's), not the installed packages' (pytest's) nor a
    library folder's (a stand-in for torch's); the reader makes them ``CallSite`` values, and an older record without
    them reads as ``()``."""
    sites = child_observer().records.CallSites(SimpleNamespace(__file__=str(tmp_path / "torch" / "__init__.py")))

    def the_scripts_own():
        return sites.stack(sys._getframe())

    stack = the_scripts_own()
    here = Path(__file__).resolve()
    assert [(Path(p).resolve(), f) for p, _, f in stack] == [(here, "test_where_the_script_called_is_recorded_and_read_"
                                                                    "as_call_sites"), (here, "the_scripts_own")], stack
    step = ("optimizer_step", dict(step=1, optimizer="SGD", optimizer_id=1, lr=[0.1], state_bytes=0, params=[]))
    write_rank(tmp_path, 0, [(kind, {**fields, "stack": stack}) for kind, fields in (collective("barrier", 1, None, 0),
                                                                                      step)])
    write_rank(tmp_path, 1, [collective("barrier", 1, None, 0), step])
    run = tl.runs.read_observed(tmp_path, ranks=2)
    site = run[0].collectives[0].stack[-1]
    assert isinstance(site, observed.CallSite) and site.function == "the_scripts_own" and site.line == stack[-1][1]
    assert site.where == f"test_observed.py:{stack[-1][1]}" and run[0].steps[0].stack == run[0].collectives[0].stack
    assert run[0].steps[0].seq == 3 and run[1].collectives[0].stack == () and run[1].steps[0].stack == ()


def test_observe_turns_the_ranks_observer_on_and_off_in_the_plan(tmp_path, monkeypatch):
    monkeypatch.setenv(protocol.OBSERVE_ENV, "/elsewhere")  # a kernel's own variable never turns it on
    script = tl.write_script("ddp_train", tl.new_run_dir("observe", tmp_path))
    on = plan_launch(tl.LaunchSpec(script, device="cpu", nproc_per_node=2, observe=True))
    off = plan_launch(tl.LaunchSpec(script, device="cpu", nproc_per_node=2))
    assert on.job_env[protocol.OBSERVE_ENV] == str(on.run_dir / "observed")
    assert protocol.OBSERVE_ENV not in off.job_env
    assert f"{protocol.OBSERVE_ENV}={on.run_dir / 'observed'}" in on.command_txt(on.commands(29500))


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_observe_must_be_true_or_false(tmp_path, value):
    script = tl.write_script("ddp_train", tl.new_run_dir("observe", tmp_path))
    with pytest.raises(ConfigError, match=f"observe must be True .* or False, got {value!r}"):
        tl.LaunchSpec(script, device="cpu", observe=value).validate(gpu_count=0)


def test_observe_is_refused_on_slurm(tmp_path):
    script = tl.write_script("ddp_train", tl.new_run_dir("observe", tmp_path))
    with pytest.raises(ConfigError, match="observe=True is for launches on this machine"):
        tl.LaunchSpec(script, observe=True, slurm=tl.slurm.SlurmSpec(conf=None)).validate(gpu_count=0)
