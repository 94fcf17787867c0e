"""Everything torchrun prints and leaves behind, read here and nowhere else.

``rank_logs``: each rank's lines, from its own torchrun log files as they grow (no text a rank prints passes for
another rank's);
``output_lines``: ``output.log``'s labelled lines, and the older ``--tee`` format read back; ``tee``: that ``--tee``
format (which rank wrote a piece), redrawn lines, every rank's last lines; ``noise``: the
lines a torch version adds; ``stacks``: Python tracebacks and ``faulthandler`` dumps in a rank's output;
``attempts``: its per-attempt folders and the error files ``@record`` writes; ``root_cause``: which rank failed
first; ``formats``: every text format those print (rank labels, tracebacks, faulthandler dumps, gloo and c10d lines),
the one place a pattern of them is written (``tests/unit/test_architecture.py`` finds any other). Pure readers of text and files for the launcher and the doctor: they import nothing of ``tutorial_lib``
but ``child.protocol`` (the marks the rank runner writes).
"""
