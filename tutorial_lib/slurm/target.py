"""Where a launch on SLURM goes: the options of a job (``SlurmSpec``, a ``LaunchSpec``'s ``slurm=`` field) and the
cluster a notebook uses (``connect_slurm``: the one ``SLURM_CONF`` or the system's configuration points at, else the
local two-node cluster, started here if it is not up and stopped by ``close`` only if it was started here).

``tl.launch(tl.LaunchSpec(script, nnodes=2, slurm=tl.slurm.SlurmSpec(partition="gpu", account="proj1")))`` submits the
job with ``sbatch`` through the batch script ``tl.slurm.slurm_script`` writes (``tutorial_lib.launcher.slurm_job``).
"""

from __future__ import annotations

import atexit
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from ..errors import ConfigError, SlurmError, SlurmUnavailable
from ..i18n import N_, Message
from ..notebook.parameters import check_positive_int
from .batch import this_torchrun
from .commands import NeverStarts, node_states
from .local_cluster import LocalCluster

# What each NeverStarts reason means, a gettext message (tutorial_lib.i18n) for the launcher's error.
# PartitionConfig's "what to change" is worked out from the request and the nodes (what_to_change).
CANNOT_START = {
    NeverStarts.PARTITION_CONFIG: N_("no node of its partition has what it asks for per node (CPUs, memory, GPUs)"),
    NeverStarts.PARTITION_NODE_LIMIT: N_("it asks for more nodes than its partition has (or some of them are down or "
                                         "drained)"),
    NeverStarts.PARTITION_TIME_LIMIT: N_("its time limit is above the partition's maximum (a smaller time_limit, or "
                                         "another partition)"),
    NeverStarts.INVALID_ACCOUNT: N_("the account is not valid for this user (sacctmgr show assoc user=$USER)"),
    NeverStarts.INVALID_QOS: N_("the QOS is not valid for this user or account"),
    NeverStarts.BAD_CONSTRAINTS: N_("no node has the features (--constraint) it asks for"),
    NeverStarts.DEPENDENCY_NEVER_SATISFIED: N_("a job it depends on (--dependency) ended so that the dependency can "
                                               "never hold"),
}


@dataclass(frozen=True)
class Request:
    """What a job asked of the cluster and what the cluster has, for ``what_to_change`` (the launcher fills it when
    it cancels a job that cannot start).

    Attributes:
        nnodes: nodes asked for (``LaunchSpec.nnodes``).
        cpus_per_task: CPUs per node asked for (``SlurmSpec.cpus_per_task``; ``None``: the cluster's default).
        node_cpus: ``{node name: CPUs}`` of the partition's nodes (``sinfo``); empty if unknown.
    """

    nnodes: int
    cpus_per_task: int | None = None
    node_cpus: dict[str, int] = field(default_factory=dict)


def what_to_change(reason: NeverStarts, request: Request) -> Message:
    """What to change so that a job pending for ``reason`` can start, worded when shown (``str()``: English); pure."""
    most_cpus = max(request.node_cpus.values(), default=None)
    n = len(request.node_cpus)
    partition = reason in (NeverStarts.PARTITION_CONFIG, NeverStarts.PARTITION_NODE_LIMIT)
    if partition and request.node_cpus and request.nnodes > n:  # SLURM says PartitionConfig first, then NodeLimit
        return Message(N_("ask for at most {n} nodes: nnodes={nnodes}, but sinfo lists {n}"),
                       {"n": n, "nnodes": request.nnodes})
    if reason == NeverStarts.PARTITION_CONFIG:
        asked = request.cpus_per_task
        if asked is not None and most_cpus is not None and asked > most_cpus:
            return Message(N_("ask for at most {most} CPUs per task: SlurmSpec.cpus_per_task={asked}, but the "
                              "partition's nodes have at most {most} CPUs"), {"most": most_cpus, "asked": asked})
        return Message(N_("ask for less per node than one node has (SlurmSpec.cpus_per_task, --mem or --gres in "
                          "SlurmSpec.sbatch_args; sinfo -N -o '%N %c %m %G' lists what each node has)"))
    return Message(WHAT_TO_CHANGE[reason])


# The change that lets a job pending for each other NeverStarts reason start (gettext messages).
WHAT_TO_CHANGE = {
    NeverStarts.PARTITION_NODE_LIMIT: N_("ask for fewer nodes (nnodes; sinfo lists the partition's)"),
    NeverStarts.PARTITION_TIME_LIMIT: N_("a smaller SlurmSpec.time_limit (or timeout_s), or another partition"),
    NeverStarts.INVALID_ACCOUNT: N_("another SlurmSpec.account (sacctmgr show assoc user=$USER lists yours)"),
    NeverStarts.INVALID_QOS: N_("another --qos in SlurmSpec.sbatch_args (sacctmgr show assoc user=$USER)"),
    NeverStarts.BAD_CONSTRAINTS: N_("a --constraint some node has (sinfo -N -o '%N %f' lists the features)"),
    NeverStarts.DEPENDENCY_NEVER_SATISFIED: N_("drop the --dependency from SlurmSpec.sbatch_args, or depend on a job "
                                               "that can still satisfy it"),
}

# Where Debian's and SchedMD's packages put the system's configuration (used when SLURM_CONF is not set).
SYSTEM_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm-llnl/slurm.conf", "/usr/local/etc/slurm.conf")


@dataclass(frozen=True)
class SlurmSpec:
    """How to submit a launch to SLURM (``LaunchSpec(..., slurm=SlurmSpec(...))``); every field is optional.

    The launch keeps its other fields' meaning: ``nnodes`` nodes to allocate, ``nproc_per_node`` ranks on each,
    ``timeout_s`` the wall-clock limit from submission (the time in the queue included), ``stall_timeout_s``,
    ``env`` (added to the environment ``sbatch`` exports to the job), ``max_restarts``, ``rendezvous_timeout_s``
    (``--rdzv-conf join_timeout``), ``live``. Fields about this machine's processes (``start_nodes``,
    ``master_port``, ``warm``) do not apply and are refused.

    Attributes:
        conf: the ``slurm.conf`` SLURM's commands read (``SLURM_CONF``); ``None``: the environment's, else the
            system's configuration.
        partition, account: ``sbatch --partition`` / ``--account`` (``None``: the cluster's defaults; ``sinfo``
            lists the partitions, ``sacctmgr show assoc user=$USER`` the accounts).
        gpus_per_node: GPUs to request per node (0: a CPU job; no GPU line is written). With GPUs one rank per
            GPU: ``nproc_per_node`` defaults to it and must equal it.
        cpus_per_task: CPUs per node (``--cpus-per-task``; the node's ranks share them); ``None``: the cluster's
            default.
        time_limit: ``--time`` (``HH:MM:SS``); ``None``: the launch's ``timeout_s`` plus 5 minutes, rounded up to
            minutes, so the launcher's limit (with every rank's stack) fires first and SLURM's ends a job whose
            kernel died.
        socket_ifname: the network interface between the nodes (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``);
            ``"lo"`` on the local cluster (every node is 127.0.0.1); ``None``: the libraries choose.
        torchrun: the torchrun command on the nodes; ``None``: this interpreter's ``python -m torch.distributed.run``
            (so the nodes need this Python at the same path, as on a shared filesystem).
        sbatch_args: more ``sbatch`` options, e.g. ``["--qos=debug", "--mem=16G"]``.
        job_name: ``--job-name``, also the prefix of the output files; ``None``: the script's name.
        poll_s: seconds between two looks at the job's state (``squeue``), > 0.
        cancel_pending_reasons: the ``NeverStarts`` reasons (or their squeue names, ``"PartitionConfig"``) after
            which the launch cancels a pending job at once and raises ``LaunchError`` naming the job, the reason and
            what to change, instead of waiting until ``timeout_s``; default: every one (``CANNOT_START`` says what
            each means). ``()``: wait whatever the reason.
    """

    conf: str | os.PathLike | None = None
    partition: str | None = None
    account: str | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    time_limit: str | None = None
    socket_ifname: str | None = None
    torchrun: str | None = None
    sbatch_args: Sequence[str] = ()
    job_name: str | None = None
    poll_s: float = 1.0
    cancel_pending_reasons: Sequence[NeverStarts | str] = tuple(NeverStarts)

    def validate(self) -> None:
        """Check the fields that ``slurm_script`` does not; raises ``ConfigError`` naming the bad value."""
        if self.conf is not None and not Path(self.conf).is_file():
            raise ConfigError(f"SlurmSpec.conf {str(self.conf)!r} is not a file: give the cluster's slurm.conf, or "
                              "None for $SLURM_CONF / the system's configuration")
        if isinstance(self.sbatch_args, (str, bytes)) or not all(isinstance(a, str) for a in self.sbatch_args):
            raise ConfigError(f"sbatch_args must be a list of sbatch options, got {self.sbatch_args!r}; e.g. "
                              "['--qos=debug']")
        if self.cpus_per_task is not None:
            check_positive_int("cpus_per_task", self.cpus_per_task)
        poll = self.poll_s
        if isinstance(poll, bool) or not isinstance(poll, (int, float)) or not poll > 0:
            raise ConfigError(f"poll_s must be a number of seconds > 0, got {poll!r}")
        self.cancel_reasons()
        if self.job_name is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", self.job_name):
            raise ConfigError(f"job_name must be 1-64 letters, digits, '.', '_' or '-', got {self.job_name!r}")

    def cancel_reasons(self) -> frozenset[NeverStarts]:
        """``cancel_pending_reasons`` as ``NeverStarts`` members.

        Raises:
            ConfigError: it is a string rather than a list, or names a reason that is not a ``NeverStarts`` one.
        """
        reasons = self.cancel_pending_reasons
        if isinstance(reasons, (str, bytes)):
            raise ConfigError(f"cancel_pending_reasons must be a list of squeue reasons, got {reasons!r}; e.g. "
                              "['PartitionNodeLimit']")
        try:
            return frozenset(NeverStarts(r) for r in reasons)
        except ValueError:
            bad = [r for r in reasons if r not in {m.value for m in NeverStarts}]
            raise ConfigError(f"cancel_pending_reasons holds {bad!r}, which can clear by themselves; allowed: the "
                              f"reasons after which a job never starts ({', '.join(m.value for m in NeverStarts)})"
                              ) from None

    def torchrun_command(self) -> str:
        """The torchrun command on the nodes (``torchrun``, or this interpreter's by default)."""
        return self.torchrun or this_torchrun()


@dataclass
class SlurmTarget:
    """The SLURM cluster a notebook submits to (``connect_slurm``).

    Attributes:
        kind: ``"environment"`` (``SLURM_CONF``), ``"system"`` (the system's ``slurm.conf``), ``"local"`` (the local
            cluster, already up), ``"local, started here"`` or ``"unavailable"``.
        conf: the ``slurm.conf`` the commands read (``None``: the system's).
        reason: why SLURM cannot be used here (``""`` when it can): not root, slurm-wlm missing, no answer.
        nodes: ``{node name: state}`` as ``sinfo`` reported them (empty when unavailable).
        local: the ``LocalCluster`` (local kinds only).
        started: whether ``connect_slurm`` started the local cluster (``close`` then stops it).
    """

    kind: str
    conf: Path | None = None
    reason: str = ""
    nodes: dict[str, str] = field(default_factory=dict)
    local: LocalCluster | None = None
    started: bool = False
    closed: bool = field(default=False, repr=False)

    @property
    def available(self) -> bool:
        """Whether jobs can be submitted."""
        return self.kind != "unavailable"

    def spec(self, **options: object) -> SlurmSpec:
        """A ``SlurmSpec`` for this cluster (its ``conf``; on the local cluster ``socket_ifname="lo"``), with
        ``options`` (any ``SlurmSpec`` field) over it.

        Raises:
            SlurmUnavailable: the cluster is unavailable (``reason`` says why).
        """
        if not self.available:
            raise SlurmUnavailable(f"no SLURM cluster to submit to: {self.reason}")
        base = SlurmSpec(conf=self.conf, socket_ifname="lo" if self.local is not None else None)
        return replace(base, **options)

    def describe(self) -> str:
        """One line: which cluster, its nodes, or why there is none."""
        if not self.available:
            return f"SLURM unavailable: {self.reason}"
        where = {"environment": f"SLURM_CONF={self.conf}", "system": "the system's slurm.conf"}.get(
            self.kind, f"{self.kind} in {self.local.state_dir if self.local else self.conf}")
        nodes = ", ".join(f"{name} {state}" for name, state in self.nodes.items())
        return f"SLURM cluster: {where}; nodes: {nodes or 'none listed'}"

    def close(self) -> bool:
        """Stop the local cluster if ``connect_slurm`` started it (every job cancelled, every daemon stopped by its
        PID, none left); ``True`` if it was stopped. A cluster found up, or a real one, is left as it is."""
        if not self.started or self.closed or self.local is None:
            return False
        self.closed = True
        self.local.down()
        return True

    def __enter__(self) -> SlurmTarget:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_lock = threading.Lock()


def connect_slurm(*, state_dir: str | os.PathLike | None = None, start_local: bool = True) -> SlurmTarget:
    """The SLURM cluster to submit to: ``$SLURM_CONF``'s, else the system's (``/etc/slurm/slurm.conf``), else the
    local two-node cluster (``python -m tutorial_lib slurm up``), started here when it is not up and
    ``start_local``. Never raises for a cluster that cannot be used: the target says why (``reason``). A
    ``SLURM_CONF`` in a local cluster's state folder (``make slurm``'s export line) is that local cluster.

    A local cluster started here is stopped by ``SlurmTarget.close()`` (and when this process exits normally), and
    belongs to this process: its watchdog stops it within seconds once this process ends, however it ends (a kernel
    restarted or killed with SIGKILL). One that was already up is left running, unless the process it belonged to has
    ended: then it is stopped and started afresh here (``kind`` ``"local, started here"``).

    Args:
        state_dir: the local cluster's state folder (``None``: ``default_state_dir()``).
        start_local: start the local cluster when it is not up (``False``: report it unavailable instead).
    """
    conf = os.environ.get("SLURM_CONF")
    system = next((Path(p) for p in SYSTEM_CONFS if Path(p).is_file()), None)
    if conf and LocalCluster(Path(conf).absolute().parent).daemons():  # `make slurm` and its export line
        local = LocalCluster(Path(conf).absolute().parent)
        if local.owner_gone():
            return SlurmTarget("unavailable", reason=f"the local cluster SLURM_CONF={conf} points at belonged to pid "
                               f"{local.owner().pid}, which has ended: its watchdog stops it (python -m tutorial_lib "
                               "slurm up starts one that runs until `slurm down`)", local=local)
        if local.is_up():
            return SlurmTarget("local", conf=local.conf, nodes=node_states(conf=local.conf), local=local)
        return SlurmTarget("unavailable", reason=f"the local cluster SLURM_CONF={conf} points at is not up "
                           "(python -m tutorial_lib slurm up)", local=local)
    if conf or system is not None:
        kind, path = ("environment", Path(conf)) if conf else ("system", None)
        try:
            return SlurmTarget(kind, conf=path, nodes=node_states(conf=path))
        except SlurmError as e:  # SlurmUnavailable included: no sinfo
            return SlurmTarget("unavailable", conf=path, reason=f"{e} ({'SLURM_CONF' if conf else system})")
    local = LocalCluster.default(state_dir)
    with _lock:
        try:
            if local.is_up() and not local.owner_gone():
                return SlurmTarget("local", conf=local.conf, nodes=node_states(conf=local.conf), local=local)
            if not start_local:
                return SlurmTarget("unavailable", reason=f"the local cluster in {local.state_dir} is not up "
                                   "(python -m tutorial_lib slurm up)", local=local)
            started = local.up(owner_pid=os.getpid())  # a dead owner's cluster: stopped, started afresh
            target = SlurmTarget("local, started here" if started else "local", conf=local.conf,
                                 nodes=node_states(conf=local.conf), local=local, started=started)
        except (SlurmError, ConfigError) as e:
            return SlurmTarget("unavailable", reason=str(e).splitlines()[0], local=local)
    if target.started:
        atexit.register(target.close)
    return target

