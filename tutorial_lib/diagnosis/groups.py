"""The doctor on a torchft run: every replica group's every start diagnosed, each named with its group.

``launcher/replicas.py`` runs each replica group as a torchrun job of its own, in ``<run_dir>/group<G>/attempt<A>/``
(torchrun's ``torchrun.log`` and ``logs/``, each rank's ``stdout.log``, ``stderr.log`` and ``error.json``): a torchrun
run directory without the launcher's ``output.log``, which ``diagnose`` reads as it reads any run (the ranks' lines
from their own logs). ``diagnose_groups(run_dir)`` diagnoses each of them and, where the lighthouse's log is given (or
``<run_dir>/lighthouse.log`` exists), adds what the lighthouse said to a quorum timeout: how many groups it had and
how many it needed; to a failed heal it adds where the heal stood: the group's step and the step it was behind (a
group that fell behind and could not catch up), or the ranks it was sending its state to. torchft prints nothing of
its own for a group that is merely behind: it heals it (``healing required ... max_step=N``), and only a heal that
fails is a failure.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..i18n import N_, Message, _
from ..runs.replica_records import read_kill_record, replica_attempt_dirs
from ..runs.rundir import LOGS
from ..torchrun.output_lines import rank_lines
from ..torchrun.rank_logs import labelled_output
from .cause_ids import CauseId
from .doctor import diagnose
from .report import Diagnosis
from .torchft_causes import HEALING, LOGGED_STEP, QUORUM_STATUS, RECOVERY_FAILED, SENDING

KILLED_FIX = N_("not a failure of the script: this start was killed on purpose with {signal} (a drill standing in for "
                "a machine that dies); the other groups' reports say what the loss did to them")
LIGHTHOUSE_LOG = "lighthouse.log"  # where the workbook's notebooks and tests put it: start_lighthouse(run_dir / ...)


@dataclass
class GroupDiagnosis:
    """One start of one replica group, diagnosed.

    Attributes:
        group: the replica group (``REPLICA_GROUP_ID``).
        attempt: its start (0: the first, 1: after the first restart, ...).
        diagnosis: the doctor's report on that start's folder (``diagnosis.cause_id``: what code compares).
    """

    group: int
    attempt: int
    diagnosis: Diagnosis

    @property
    def failed(self) -> bool:
        """Whether this start failed (``diagnosis.failed``)."""
        return self.diagnosis.failed

    @property
    def cause_id(self) -> CauseId:
        """The suspected cause (``diagnosis.cause_id``)."""
        return self.diagnosis.cause_id

    def rows(self) -> list[tuple[str, str]]:
        """The report as (label, text) rows: the group and its start, then the diagnosis's rows."""
        return [(_("replica group"), _("group {group}, start {attempt}", group=self.group, attempt=self.attempt)),
                *self.diagnosis.rows()]

    def __str__(self) -> str:
        return str(self.diagnosis).join(
            [_("replica group {group}, start {attempt}:", group=self.group, attempt=self.attempt) + "\n", ""])

    def _repr_html_(self) -> str:
        return self.diagnosis._repr_html_().replace(
            "<table>", "<table><caption style='text-align:left'>" + html.escape(self.rows()[0][1]) + "</caption>", 1)


def _lighthouse_status(log_path: Path) -> str:
    """The lighthouse's last "quorum not ready" line, shortened (``"the lighthouse had 1 group(s), needed 2"``)."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    found = [m for m in map(QUORUM_STATUS.search, lines) if m]
    return f"the lighthouse had {found[-1]['have']} group(s), needed min_replicas {found[-1]['need']}" if found else ""


def _logged_steps(lines: list[tuple[int | None, str]]) -> dict[int, int]:
    """``{rank: step}``: the step in each rank's last line with torchft's log prefix (``"[<replica>/0 - step 74]"``),
    the group's step as torchft counted it (its own metrics, if any, are the script's and not in the folder)."""
    steps = {}
    for rank, text in lines:
        m = LOGGED_STEP.search(text)
        if m and rank is not None:
            steps[rank] = int(m["step"])
    return steps


def _heal_context(lines: list[tuple[int | None, str]]) -> str:
    """Where this start's failed heal stood: ``"at step 0, behind the others' step 74"`` (it was healing) or ``"at
    step 74, sending its state to replica rank(s) 1"``, from the last such line before torchft's ``got exception in
    recovery``; ``""`` when its logs have none. Worded in ``tl.language()``; the log's own words follow it."""
    context = ""
    for _rank, line in lines:
        if RECOVERY_FAILED.search(line):
            return context
        healing, sending = HEALING.search(line), SENDING.search(line)
        if healing:
            context = _("at step {step}, behind the others' step {max_step}", step=healing["step"],
                        max_step=healing["max_step"])
        elif sending:
            context = _("at step {step}, sending its state to replica rank(s) {ranks}", step=sending["step"],
                        ranks=sending["ranks"])
    return ""


def diagnose_groups(run_dir: str | os.PathLike, *, lighthouse_log: str | os.PathLike | None = None
                    ) -> list[GroupDiagnosis]:
    """Diagnose every start of every replica group of a torchft run (``start_replica_groups``' ``run_dir``).

    Args:
        run_dir: the groups' run directory, which holds ``group<G>/attempt<A>/``.
        lighthouse_log: the lighthouse's log (``Lighthouse.log_path``); default ``<run_dir>/lighthouse.log`` if it
            exists. A quorum timeout's evidence then says how many groups it had and needed.

    Returns:
        One ``GroupDiagnosis`` per start, by group then start; ``[g for g in result if g.failed]`` are the failures.
        A start that was killed on purpose (``ReplicaGroups.kill``, a drill's trigger) left no error of its own; its
        kill record (``KILL_RECORD``) names it ``CauseId.KILLED_ON_PURPOSE`` and who killed it, not the OOM killer.

    Raises:
        ConfigError: ``run_dir`` holds no ``group<G>/attempt<A>/`` folder.
    """
    run_dir = Path(run_dir)
    found = replica_attempt_dirs(run_dir)
    if not found:
        raise ConfigError(f"{str(run_dir)!r} holds no group<G>/attempt<A>/ folder: pass the run_dir given to "
                          "start_replica_groups (for one torchrun run, diagnose(run_dir))")
    log_path = Path(lighthouse_log) if lighthouse_log is not None else run_dir / LIGHTHOUSE_LOG
    status = _lighthouse_status(log_path)
    result = []
    for group, attempt, folder in found:
        diagnosis = diagnose(folder)
        lines = rank_lines(labelled_output(folder / LOGS))
        diagnosis.last_steps = diagnosis.last_steps or _logged_steps(lines)
        if diagnosis.cause_id == CauseId.TORCHFT_QUORUM_TIMEOUT and status:
            diagnosis.evidence = f"{diagnosis.evidence}; {status}"
        if diagnosis.cause_id in (CauseId.TORCHFT_RECOVERY_FAILED, CauseId.TORCHFT_RECOVERY_WITHOUT_NUMPY):
            context = _heal_context(lines)
            diagnosis.evidence = f"{context}: {diagnosis.evidence}" if context else diagnosis.evidence
        killed = read_kill_record(folder)
        if killed is not None and diagnosis.failed:
            diagnosis.cause_id, diagnosis.cause_fields = CauseId.KILLED_ON_PURPOSE, {"by": killed.get("by", "?")}
            diagnosis.fix_text = Message(KILLED_FIX, {"signal": killed.get("signal", "SIGKILL")})
        result.append(GroupDiagnosis(group, attempt, diagnosis))
    return result
