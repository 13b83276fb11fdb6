"""Deploy every evolforge flow: fill prefect.yaml's template variables from config, then `prefect deploy`.

    evolforge deploy [--config FILE] [--pool NAME] [--no-schedule]
    evolforge deploy --write-yaml     # regenerate deployments/prefect.yaml from the stage registry

deployments/prefect.yaml is generated from the stage registry (tasks/core/stages.py): one deployment per stage
with a `deployment` in its descriptor, named after the stage, its entrypoint the stage's flow. `render_yaml()`
makes the text; the test suite checks that the committed file is exactly that, so a new stage's deployment is
its descriptor's line, not an edit here.

Creates the process work pool when it does not exist. Needs PREFECT_API_URL to point at a
running Prefect server (`prefect server start`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from evolforge.config.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
PREFECT_FILE = Path(__file__).resolve().parent / "prefect.yaml"


HEADER = """\
# evolforge deployments: every flow of the project on a Prefect *process* work pool.
# GENERATED from the stage registry (each stage's descriptor, tasks/<stage>/stage.py): do not edit by hand;
# regenerate with `evolforge deploy --write-yaml`.
#
# Deploy from the repository root with the helper, which fills the schedule from config
# ([schedule] in config/default.toml or --config FILE) and then calls `prefect deploy`:
#
#     evolforge deploy                 # = prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml
#
# or by hand, setting the template variables yourself:
#
#     EVOLFORGE_ROOT=$PWD EVOLFORGE_POOL=evolforge-pool EVOLFORGE_CRON="0 2 * * *" EVOLFORGE_TZ=UTC \\
#     EVOLFORGE_SCHEDULE_ACTIVE=true EVOLFORGE_DATASET=runs/nightly \\
#     EVOLFORGE_CHAIN_REWARD_DATA=false EVOLFORGE_CHAIN_TRAIN_REWARD=false EVOLFORGE_CHAIN_SFT=false \\
#     EVOLFORGE_CHAIN_PPO=false EVOLFORGE_CHAIN_EVAL=false \\
#       prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml
#
# Flow parameters are pydantic models, so the UI shows a form; from the CLI pass JSON:
#     prefect deployment run 'evolve/evolve' --param params='{"seeds": "config/sample_seeds.jsonl", "out": "runs/x", "rounds": 2}'
#     prefect deployment run 'evolve/evolve' --param params='{"out": "runs/x", "retry": true}'   # only the failed batches
#
# The nightly chain: each `triggers:` entry runs its deployment when the upstream stage's flow run completes
# (nightly -> reward-data -> train-reward -> sft -> ppo -> eval), its parameters rendered by the Prefect server
# from the upstream run into DATASET/chain/NIGHT/<stage> (storage/chain.py). A link is on when its stage is in
# [schedule] chain (EVOLFORGE_CHAIN_<STAGE>=true); a link that is off is deployed as a disabled automation.
"""


def entrypoint(flow: str) -> str:
    """"evolforge.flows.evolve:evolve_flow" -> "flows/evolve.py:evolve_flow" (relative to the repository root)."""
    module, _, attr = flow.partition(":")
    parts = module.split(".")
    if parts[0] != "evolforge":
        raise ValueError(f"a stage's flow must be in the evolforge package: {flow}")
    return "/".join(parts[1:]) + f".py:{attr}"


PRM_KEEP_SHARE = "EVOLFORGE_CHAIN_PRM_KEEP_SHARE"  # schedule.chain_prm_keep_share, for the links fed the PRM


def chain_switch(stage: str) -> str:
    """The template variable that switches a stage's chain link on or off ([schedule] chain)."""
    return "EVOLFORGE_CHAIN_" + stage.upper().replace("-", "_")


def chain_parameters(stage: str) -> dict:
    """A chained stage's flow parameters: its feeds (Stage.feeds, the same declaration the pipeline flow reads) from
    the stages the chain ran before it, and its output folder, as Jinja over the upstream run: what the upstream run
    was itself fed from the same folder (its parameter), else the folder in the chain's layout (storage/chain.py).
    A feed whose stages the chain does not run (synthesis) is left out."""
    from evolforge.storage import chain
    from evolforge.tasks.core.stages import fed, get

    st = get(stage)
    links, up = [], st.deployment.trigger.after
    while up and up not in links:
        links.append(up)
        trigger = get(up).deployment.trigger if get(up).deployment else None
        up = trigger.after if trigger else None
    ran, after = chain.ran_before(links), links[0]
    given = {feed.sources[0]: param for param, feed in get(after).feeds.items()
             if len(feed.sources) == 1 and not feed.every}  # (stage, path) -> the upstream's parameter holding it

    def folder_of(name: str, path: str) -> str | None:
        if name not in ran:
            return None
        param = given.get((name, path))
        return chain.template(f"{chain.UP}.{param}" if param else chain.folder_from(after, name, path))

    values = fed(st, folder_of)
    if "prm_dir" in values:  # a link fed the trained PRM trains only on what it ranks best (RLEIF's PRM in the loop)
        values["overrides"] = {"reward": {"prm_keep_share": "{{ $%s }}" % PRM_KEEP_SHARE}}
    if st.out_field in st.params.model_fields:
        values[st.out_field] = chain.template(chain.folder_from(after, stage))
    return {"params": values}


def chain_trigger(stage: str, trigger) -> dict:
    """A deployment trigger (prefect.yaml `triggers:`): run this deployment when a flow run of the upstream stage's
    deployment completes. `match_related` names both the upstream deployment and its flow (a stage's flow and
    deployment share its name), so another project's deployment of the same name does not fire it. The
    parameters (chain_parameters) are Jinja over the upstream run, rendered by the Prefect server when the event
    arrives (`prefect deploy` keeps them as they are: it fills only $VARIABLES)."""
    return {"type": "event", "name": f"{trigger.after} -> {stage}", "enabled": "{{ $%s }}" % chain_switch(stage),
            "match": {"prefect.resource.id": "prefect.flow-run.*"},
            "match_related": [{"prefect.resource.role": "deployment", "prefect.resource.name": trigger.after},
                              {"prefect.resource.role": "flow", "prefect.resource.name": trigger.after}],
            "expect": ["prefect.flow-run.Completed"], "posture": "Reactive", "threshold": 1, "within": 0,
            "parameters": chain_parameters(stage)}


def chained_stages() -> list[str]:
    """The stages whose deployment has a chain trigger, in registry order."""
    from evolforge.tasks.core.stages import stages

    return [st.name for st in stages() if st.deployment and st.deployment.trigger]


def deployment_entries() -> list[dict]:
    """One prefect.yaml deployment per registered stage that has one, in registry order."""
    from evolforge.tasks.core.stages import stages

    out = []
    for st in stages():
        d = st.deployment
        if d is None:
            continue
        entry: dict = {"name": st.name, "description": d.description, "entrypoint": entrypoint(st.flow),
                       "tags": list(d.tags or ("evolforge", st.name))}
        if d.concurrency_limit:
            entry["concurrency_limit"] = d.concurrency_limit
        entry["work_pool"] = {"name": "{{ $EVOLFORGE_POOL }}"}
        entry["parameters"] = dict(d.parameters)
        if d.schedule:
            entry["schedules"] = [{"cron": "{{ $EVOLFORGE_CRON }}", "timezone": "{{ $EVOLFORGE_TZ }}",
                                   "active": "{{ $EVOLFORGE_SCHEDULE_ACTIVE }}"}]
        if d.trigger:
            entry["triggers"] = [chain_trigger(st.name, d.trigger)]
        out.append(entry)
    return out


def render_yaml() -> str:
    """The text of deployments/prefect.yaml (see the module docstring)."""
    import yaml

    doc = {"name": "evolforge", "prefect-version": "3.4.0", "build": None, "push": None,
           "pull": [{"prefect.deployments.steps.set_working_directory": {"directory": "{{ $EVOLFORGE_ROOT }}"}}],
           "deployments": deployment_entries()}
    body = yaml.safe_dump(doc, sort_keys=False, width=120, default_flow_style=False)
    return HEADER + "\n" + body


def write_yaml() -> Path:
    PREFECT_FILE.write_text(render_yaml())
    return PREFECT_FILE


def template_env(settings: Settings, pool: str | None = None, schedule_active: bool | None = None) -> dict[str, str]:
    s = settings.schedule
    active = s.active if schedule_active is None else schedule_active
    dataset = s.dataset if os.path.isabs(s.dataset) else str(ROOT / s.dataset)
    return {
        "EVOLFORGE_ROOT": str(ROOT),
        "EVOLFORGE_POOL": pool or s.work_pool,
        "EVOLFORGE_CRON": s.cron,
        "EVOLFORGE_TZ": s.timezone,
        "EVOLFORGE_SCHEDULE_ACTIVE": "true" if active else "false",
        "EVOLFORGE_DATASET": dataset,
        **{chain_switch(st): "true" if st in s.chain else "false" for st in chained_stages()},
        PRM_KEEP_SHARE: str(s.chain_prm_keep_share),
    }


def prefect_cli() -> list[str]:
    return [sys.executable, "-m", "prefect"]


def ensure_pool(name: str, env: dict) -> None:
    found = subprocess.run([*prefect_cli(), "work-pool", "inspect", name], env=env, capture_output=True, text=True)
    if found.returncode != 0:
        subprocess.run([*prefect_cli(), "work-pool", "create", name, "--type", "process"], env=env, check=True)


def deploy(settings: Settings, pool: str | None = None, schedule_active: bool | None = None) -> int:
    env = {**os.environ, **template_env(settings, pool, schedule_active)}
    ensure_pool(env["EVOLFORGE_POOL"], env)
    cmd = [*prefect_cli(), "--no-prompt", "deploy", "--all", "--prefect-file", str(PREFECT_FILE)]
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode
