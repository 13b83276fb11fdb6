"""What a PPO run sets up before anything trains: its inputs, the reward stage's verdict, the verl configuration
and the Ray job. Plain functions; flows/ppo.py calls them in this order.

    resolve(params, cfg)             the [ppo] settings, the evolved table, and the IRM / PRM as local folders
                                     (remote ones downloaded: the trainers and the reward function load them)
    reward_health(params, irm, prm)  the pre-flight (tasks/ppo/preflight.py): the models exist and the reward
                                     stage called them healthy; a run that overrides the verdict says so
    prompt_data(evolved, lay, cfg)   the verl prompt parquet: data/train.parquet and data/test.parquet, the training
                                     rows decontaminated against the evaluation sets (decontamination.json)
    initial_policy(params, cfg, lay) the policy PPO starts from: the SFT stage's model (--sft), else the base policy
                                     (the GGUF converted to a transformers folder, local/base_policy)
    verl_config(cfg, lay, ...)       the verl PPO configuration, validated and written, with its `ray job submit`
                                     line in verl/submit.sh
    plan(cfg, reward, lay, ...)      the Ray job: what it runs (ppo.ray_job: the verl PPO trainer, or the GRPO
                                     smoke run, whose spec goes to local/grpo_job.json), its request and its
                                     `ray job submit` line, the cluster's address (none: the line is printed)
    submit(address, request, ...)    the job through the Ray Jobs API (verl/submission.json, ray_job.log)
    job_result(lay, job)             the GRPO smoke run's result as a grpo_smoke Ray job wrote it
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evolforge.config.settings import EvalSettings, PPOSettings, RewardSettings
from evolforge.storage import ppo as store
from evolforge.storage.fs import AnyPath, local_copy, location, write_text_atomic
from evolforge.storage.layout import RunLayout
from evolforge.storage.reward_sets import META_FILE
from evolforge.tasks.core.keys import SECRET_ENV
from evolforge.tasks.core.policy import find_policy_gguf, prepare_policy
from evolforge.tasks.ppo import grpo_smoke, ray_jobs
from evolforge.tasks.ppo import verl as ppo_verl
from evolforge.tasks.ppo.data import build_prompt_rows
from evolforge.tasks.ppo.preflight import preflight
from evolforge.tasks.ppo.stage import PPOParams, reward_models, sft_model_dir
from evolforge.tasks.problems.benchmarks import eval_index, own_problems
from evolforge.tasks.reward.selection import irm_selection
from evolforge.tasks.text.ngrams import check_table


def resolve(params: PPOParams, cfg: PPOSettings | None = None) -> tuple[PPOSettings, AnyPath, Path, Path]:
    """(the [ppo] settings, the evolved table, the IRM folder, the PRM folder): an evolve run's folder becomes its
    dataset/evolved.parquet; remote model folders are downloaded (cached) as local ones."""
    cfg = cfg or params.settings().ppo
    evolved = location(params.evolved)
    if evolved.is_dir():
        evolved = RunLayout(evolved).evolved
    irm, prm = reward_models(params, cfg)
    return cfg, evolved, local_copy(irm, marker=META_FILE), local_copy(prm, marker=META_FILE)


def reward_health(params: PPOParams, irm: Path, prm: Path, logger: logging.Logger | logging.LoggerAdapter,
                  reward: RewardSettings | None = None) -> dict:
    """The pre-flight's verdict (RewardStageUnhealthy unless the reward stage is healthy, ignore_reward_health is
    set or reward.health_policy is "warn"); a run that goes on despite an unhealthy reward stage logs a warning."""
    reward = reward or params.settings().reward
    ignore = params.ignore_reward_health or reward.health_policy == "warn"
    health = preflight(params.reward_dir, irm, prm, ignore)
    if health["overridden"]:
        why = "--ignore-reward-health" if params.ignore_reward_health else 'reward.health_policy = "warn"'
        logger.warning("reward stage NOT healthy, running anyway (%s): %s", why, health["reason"])
    return health


def prompt_data(evolved: str | AnyPath, lay: store.PPOLayout, cfg: PPOSettings, tasks: str | None = None,
                evals: EvalSettings | None = None, irm: Path | None = None,
                reward: RewardSettings | None = None) -> dict:
    """The evolved instructions (+ the kept synthesized tasks) as verl prompt rows, split by seed lineage, the
    training rows decontaminated against the evaluation sets (`evals`; ppo.decontaminate), written to
    data/train.parquet and data/test.parquet (and decontamination.json); returns the counts (tasks/ppo/data.py).
    With `irm` and reward.select_by_irm on, the IRM's selection of the evolved pool decides which evolved rows are
    trained on (tasks/reward/selection.py; counts["irm_selection"], each row's lineage)."""
    kept = store.read_tasks(tasks) if tasks else None
    records = store.read_evolved(evolved)
    selection, picked = None, None
    if irm is not None and reward is not None and reward.select_by_irm != "off":
        selection, picked = irm_selection(records, irm, reward)
    train_rows, test_rows, counts = build_prompt_rows(
        records, cfg.test_fraction, cfg.split_seed, cfg.answer_in_steps,
        tasks=kept, unverified_ground_truth=cfg.unverified_ground_truth, selection=selection,
        held_out=cfg.held_out_seeds)
    counts["irm_selection"] = picked
    if evals is not None and cfg.decontaminate != "off":
        train_rows, counts["decontamination"] = decontaminate(train_rows, test_rows, kept or [], cfg, evals)
        store.write_json(lay.decontamination, counts["decontamination"])
        counts["train"] = len(train_rows)
    if not train_rows:
        raise ValueError(f"{evolved} yields no training prompts ({counts})")
    store.write_prompt_parquet(train_rows, lay.train)
    store.write_prompt_parquet(test_rows, lay.test)
    return counts


def decontaminate(train: list[dict], test: list[dict], tasks: list[dict], cfg: PPOSettings,
                  evals: EvalSettings) -> tuple[list[dict], dict[str, dict]]:
    """The training rows checked against the evaluation sets (HumanEval, the math file, the held-out verified tasks
    of the test lineages) by word n-gram overlap, per table (evolved, synthesis); under ppo.decontaminate 'drop' the
    overlapping rows are left out (the rest re-indexed)."""
    held = {r["extra_info"]["lineage"]["seed_id"] for r in test}
    index = eval_index(evals, extra=own_problems(tasks, held))
    reports, kept = {}, []
    for table in ("evolved", "synthesis"):
        rows = [r for r in train if (r["extra_info"]["lineage"]["operation"] == "synthesis") == (table == "synthesis")]
        flags, reports[table] = check_table(table, rows, lambda r: f"{r['extra_info']['question']}\n"
                                            f"{r['extra_info']['answer']}", index,
                                            id_of=lambda r: str(r["extra_info"]["lineage"]["id"]))
        reports[table]["dropped"] = reports[table]["overlapping"] if cfg.decontaminate == "drop" else 0
        kept += [r for r, hit in zip(rows, flags) if not (hit and cfg.decontaminate == "drop")]
    order = {id(r): i for i, r in enumerate(train)}
    kept.sort(key=lambda r: order[id(r)])
    return [{**r, "extra_info": {**r["extra_info"], "index": i}} for i, r in enumerate(kept)], reports


def needs_local_policy(cfg: PPOSettings) -> bool:
    """A local initial policy is needed for the smoke run, and for verl when no ppo.policy_path is set."""
    return cfg.local_steps > 0 or not cfg.policy_path


def initial_policy(params: PPOParams, cfg: PPOSettings, lay: store.PPOLayout) -> dict:
    """{"path", "kind"}: the SFT stage's model when `params.sft` names one (kind "sft"), else the base policy
    (ppo.policy_gguf, default SmolLM2-135M-Instruct) converted once into local/base_policy (kind "base")."""
    if params.sft:
        return {"path": str(sft_model_dir(params.sft)), "kind": "sft"}
    return {"path": str(prepare_policy(find_policy_gguf(cfg.policy_gguf), lay.base_policy)),
            "kind": "base"}


def verl_config(cfg: PPOSettings, lay: store.PPOLayout, policy: str, irm: Path, prm: Path,
                submission_id: str) -> dict:
    """The verl PPO configuration, validated and written, with the `ray job submit` line in verl/submit.sh."""
    overrides = ppo_verl.verl_overrides(cfg, train_files=str(lay.train), val_files=str(lay.test), policy_path=policy,
                                        irm_dir=str(irm), prm_dir=str(prm), checkpoint_dir=str(lay.verl_checkpoints))
    ppo_verl.validate_config(overrides)  # the documented schema; invalid settings stop the run here
    checked_by = "evolforge's schema of verl's keys"
    if cfg.verl_python:  # verl's own Hydra compose and validate_config, as main_ppo runs them
        verdict = ppo_verl.check_with_verl(overrides, python=cfg.verl_python)
        if verdict["problems"]:
            raise ValueError(f"verl {verdict['verl']} refuses the PPO configuration: " + "; ".join(verdict["problems"]))
        checked_by = f"verl {verdict['verl']} (Hydra compose + validate_config)"
    line = ppo_verl.shell_line(ppo_verl.ray_submit_command(overrides, cfg.ray_address, submission_id,
                                                           cfg.ray_working_dir))
    store.write_yaml(lay.verl_config, ppo_verl.config_document(overrides),  # strings escaped for OmegaConf
                     header="# verl PPO configuration written by evolforge (keys of verl.trainer.main_ppo)\n")
    store.write_lines(lay.verl_overrides, ppo_verl.hydra_args(overrides))
    write_text_atomic(lay.submit_script, "#!/bin/sh\n# RAY_ADDRESS: the cluster's dashboard, e.g. "
                            "http://head:8265\nset -e\n" + line + "\n", permissions=0o755)
    algorithm = "PPO (critic, GAE)" if cfg.adv_estimator == "gae" else f"{cfg.adv_estimator} (verl)"
    return {"algorithm": algorithm, "checked_by": checked_by, "command": line, "config": str(lay.verl_config),
            "entrypoint": ppo_verl.main_ppo_command(overrides)}


def job_request(cfg: PPOSettings, submission_id: str, entrypoint: list[str], smoke: bool,
                secret_names: tuple[str, ...] = SECRET_ENV) -> ray_jobs.JobRequest:
    """The Ray job's request: its entrypoint and environment (the smoke run: one CPU, ppo.local_torch_threads).
    A variable that looks like a credential (by name, or its value: one of the `secret_names` variables' values, a
    token shape, a URL with credentials) and is not in ppo.ray_env_allow is refused here (RayJobError)."""
    env = {"PYTHONUNBUFFERED": "1", **cfg.ray_env_vars}
    if smoke:
        env.setdefault("OMP_NUM_THREADS", str(cfg.local_torch_threads))
    request = ray_jobs.JobRequest(entrypoint=entrypoint, submission_id=submission_id, working_dir=cfg.ray_working_dir,
                                  env_vars=env, entrypoint_num_cpus=1 if smoke else None,
                                  allow_env=tuple(cfg.ray_env_allow), secret_env=tuple(secret_names))
    request.runtime_env()  # refused before anything is submitted or printed
    return request


@dataclass(frozen=True)
class JobPlan:
    """The Ray job of a run (see the module docstring): `address` is empty when no cluster is named."""

    kind: str  # ppo.ray_job: verl_ppo or grpo_smoke
    address: str
    request: ray_jobs.JobRequest
    command: str  # the equivalent `ray job submit` line
    verl: dict  # what verl_config returned
    spec: dict[str, Any] | None  # the GRPO smoke run's spec (None: ppo.local_steps = 0)

    @property
    def smoke_on_cluster(self) -> bool:
        """The GRPO smoke run is the Ray job (not run here)."""
        return bool(self.address) and self.kind == "grpo_smoke"


def plan(cfg: PPOSettings, reward: RewardSettings, lay: store.PPOLayout, irm: Path, prm: Path,
         policy: dict | None, secret_names: tuple[str, ...] = SECRET_ENV) -> JobPlan:
    """Write the verl configuration (and the smoke run's spec when it is the job) and name the Ray job
    (`secret_names`: the variables holding configured secrets, tasks/core/keys.py secret_env_names)."""
    address = ray_jobs.job_address(cfg.ray_address)
    submission_id = f"evolforge-{cfg.ray_job.replace('_', '-')}-{int(time.time())}-{uuid.uuid4().hex[:6]}"
    verl = verl_config(cfg, lay, cfg.policy_path or str((policy or {}).get("path")), irm, prm, submission_id)
    spec = grpo_smoke.job_spec(cfg, reward, policy=policy, root=lay.root, irm=irm, prm=prm,
                               job_id=submission_id) if cfg.local_steps > 0 else None
    smoke = cfg.ray_job == "grpo_smoke"
    if smoke:
        store.write_json(lay.grpo_job_spec, spec)
    entrypoint = grpo_smoke.entrypoint(lay.grpo_job_spec) if smoke else verl["entrypoint"]
    request = job_request(cfg, submission_id, entrypoint, smoke=smoke, secret_names=secret_names)
    command = ppo_verl.shell_line(ray_jobs.submit_command(address, request))
    return JobPlan(cfg.ray_job, address, request, command, verl, spec)


def submit(address: str, request: ray_jobs.JobRequest, cfg: PPOSettings, lay: store.PPOLayout) -> dict:
    """Submit through the Ray Jobs API; when waiting (ppo.ray_wait_seconds), the job's log goes to ray_job.log (not
    into the record). The record, with the job's kind (ppo.ray_job), is written to verl/submission.json."""
    record = ray_jobs.run(address, request, cfg.ray_wait_seconds)
    if "log" in record:
        write_text_atomic(lay.ray_job_log, record.pop("log"))
        record["log_path"] = str(lay.ray_job_log)
    job = {"kind": cfg.ray_job, **record}
    store.write_json(lay.submission, job)
    return job


def job_result(lay: store.PPOLayout, job: dict) -> dict | None:
    """The smoke run's result as the grpo_smoke job wrote it, marked `ran_on: ray_job` (None if this job did not
    write it: still running, or failed before the end)."""
    if not lay.local_run.exists():
        return None
    result = store.read_json(lay.local_run)
    return {**result, "ran_on": "ray_job"} if result.get("job_id") == job["submission_id"] else None
