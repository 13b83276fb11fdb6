"""The sandbox that runs untrusted generated code (bubblewrap, rlimits, timeouts).

- run:     run_python_tests and the availability check; the only way generated code is executed.
- limits:  the rlimit / bwrap argument helpers.
"""
