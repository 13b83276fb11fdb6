"""The sandbox that runs untrusted generated code (bubblewrap, rlimits, timeouts).

- run:     run_python_tests and the availability check; the only way generated code is executed.
- limits:  the rlimit / bwrap argument helpers.
- harness: the in-sandbox runner (written into the sandbox per run): nonce from a private pipe, audit hook,
           pytest plugin reporting the real outcomes on a private result channel.
- verdict: the host's judgement of a run from that channel (never from the tested code's output).
- service: `evolforge sandbox-serve`, run_python_program behind SandboxFusion's HTTP API (verl's code reward).
"""
