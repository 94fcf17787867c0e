"""What went wrong in a run, as one value, and how it is said: the doctor.

``causes`` is the table of known failures (each a ``CauseId`` with the pattern of its messages and its fix) and the
names of the doctor's own conclusions; ``doctor`` reads a finished run (or a ``LaunchError``'s evidence) into a
``Diagnosis`` (``report``): who failed first, how, where every rank was, the cause and the fix. Rule: it reads, and
starts no process; its words are gettext messages (``tutorial_lib.i18n``), worded only when a report is shown, and code
compares ``CauseId`` values and typed fields, never those words. It imports ``errors``, ``i18n``, ``runs/`` and
``torchrun/``, never the launcher (which calls it when a launch fails).
"""
