"""The sandbox that runs untrusted generated code (bubblewrap, rlimits, timeouts).

- run:     run_tests, run_many, run_program (any language; run_python_tests / run_python_program: Python) and
           the availability check: the only entry points that execute generated code (per run, or through pool).
- languages: the language table (python, nodejs): file names, interpreter, test runners, bridge, memory.
- limits:  the rlimit / bwrap argument helpers.
- host:    what run and pool share: SandboxResult, the result channel's pipes, uids, kills, exit classification.
- harness: the in-sandbox runner (written into the sandbox per run): nonce from a private pipe, audit hook,
           pytest plugin reporting the real outcomes on a private result channel.
- direct:  in a warm worker's runner, the tests of a plain pytest file (module-level `def test_*():` only) called
           directly after pytest's own import of the file, with pytest's verdict (sandbox.pytest_direct).
- verdict: the host's judgement of a run from that channel (never from the tested code's output).
- pool:    warm workers (sandbox.reuse_workers, the default in bwrap mode): the host side, one bwrap sandbox per
           worker, descriptors of each check handed over a control socket, retirement after N checks or an anomaly.
- worker:  the in-sandbox worker (bound in read-only): pytest and the harness preloaded, one forked child per check
           with fresh tmpfs, own mount/IPC namespace, session, rlimits, uid, no capabilities.
- service: `evolforge sandbox-serve`, run_python_program behind SandboxFusion's HTTP API (verl's code reward).
- bridge:    the narrow channel between the runner process (the tests) and the solution process (the code under test).
- bridge.js: JavaScript's runner and solution process (node, exec'd in the same children), the twin of harness + bridge.
- humaneval: humanEval's check as a test script for the sandbox, with the prompt's helpers bound on the test side
             (check_script_js: the JavaScript form).
"""
