"""What a notebook cell checks and shows: its parameters checked, a script's listing, figures from run data.

The rule: these modules turn values into what a cell shows or refuses (``parameters``: the papermill parameters and
the positive-int check every caller shares; ``script_source``: a script shown with line numbers, imported as a module,
its arguments checked; ``plots``: data in, a ``matplotlib`` Figure out, no I/O; ``figure_text``: the Chinese
edition's glosses in figures, legends outside the axes, whole-number step ticks). They start no process and never
import the launcher; of the package they import only ``errors``, ``runs/`` (where the lesson scripts are) and
``i18n/`` (the language a figure's notes are glossed in).
"""
