"""Ranks that waited in a collective for a rank that was elsewhere: which rank, and why, from where each rank was.

Two causes the doctor finds this way (``waiting_cause``), after torch reported a collective timeout or a rank that
finished while others waited: a rank still inside torch.compile (its stack), and a collective that only
some ranks call (the observer's records when the launch was observed, else its source).

Every collective is a rendezvous of all ranks. A script that calls one inside a branch on the rank (``if rank == 0:
dist.all_reduce(loss)``) leaves the other ranks elsewhere: in their next collective (which then pairs with the wrong
one, or waits in vain), or finished. Torch reports this as a timeout on whichever rank gives up first, so the rank
the error names is chance (three runs of the same script: rank 1, rank 1, rank 0). What does not change from run to
run is where each rank was: a rank whose innermost line of its own code is a call inside a branch on the rank, while
another rank was in a different collective or had finished. When the launch was observed (``observe=True``), the
ranks' records say it whatever the branch looks like (``collectives.extra_collective``: the collective one rank
issued that the others had moved past, with its op and the line that called it); otherwise this module finds the
rank from the ranks' tracebacks and stacks, reading the script's source with ``ast`` (a branch whose test names the
rank).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path

from ..i18n import N_, Message
from ..errors import MetricsError
from ..runs.observed import read_observed
from ..runs.rundir import LOGS, node_log_dirs, observed_dir
from ..torchrun.formats import ANY_FRAME, FAULTHANDLER_FRAME
from ..torchrun.root_cause import FINISHED
from ..torchrun.stacks import compiling_ranks, stopped_ranks_stacks
from .cause_ids import CauseId
from .collectives import extra_collective

# Frames that are not the learner's code: libraries, the workbook's rank runner, runpy.
_NOT_OWN = re.compile(r"/(site-packages|dist-packages|lib/python\d[\d.]*)/|/tutorial_lib/child/|<frozen |/runpy\.py$")
# A rank waiting in a collective: torch.distributed's or DDP's frames, or the message a timed-out collective raises.
_IN_COLLECTIVE = re.compile(r"torch/distributed/|torch/nn/parallel/distributed\.py|Timed out waiting|"
                            r"Connection closed by peer|Connection reset by peer|Watchdog caught collective")
_RANK_NAME = re.compile(r"rank", re.IGNORECASE)

# A collective timed out while a peer's main thread was inside torch.compile (dynamo or inductor frames in the stack it
# printed when torchrun stopped it): a rank that recompiles alone (a shape, a Python value or a branch of its own) makes
# the others wait, and a compile on a CPU or of a large graph takes longer than a short collective timeout. Run on
# torch 2.8 and 2.13: tests/fixtures/compile_recompiling_rank.py.
COMPILING_CAUSE = N_("collective timeout while rank {ranks} compiled")
COMPILING_FIX = (N_("rank {ranks} was still compiling (torch.compile: dynamo or inductor in its stack) when the others "
                    "timed out waiting for it in a collective: a rank recompiles alone when a shape, a Python value or a "
                    "branch differs on it (TORCH_LOGS=recompiles on that rank names the guard). Keep shapes and branches "
                    "the same on every rank (pad to fixed lengths), mark a varying dimension dynamic "
                    "(torch._dynamo.mark_dynamic), or give init_process_group(timeout=...) room for a compile (14, "
                    "section 7 'A rank that recompiles alone')"))
# A rank that waited in a call inside `if rank == 0:` while another was in a different collective or had finished.
RANK_BRANCH_CAUSE = N_("collective only rank {rank} calls")
RANK_BRANCH_FIX = N_("rank {rank} called {call} at {where}, inside '{condition}': the other ranks never call it, so "
                     "it paired with a different collective or waited for ranks that had moved on. Call every "
                     "collective on every rank, outside branches on the rank, and keep only what differs (the "
                     "print, the file write) inside them (07, exercise 3)")
# The same, read from the observer's records (an observed launch), where no branch on the rank is in sight.
RECORDED_FIX = N_("rank {rank} issued {op} at {where} (collective {index} of process group {group}, step {step}), and "
                  "the other ranks had moved past that point without issuing it: it paired with a different collective "
                  "or waited for ranks that had moved on. Call every collective on every rank in the same order, "
                  "outside branches and functions only some ranks run, and keep only what differs (the print, the "
                  "file write) inside them (07, exercise 3)")


@dataclass(frozen=True)
class RankBranchCall:
    """The rank that waited in a call only ranks like it make.

    Attributes:
        rank: the rank (global).
        call: the call on that line, as written (``"dist.all_reduce(global_loss)"``); op: the function it calls
            (``"all_reduce"``).
        where: ``"train.py:22"``.
        condition: the branch it is in, as written (``"if rank == 0"``, or ``"else of: if rank == 0"``).
    """

    rank: int
    call: str
    where: str
    condition: str
    op: str = ""


def own_frames(text: str) -> list[tuple[str, int]]:
    """``[(path, line)]`` of the learner's own frames in a traceback (most recent call last) or a faulthandler dump
    (most recent call first: returned reversed, so both read outermost first). Library and runner frames are left
    out."""
    traceback = [(m["path"], int(m["line"])) for m in map(ANY_FRAME.search, text.splitlines()) if m and ", line" in m[0]]
    if traceback:
        return [f for f in traceback if not _NOT_OWN.search(f[0])]
    dump = []
    for line in text.splitlines():
        m = FAULTHANDLER_FRAME.match(line)
        if m:
            dump.append((m["path"], int(m["line"])))
        elif dump:
            break  # the main thread's frames end at the next thread
    return [f for f in reversed(dump) if not _NOT_OWN.search(f[0])]


def rank_condition(path: str, line: int) -> tuple[str, str] | None:
    """``(call, condition)`` when ``path``'s line ``line`` is a call inside an ``if`` whose test names the rank
    (``rank``, ``local_rank``, ``dist.get_rank()``, ``RANK``), else ``None`` (also when the file cannot be read or
    parsed)."""
    try:
        tree = ast.parse(Path(path).read_text(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return None
    found = None

    def visit(node, branches):
        nonlocal found
        for child in ast.iter_child_nodes(node):
            if not (getattr(child, "lineno", line) <= line <= (getattr(child, "end_lineno", None) or line)):
                continue
            if isinstance(child, ast.Call) and found is None and branches:
                found = (ast.unparse(child), branches[-1])
                return
            inner = branches
            if isinstance(child, ast.If) and _names_rank(child.test):
                test = f"if {ast.unparse(child.test)}"
                in_else = any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in child.orelse)
                inner = [*branches, f"else of: {test}" if in_else else test]
            visit(child, inner)

    visit(tree, [])
    return found


def _names_rank(test: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) and _RANK_NAME.search(n.id) or isinstance(n, ast.Attribute) and
               _RANK_NAME.search(n.attr) or isinstance(n, ast.Constant) and n.value == "RANK" for n in ast.walk(test))


def rank_branch_call(texts: dict[int, str], finished: set[int]) -> RankBranchCall | None:
    """The rank that waited in a call inside a branch on the rank while another rank was in a different collective
    or had finished; ``None`` if no rank did.

    Args:
        texts: ``{rank: its traceback or faulthandler stack}`` (any rank may be missing).
        finished: ranks that returned (exit code 0) while others waited.
    """
    places = {rank: own_frames(text)[-1:] for rank, text in texts.items()}
    for rank in sorted(texts):
        if not places[rank] or not _IN_COLLECTIVE.search(texts[rank]):
            continue
        path, line = places[rank][0]
        branch = rank_condition(path, line)
        others = [r for r in texts if r != rank and places[r] != places[rank] and _IN_COLLECTIVE.search(texts[r])]
        if branch is not None and (others or finished - {rank}):
            return RankBranchCall(rank=rank, call=branch[0], where=f"{Path(path).name}:{line}", condition=branch[1],
                                  op=_called(branch[0]))
    return None


def _called(call: str) -> str:
    """The name of the function ``call`` (a call as written) calls: ``"all_reduce"`` of ``"dist.all_reduce(x)"``."""
    func = ast.parse(call, mode="eval").body.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")


def first_divergence(observed) -> str:
    """Where the ranks' collective records first differ, group by group (an ``ObservedRun``): ``"collective 5 of
    group 0: rank 0 all_reduce (4 bytes, step 2, outside backward), rank 1 broadcast (20 bytes, step 2, outside
    backward)"``, or ``""`` when they agree as far as each went."""
    ranks = sorted(observed.ranks)
    groups = sorted({c.group for r in ranks for c in observed[r].collectives})
    for group in groups:
        sequences = {r: [c for c in observed[r].collectives if c.group == group] for r in ranks}
        for i in range(min((len(s) for s in sequences.values()), default=0)):
            seen = {r: s[i] for r, s in sequences.items()}
            if len({(c.op, c.input_bytes, c.dtype) for c in seen.values()}) > 1:
                parts = [f"rank {r} {c.op} ({c.input_bytes} bytes, step {c.step}, "
                         + (f"backward {c.backward})" if c.backward else "outside backward)") for r, c in seen.items()]
                return f"collective {i + 1} of group {group}: " + ", ".join(parts)
        counts = {r: len(s) for r, s in sequences.items()}
        if len(set(counts.values())) > 1:
            most = max(counts, key=counts.get)
            extra = sequences[most][min(counts.values())]
            return (f"group {group}: " + ", ".join(f"rank {r} issued {n}" for r, n in counts.items())
                    + f"; rank {most}'s collective {min(counts.values()) + 1} was {extra.op} ({extra.input_bytes} bytes, "
                    f"step {extra.step})")
    return ""


def waiting_cause(diagnosis, failure, ranked) -> None:
    """Ranks waited in a collective (timed out, or a rank finished first): name the rank elsewhere when its stack or
    traceback says more. A rank inside torch.compile (dynamo's or inductor's frames in its main thread's stack, printed
    when torchrun stopped it) on a collective timeout; else the rank that issued a collective the others had moved
    past, from the observer's records when the launch was observed (``collectives.extra_collective``), or from its
    stack: a call inside ``if rank == 0:`` while another was in a different collective or finished
    (``rank_branch_call``). Either way ``cause_fields`` are ``rank``, ``op`` and ``where``.

    Args:
        diagnosis: the doctor's ``Diagnosis`` so far (its cause a collective timeout or a finished rank).
        failure: the ``RankFailure`` (how every rank ended).
        ranked: ``[(rank, line)]`` of the output (the stacks torchrun's SIGTERM made faulthandler print)."""
    themselves = [e.rank for e in failure.ends if e.rank is not None and e.rank not in failure.stopped]
    stacks = stopped_ranks_stacks(ranked, diagnosis.run_dir / LOGS, failed_rank=failure.rank,
                                  one_node=not node_log_dirs(diagnosis.run_dir), failed_themselves=themselves)
    compiling = compiling_ranks(stacks) if diagnosis.cause_id == CauseId.COLLECTIVE_TIMEOUT else []
    if compiling:
        named = ", ".join(map(str, compiling))
        diagnosis.cause_id, diagnosis.cause_fields = CauseId.COMPILING_RANK, {"ranks": named}
        diagnosis.fix_text = Message(COMPILING_FIX, {"ranks": named})
        return
    texts = {**stacks, **{e.rank: e.traceback for e in failure.ends if e.rank is not None and e.traceback}}
    finished = {e.rank for e in failure.ends if e.how == FINISHED and e.rank is not None}
    observed = _records(diagnosis.run_dir)
    extra = extra_collective(observed, finished) if observed is not None else None
    found = rank_branch_call(texts, finished)
    if extra is not None:  # the records name the rank and the collective, whatever the branch looks like
        rank = extra.ranks[0] if len(extra.ranks) == 1 else ", ".join(map(str, extra.ranks))
        diagnosis.cause_id = CauseId.RANK_BRANCH_COLLECTIVE
        diagnosis.cause_fields = {"rank": rank, "op": extra.op, "where": extra.where}
        if found is not None and found.rank in extra.ranks and found.where == extra.where:
            diagnosis.fix_text = Message(RANK_BRANCH_FIX, dataclasses.asdict(found))
        else:
            diagnosis.fix_text = Message(RECORDED_FIX, {"rank": rank, "op": extra.op, "where": extra.where,
                                                        "index": extra.index, "group": extra.group, "step": extra.step})
        diagnosis.evidence = first_divergence(observed) or f"{extra.where}: {extra.op}"
    elif found is not None:
        diagnosis.cause_id = CauseId.RANK_BRANCH_COLLECTIVE
        diagnosis.cause_fields = {"rank": found.rank, "op": found.op, "where": found.where}
        diagnosis.fix_text = Message(RANK_BRANCH_FIX, dataclasses.asdict(found))
        diagnosis.evidence = (observed and first_divergence(observed)) or f"{found.where}: {found.call}"


def _records(run_dir: Path):
    """The launch's observer records (``read_observed``), or ``None``: not observed, or a record unreadable."""
    if not observed_dir(run_dir).is_dir():
        return None
    try:
        return read_observed(run_dir)
    except MetricsError:
        return None
