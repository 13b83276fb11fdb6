"""deployments/prefect.yaml is the stage registry rendered (`evolforge deploy --write-yaml`): one deployment per
stage, named after it, whose entrypoint is the stage's own flow; the nightly one on the [schedule] cron."""

from __future__ import annotations

import importlib

import yaml

from evolforge.deployments.deploy import PREFECT_FILE, ROOT, render_yaml
from evolforge.tasks.core.stages import stages


def test_committed_yaml_is_the_registry_rendered():
    assert PREFECT_FILE.read_text() == render_yaml(), "run `evolforge deploy --write-yaml` and commit the result"


def test_every_deployment_runs_its_stage_flow():
    doc = yaml.safe_load(PREFECT_FILE.read_text())
    by_name = {d["name"]: d for d in doc["deployments"]}
    registered = {s.name: s for s in stages() if s.deployment}
    assert set(by_name) == set(registered) and {"evolve", "nightly", "synthesize", "ppo", "pipeline"} <= set(by_name)
    for name, dep in by_name.items():
        path, _, attr = dep["entrypoint"].partition(":")
        assert (ROOT / path).exists(), dep["entrypoint"]
        flow = getattr(importlib.import_module("evolforge." + path.removesuffix(".py").replace("/", ".")), attr)
        assert flow.name == name and flow is registered[name].load_flow()
    assert by_name["nightly"]["schedules"][0]["cron"] == "{{ $EVOLFORGE_CRON }}"
    assert by_name["nightly"]["concurrency_limit"] == 1 and by_name["pipeline"]["concurrency_limit"] == 1
    assert all("schedules" not in d for n, d in by_name.items() if n != "nightly")
