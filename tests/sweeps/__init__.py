"""The unit sweeps: the real executor, controller and fetcher broken at every window, no Spark and no servers.

Each is a program (``python -m tests.sweeps.crash_sweep``, ``python -m tests.sweeps.spool_sweep``,
``python -m tests.sweeps.spool_campaign``; RELIABILITY.md has their figures) and a library of the test that runs a
sample of it beside them in tests/ (``tests/test_crash_sweep.py``, ``tests/test_spool_sweep.py``,
``tests/test_spool_campaign.py``).  Their helpers come from :mod:`tests.lib`.
"""
