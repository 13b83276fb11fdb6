"""Deploy every evolforge flow: fill prefect.yaml's template variables from config, then `prefect deploy`.

    evolforge deploy [--config FILE] [--pool NAME] [--no-schedule]

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
