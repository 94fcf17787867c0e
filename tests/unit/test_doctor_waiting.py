"""``diagnosis.waiting``: the rank that waited in a collective only ranks like it call, from the ranks' tracebacks and
stacks and the script's source; and where the observed ranks' collectives first differ."""

from __future__ import annotations

from types import SimpleNamespace

from tutorial_lib.diagnosis.waiting import first_divergence, own_frames, rank_branch_call, rank_condition

SCRIPT = '''import os, time
import torch.distributed as dist
rank = dist.get_rank()
if rank == 0:
    dist.barrier()
    dist.all_reduce(x)
else:
    while not os.path.exists("f"): time.sleep(0.05)
    dist.barrier()
dist.all_reduce(y)
'''


def traceback(path, line, *, collective=True):
    lib = '  File "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 4000, in barrier\n'
    return (f'Traceback (most recent call last):\n  File "{path}", line {line}, in <module>\n    x\n'
            + (lib + "RuntimeError: Timed out waiting 3000ms for recv operation to complete\n" if collective else ""))


def dump(path, line, function="<module>"):
    return f'Current thread 0x00007f (most recent call first):\n  File "{path}", line {line} in {function}\n'


def test_a_call_inside_a_branch_on_the_rank_is_found_with_its_condition(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    assert rank_condition(str(script), 5) == ("dist.barrier()", "if rank == 0")
    assert rank_condition(str(script), 9) == ("dist.barrier()", "else of: if rank == 0")
    assert rank_condition(str(script), 10) is None  # every rank calls it
    assert rank_condition(str(tmp_path / "missing.py"), 5) is None


def test_own_frames_leave_out_libraries_and_read_dumps_innermost_last(tmp_path):
    path = str(tmp_path / "train.py")
    assert own_frames(traceback(path, 6)) == [(path, 6)]
    assert own_frames(dump(path, 8) + '  File "/usr/lib/python3.11/runpy.py", line 88 in _run_code\n') == [(path, 8)]


def test_the_rank_in_a_branch_is_named_only_when_another_rank_is_in_a_different_collective_or_finished(tmp_path):
    path = str(tmp_path / "train.py")
    (tmp_path / "train.py").write_text(SCRIPT)
    found = rank_branch_call({0: traceback(path, 6), 1: traceback(path, 10)}, set())
    assert (found.rank, found.call, found.where, found.condition) == (0, "dist.all_reduce(x)", "train.py:6", "if rank == 0")
    found = rank_branch_call({0: traceback(path, 5)}, {1})
    assert (found.rank, found.where) == (0, "train.py:5")
    # Controls: rank 1 polls a file (not in a collective: notebook 07's exercise 1, where the rank elsewhere is the
    # culprit); both ranks at the same line; a collective every rank calls.
    assert rank_branch_call({0: traceback(path, 5), 1: dump(path, 8)}, set()) is None
    assert rank_branch_call({0: traceback(path, 6), 1: traceback(path, 6)}, set()) is None
    assert rank_branch_call({0: traceback(path, 10), 1: traceback(path, 6, collective=False)}, set()) is None


def collective(op, nbytes, step=1, backward=None, group="0"):
    return SimpleNamespace(op=op, input_bytes=nbytes, dtype="float32", step=step, backward=backward, group=group)


def observed(**ranks):
    run = {int(r.removeprefix("r")): SimpleNamespace(collectives=c) for r, c in ranks.items()}
    return _Run(run)


class _Run:
    def __init__(self, ranks):
        self.ranks = ranks

    def __getitem__(self, rank):
        return self.ranks[rank]


def test_the_first_collective_the_ranks_disagree_on_is_named():
    same = [collective("broadcast", 96), collective("all_reduce", 1284, backward=1)]
    run = observed(r0=[*same, collective("all_reduce", 4, step=2)], r1=[*same, collective("broadcast", 20, step=2)])
    assert first_divergence(run) == ("collective 3 of group 0: rank 0 all_reduce (4 bytes, step 2, outside backward), "
                                     "rank 1 broadcast (20 bytes, step 2, outside backward)")
    run = observed(r0=[*same, collective("barrier", 0, step=2)], r1=same)
    assert first_divergence(run) == ("group 0: rank 0 issued 3, rank 1 issued 2; rank 0's collective 3 was barrier "
                                     "(0 bytes, step 2)")
    assert first_divergence(observed(r0=same, r1=same)) == ""
