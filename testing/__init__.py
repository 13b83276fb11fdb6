"""Test and benchmark helpers, importable by tests/ and bench/ (and by users' own tests).

- scripted_server:  a scripted OpenAI-compatible server on loopback (faults, delays, deterministic replies).
- instant_server:   the same replies with no delay, for orchestration benchmarks (run as a script).
- near_dup_corpus:  seeded instruction-like corpora with known near-duplicates, for dedup tests and benchmarks.
- settings:         make_settings(base_url, **sections): test settings without the environment.
- evolved_runs:     a small finished evolve run on disk, tiny training settings.
- prefect_server:   a real Prefect server on a free loopback port, and flow-run state helpers.
- ppo_models:       tiny reward models and evolved-data files for PPO tests (needs pytest and torch).
- tiny_policy:      a 2-layer random Llama with the MiniLM tokenizer: a GRPO step in about a second.
- ray_cluster:      a real local Ray cluster (`ray start --head` on loopback), stopped by process id.
- verl_env:         verl in its own cached pip --target folder (its pins differ from ours): ensure_verl_env().run(...).
- distilabel_env:   distilabel in its own cached virtualenv, for the distilabel comparison benchmark only.
- cached_env:       what verl_env and distilabel_env share (cache folder, key, offline detection).
- net:              free_port() and wait_up(url) on loopback.
- hub_server:       a scripted Hugging Face Hub on loopback (repo create, card check, commit of small files).
- proxy_records:    wait_for_records(layout, n): the recording proxy's records once written (after the reply).
- ref_tree:         another commit's code importable as evolforge (a git worktree), for side-by-side benchmarks.
- tokenizer_share:  the embedded model's tokenizer converted from its GGUF once per machine for test processes.
"""
