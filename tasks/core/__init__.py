"""Machinery every stage shares.

- gateway:         the one door to every model: retries, bounded concurrency, JSON mode, journal, ledger.
- pricing:         USD per call from genai-prices, with config overrides.
- json_parse:      tolerant recovery of JSON from model output.
- embedded_model:  the local llama.cpp server (SmolLM2-135M) for the out-of-the-box run.
- batch:           the one batch runtime (resume, journal replay, record loop, error classification,
                   gateway registry) that evolve, synthesis and reward batches run on.
- reporting:       cost summaries and the markdown / table content of run reports.
- health:          health reports, one shape for every health check (the reward stage's data and models, the PPO
                   stage's training rewards): samples, stats, check rows, text histograms, the warn / stop policy.
- checks:          fail fast: every stage's inputs, output folder and endpoint checked before any work.
- keys:            the API key: where it comes from, where it may go, how it is shown (the gateway re-exports it).
- progress:        live progress numbers of a batched stage (records, accepted, calls/s, tokens/s, cost, ETA).
- llama_server:  llama.cpp's own `llama-server` for the embedded model: where its binary lives, its command, its
                 one-time build.
- params:        flow parameters shared by every stage, and the one way they become settings.
- policy:        the local policy model: the base policy's transformers folder, and batched generation from a folder.
- request_guard: what a local HTTP service of this project answers: the door checks that keep web pages out.
- serving:       serving an ASGI app on a port (uvicorn): the shared settings, the foreground run, a background
                 thread with its readiness wait, a free port (the recording proxy's and the sandbox service's).
- rng:           reproducible randomness: one RNG per (seed, record, purpose), the same on every resume and worker.
- stages:        the stage registry: one descriptor per stage, declared beside its stage, and iterated over by the
                 code that used to name every stage (the CLI, `evolforge status`, the deployments, the pipeline).
- stopping:      stopping a run on a signal: the first SIGINT (Ctrl-C) or SIGTERM stops it within seconds, a second
                 one at once.
- tls:           which CAs verify the endpoint's certificate (gateway.ca_bundle, SSL_CERT_FILE), and the one line
                 when it does not verify.
- extras:        the package's optional extras (pyproject.toml): which one a stage or a missing module needs, and the
                 one line naming its `pip install 'evolforge[...]'` (issue 41).
- structured:    structured outputs: the `response_format` a JSON call asks for, and what the endpoint turned out to
                 accept.
"""
