"""The lab: what measures taut rather than what trains with it — the method matrix and its suites,
the studies on real weights whose cells are committed (bench/), the reports and figures that
compare runs (report/: `taut compare`), and the studies' one commands run from the repository
root (`python -m taut.lab.arith_study`, `python -m taut.lab.written_start`).

The core (everything outside this package but the CLI) never imports it: tests/test_architecture.py
checks that over the import graph.
"""
