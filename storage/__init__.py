"""The only code that knows paths, schemas and file formats. It imports nothing from tasks/ or flows/.

- fs:              local folders and fsspec URLs alike: the one atomic writer (`atomic_output`, and the
                   `write_*_atomic` helpers on it), `atomic_dir` / `publish_dir` for folders, parquet I/O,
                   local copies of remote folders.
- logs:            append-only logs (journal, ledger, proxy records): O_APPEND locally, one object per
                   flush on object stores; refused writes are kept and raised, never dropped.
- locks:           inter-process locks (fcntl locally, exclusively created objects on fsspec stores).
- run_record:      run.json: the run's inputs, checked on resume.
- layout:          where every file of an evolve run lives (RunLayout), and the pipeline, dedup-index and
                   dedup-output layouts.
- schemas:         schemas shared by several modules (the lineage of every evolution attempt).
- parts:           atomic parquet part files (one per batch), their validation and quarantine.
- journal:         append-only jsonl logs of finished model calls, replayed on resume.
- ledger:          the cost ledger (one row per model call attempt), its tail and its totals.
- datasets:        reading seed datasets (jsonl / parquet / csv) with a rejects file; writing tables.
- rounds:          an evolve run's rounds: pools, completion markers, dedup decisions, final datasets, retry.
- nights:          the nightly dataset's index of nights.
- synthesis_sets:  the synthesis stage's files and task schema.
- reward_sets:     the reward stage's files, schemas and model folders (META_FILE marks a complete model).
- ppo:             the PPO stage's files and verl's data schema.
- proxy_sets:      the recording proxy's records, session events and ledger.
- trajectory_sets: the trajectories export (SFT conversations, transitions, token samples).
- module_sets:     the module-DAG stage's outputs.
- plots:           where a stage's PNG plots go (OUT/plots/<name>.png).
- cards:           dataset cards (README.md: configs, features, sizes, lineage, settings, models, cost) and the
                   SFT view of an evolved dataset.
- hf_features:     a parquet schema's `features` for a card, by the rules of `datasets.Features` (without importing it).
- chain:         the nightly chain's folders: where each downstream stage of a night writes when the deployments chain
                 it.
- dedup_memory:  a dedup work folder kept in memory, up to a budget (a dedup in one process).
- dedup_mirror:  a dedup work folder on an object store (`dedup.shard_dir` = s3://..., gs://..., any fsspec URL).
- dedup_sets:    files of a dedup run (the `dedup` stage: any jsonl / parquet / csv file -> kept set + dropped set).
- dedup_work:    the work folder of a dedup: the one format its steps exchange files in, in one process or on the
                 workers (tasks/dedup/plan.py).
- eval_sets:     files of the evaluation stage.
- folder:        what every stage's output folder has, once: the run-level files, the stage marker, and batched
                 tables.
- pipeline_sets: files of a pipeline run: one output folder per stage under OUT/, and the run's own files.
- sft_sets:      files of the SFT stage: where they live and how they are written.
- status:        what a stage's output folder holds, read from its checkpoints alone (no Prefect, no model, no
                 writes).
"""
