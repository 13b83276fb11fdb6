"""The Prefect UI shows a run as a user wants it: a real Prefect server, an evolve flow run against it, and headless
Chromium (Debian's chromium + chromedriver, driven by selenium: testing/browser.py) on the UI: the run page lists
the artifacts, the summary artifact renders its tables and the plots artifact its images. Screenshots stay in the
test's tmp folder (EVOLFORGE_UI_SCREENSHOTS=DIR copies them there too)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

from evolforge.testing import browser
from evolforge.testing.scripted_server import ScriptedServer

pytestmark = [
    pytest.mark.skipif(bool(browser.available()), reason=browser.available() or ""),
    # a Prefect server, a flow run and a browser: about 35 s here, so CI runs it (what the UI shows is a feature)
]
wait_for = browser.wait_for

TAB = "//*[normalize-space(.)='Artifacts' and not(*[normalize-space(.)='Artifacts'])]"  # the innermost element
RUN_FLOW = """
import json, sys
from evolforge.flows.evolve import EvolveParams, evolve_flow
s = evolve_flow(EvolveParams(seeds=sys.argv[1], out=sys.argv[2], rounds=2, base_url=sys.argv[3],
                             overrides={"evol_instruct": {"batch_size": 3}, "gateway": {"backoff_base_seconds": 0}}))
print("RESULT " + json.dumps({"run_id": s["run_id"]}))
"""


def artifacts_of(api: str, run_id: str) -> dict[str, dict]:
    res = httpx.post(f"{api}/artifacts/filter", json={"artifacts": {"flow_run_id": {"any_": [run_id]}}}, timeout=10)
    return {a["key"]: a for a in res.json() if a.get("key")}


def test_run_page_lists_artifacts_and_renders_summary_and_plots(prefect_server, tmp_path):
    env, api = prefect_server
    ui = api.removesuffix("/api")
    seeds = tmp_path / "seeds.jsonl"
    seeds.write_text("\n".join(json.dumps({"id": f"s{i}", "instruction": f"Compute {i} plus {i + 7} and explain "
                                           f"the result number {i}."}) for i in range(6)) + "\n")
    with ScriptedServer() as model:
        res = subprocess.run([sys.executable, "-c", RUN_FLOW, str(seeds), str(tmp_path / "out"), model.base_url],
                             env={**env, "PREFECT_HOME": env["PREFECT_HOME"]}, capture_output=True, text=True,
                             timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    run_id = json.loads(res.stdout.split("RESULT ", 1)[1])["run_id"]
    arts = artifacts_of(api, run_id)
    assert {"evolve-summary", "evolve-plots", "evolve-round-1", "evolve-round-2"} <= set(arts)

    shots = tmp_path / "screenshots"
    shots.mkdir()
    with browser.chromium() as driver:
        # the run page's Artifacts tab lists every artifact of the run by key (the tab shows once the run's
        # state has loaded: click it then, as a user does)
        driver.get(f"{ui}/runs/flow-run/{run_id}")
        wait_for(driver, lambda d: d.find_elements("xpath", TAB) and "Completed" in d.find_element("tag name", "body").text,
                 "the run page")
        wait_for(driver, lambda d: [e for e in d.find_elements("xpath", TAB) if e.is_displayed()][-1].click() or True,
                 "a clickable Artifacts tab")
        wait_for(driver, lambda d: all(k in d.find_element("tag name", "body").text
                                       for k in ("evolve-summary", "evolve-plots", "evolve-round-1")),
                 "the run's artifacts on its page")
        driver.save_screenshot(str(shots / "prefect-run-artifacts.png"))

        # the summary artifact: its markdown tables render as tables (rounds, cost per stage)
        driver.get(f"{ui}/artifacts/artifact/{arts['evolve-summary']['id']}")
        tables = wait_for(driver, lambda d: [t for t in d.find_elements("tag name", "table")
                                             if "survival" in t.text] and d.find_elements("tag name", "table"),
                          "the summary's tables")
        assert len(tables) >= 2
        headers = [th.text.strip().lower() for th in tables[0].find_elements("tag name", "th")]
        assert headers[:3] == ["round", "attempts", "accepted"]
        assert len(tables[0].find_elements("tag name", "tr")) == 1 + 2  # header + one row per round
        driver.save_screenshot(str(shots / "prefect-summary-artifact.png"))

        # the plots artifact: each PNG (a data: URI) loads as an image of real size
        driver.get(f"{ui}/artifacts/artifact/{arts['evolve-plots']['id']}")
        sizes = wait_for(driver, lambda d: (lambda imgs: imgs if len(imgs) == 3 and all(w > 300 for w, _ in imgs)
                                            else None)(
            [(i.get_property("naturalWidth"), i.get_attribute("src")[:22])
             for i in d.find_elements("tag name", "img") if (i.get_attribute("src") or "").startswith("data:image/png")]),
            "the three plots as images")
        assert all(src == "data:image/png;base64," for _, src in sizes)
        driver.save_screenshot(str(shots / "prefect-plots-artifact.png"))
    if os.environ.get("EVOLFORGE_UI_SCREENSHOTS"):
        shutil.copytree(shots, os.environ["EVOLFORGE_UI_SCREENSHOTS"], dirs_exist_ok=True)
    print("screenshots:", shots)
