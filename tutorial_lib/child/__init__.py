"""Programs run by file path in other processes: ``rank_runner.py`` (every rank) and ``warm_start.py`` (the
warm-start helper and its clients), ``lighthouse.py`` (torchft's lighthouse on loopback), and ``protocol.py``, what
they and the kernel agree on.

The rule of this folder: nothing here imports ``tutorial_lib`` (a test checks it). These files run as
``python <path>`` in processes where importing the package would cost seconds and run its ``__init__``; they load
``protocol.py`` by its path, under a private module name. The package imports ``protocol`` normally.
"""
