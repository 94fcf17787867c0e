"""The exercises' solutions, shown only when a learner asks (``exN.solution()``); never imported.

A script exercise's solution is the whole fixed script (``NN_K_<name>.py``): standalone like a lesson script (torch
and the standard library, gloo on CPU), run by ``tests/integration/test_exercises.py`` on 2 ranks to prove it passes
its check. A value exercise's (``NN_K.py``) derives the answer in a few commented lines ending in ``answer = ...``.
"""
