"""The programs the exercises' checks run that are not the learner's script: what a *predict, then run* exercise
measures, the job a *find the bug* exercise fails (each with a run card), the baseline of an *open challenge* (the
notebook's starter cell, the same text, short enough to read whole in the cell: no run card). Never imported: each
runs by file path on ranks, from a copy in the exercise's folder (``tutorial_lib.exercises.rounds``), standalone like
a lesson script (torch and the standard library, gloo on CPU), printing English only.
``tests/integration/test_exercises.py`` runs each of them through its exercise.
"""
