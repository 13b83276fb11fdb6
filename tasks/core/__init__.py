"""Machinery every stage shares.

- gateway:         the one door to every model: retries, bounded concurrency, JSON mode, journal, ledger.
- pricing:         USD per call from genai-prices, with config overrides.
- json_parse:      tolerant recovery of JSON from model output.
- embedded_model:  the local llama.cpp server (SmolLM2-135M) for the out-of-the-box run.
- batch:           the one batch runtime (resume, journal replay, record loop, error classification,
                   gateway registry) that evolve, synthesis and reward batches run on.
- reporting:       cost summaries and the markdown / table content of run reports.
- checks:          fail fast: every stage's inputs, output folder and endpoint checked before any work.
- keys:            the API key: where it comes from, where it may go, how it is shown (the gateway re-exports it).
- progress:        live progress numbers of a batched stage (records, accepted, calls/s, tokens/s, cost, ETA).
"""
