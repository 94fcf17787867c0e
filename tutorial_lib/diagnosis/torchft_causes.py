"""torchft's failures, as the doctor knows them: the lines torchft 0.2.0 prints in a replica group's rank logs when its
lighthouse cannot be reached, when no quorum forms in time, and when a live recovery (a heal) fails, each with its
cause and fix.

Captured from real runs of ``tutorial_lib/lessons/ft_train.py`` under ``launcher/replicas.py`` (torch 2.13, torchft
0.2.0; ``tests/fixtures/run_dirs/torchft/``):

* lighthouse unreachable: at start the ``Manager`` raises ``RuntimeError: failed to connect to http://HOST:PORT within
  timeout of 60s; ...`` (its ``connect_timeout``: ``TORCHFT_CONNECT_TIMEOUT_SEC`` does not shorten it); a lighthouse
  that dies mid-run leaves ``Failed to send heartbeat to lighthouse: ... tcp connect error`` lines, then the quorum
  times out (``TimeoutError: ... "Timeout expired"``), so this cause is tried before the quorum timeout;
* quorum timeout: ``[Replica ft_train_0] lighthouse quorum failed. error: status: Cancelled, message: "Timeout
  expired"`` after ``quorum_timeout`` (``TORCHFT_QUORUM_TIMEOUT_SEC``, 60 s by default) while the lighthouse logs
  ``Quorum status: New quorum not ready, only have 1 participants, need min_replicas 2``;
* recovery without numpy: the healing group logs ``got exception in recovery: Numpy is not available`` (``PGTransport.
  recv_checkpoint`` unpickles its metadata through ``Tensor.numpy()``; torchft does not declare numpy), then fails in
  its next all-reduce (``AssertionError`` in ``torchft/ddp.py``'s ``_comm_hook``); so does the healthy group that was
  sending it the state, which logs ``got exception in recovery: ... Connection closed by peer``: the failed heal.
  (Captured while ``ft_train.py`` used ``torchft.DistributedDataParallel``, whose comm hook asserts on a failed
  all-reduce; it now calls ``manager.allreduce`` itself, and a failed heal drops the step and trains on.)

Data only (``causes.CAUSES`` builds its ``Cause`` entries from ``TORCHFT_CAUSES``, first, since these lines are
torchft's own and the generic causes, "collective timeout" among them, would otherwise claim them).
"""

from __future__ import annotations

import re

from ..i18n import N_
from .cause_ids import CauseId

LIGHTHOUSE_CONNECT = re.compile(r"failed to connect to (?P<address>\S+) within timeout of (?P<timeout>\w+)")
LIGHTHOUSE_HEARTBEAT = re.compile(r"Failed to send heartbeat to lighthouse: .*message: \"(?P<why>[^\"]*)\"")
LIGHTHOUSE_CLIENT = re.compile(r"Creating LighthouseClient")  # the Manager connecting to its lighthouse
# torchft's Rust client words it two ways ("... failed. error: status: Cancelled, message: \"Timeout expired\"", or
# "... failed after ..."; both strings are in _torchft.so), and a deadline may expire instead of the timeout.
QUORUM_TIMEOUT = re.compile(r"lighthouse quorum failed(\. error: .*(Timeout expired|DeadlineExceeded|deadline has "
                            r"elapsed)| after )")
RECOVERY_FAILED = re.compile(r"got exception in recovery: (?P<why>.*)")
RECOVERY_NO_NUMPY = re.compile(r"got exception in recovery: Numpy is not available")
# Where a heal stood when it failed: the group's own step (torchft's log prefix) and the step it had to reach, or the
# replica ranks it was sending its state to.
HEALING = re.compile(r"- step (?P<step>\d+)\] healing required, .*max_step=(?P<max_step>\d+)")
SENDING = re.compile(r"- step (?P<step>\d+)\] peers need recovery from us \[(?P<ranks>[\d, ]*)\]")
# torchft's Python log prefix, "[<replica id>/<group rank> - step <N>]": the group's step when it logged the line.
LOGGED_STEP = re.compile(r"\[[^\]\s]+/\d+ - step (?P<step>\d+)\]")
# The lighthouse's own line (its log, not a group's): who it waits for when it forms no quorum.
QUORUM_STATUS = re.compile(r"Quorum status: New quorum not ready, only have (?P<have>\d+) participants, need "
                           r"min_replicas (?P<need>\d+)")


def describe_lighthouse(line: str) -> str:
    """``"http://127.0.0.1:34789 refused the connection for 60s"`` from the Manager's failed connect, ``"heartbeats to
    the lighthouse failed: tcp connect error"`` from a heartbeat line; the line itself otherwise."""
    m = LIGHTHOUSE_CONNECT.search(line)
    if m:
        why = "refused the connection" if "Connection refused" in line else "did not answer"
        return f"the lighthouse at {m['address']} {why} for {m['timeout']}"
    m = LIGHTHOUSE_HEARTBEAT.search(line)
    return f"heartbeats to the lighthouse failed: {m['why']}" if m else line


def describe_quorum(line: str) -> str:
    """``"no quorum for ft_train_0 within its quorum timeout"`` from torchft's ``lighthouse quorum failed`` line."""
    m = re.search(r"\[Replica (?P<replica>[^\]]+)\] lighthouse quorum failed", line)
    return f"no quorum for {m['replica']} within its quorum timeout" if m else line


def describe_recovery(line: str) -> str:
    """``"Numpy is not available"`` (why the heal failed) from torchft's ``got exception in recovery: ...`` line."""
    m = RECOVERY_FAILED.search(line)
    return m["why"].strip() if m else line


# Keyword arguments of causes.Cause, in priority order.
TORCHFT_CAUSES = (
    dict(id=CauseId.TORCHFT_LIGHTHOUSE_UNREACHABLE, name=N_("torchft lighthouse unreachable"),
         pattern=re.compile(f"{LIGHTHOUSE_CONNECT.pattern}|{LIGHTHOUSE_HEARTBEAT.pattern}"), requires=LIGHTHOUSE_CLIENT,
         fix=N_("the replica group could not reach torchft's lighthouse at the address TORCHFT_LIGHTHOUSE gives it: a "
                "wrong host or port, or a lighthouse that was never started, was stopped or died. Start the lighthouse "
                "before the groups and give every group its address (start_lighthouse(...).address; "
                "torchft_lighthouse --bind 127.0.0.1:29510 by hand), and keep it running for as long as they train: "
                "without it no quorum forms and every group stops within the quorum timeout"),
         describe=describe_lighthouse),
    dict(id=CauseId.TORCHFT_QUORUM_TIMEOUT, name=N_("torchft quorum timeout"), pattern=QUORUM_TIMEOUT,
         describe=describe_quorum,
         fix=N_("the lighthouse formed no quorum within the Manager's quorum_timeout: fewer replica groups asked to "
                "join than it needs (the lighthouse's min_replicas, --min_replicas, or the Manager's "
                "min_replica_size), or they were too slow to start. Start the missing groups, lower min_replicas to "
                "the groups you run, or give slow starts more time (Manager(quorum_timeout=...) or "
                "TORCHFT_QUORUM_TIMEOUT_SEC, seconds); the lighthouse's log says how many it had and needed")),
    dict(id=CauseId.TORCHFT_RECOVERY_WITHOUT_NUMPY, name=N_("torchft recovery without numpy"),
         pattern=RECOVERY_NO_NUMPY,
         fix=N_("the group that rejoined could not heal: torchft's PGTransport reads the state it receives through "
                "Tensor.numpy(), and numpy is not installed where the group runs (torchft does not declare it, so pip "
                "does not bring it). Install numpy in every replica group's environment (pip install numpy) and "
                "restart the groups: the failed heal also stopped the healthy group that was sending the state"),
         describe=describe_recovery),
    dict(id=CauseId.TORCHFT_RECOVERY_FAILED, name=N_("torchft recovery failed"), pattern=RECOVERY_FAILED,
         fix=N_("a live recovery (a group behind the others receiving their state from a live group) failed. torchft "
                "drops that step and forms a new quorum: if a live group still holds the state, the group heals from it "
                "at the next step; if none does (the group sending it died), the group trains on from its own step 0 "
                "without an error, and what the job had learnt is lost: stop it and resume from your latest "
                "checkpoint. (With torchft 0.2.0's DistributedDataParallel, the next all-reduce of both sides fails "
                "instead: AssertionError in torchft/ddp.py.) Read the log of the other group in the heal, the one that "
                "rejoined or the one that sent the state, for the first error (no numpy, killed mid-heal, a timeout) "
                "and fix that"),
         describe=describe_recovery),
)
