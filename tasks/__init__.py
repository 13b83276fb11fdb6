"""The work: plain, testable functions over typed records, with thin Prefect task wrappers.

- gateway:         the one door to every model (retries, concurrency, ledger, JSON mode).
- pricing:         USD per call from genai-prices, with config overrides.
- json_parse:      tolerant recovery of JSON from model output.
- embedded_model:  the local llama.cpp server (SmolLM2-135M) for the out-of-the-box run.
- prompts:         every Evol-Instruct prompt template, in one file.
- evolution:       choosing and applying an evolution operation to one record.
- elimination:     the four published elimination rules.
- evolve_batch:    one batch of one round (plain function + Prefect task).
"""
