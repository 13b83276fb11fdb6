"""Module-DAG reasoning (DeCoRL) against the scripted server with a fixed per-call latency.

    .venv/bin/python bench/bench_modules.py [--items 40] [--latency 0.05] [--fault-rate 0.1] [--concurrency 8]

Every scenario runs batches through the batch runtime (tasks/modules/batch.py `run_modules_batch`, the same code
the Prefect task runs) against testing/scripted_server.py with TCP_NODELAY on (no 40 ms Nagle stall per call),
the default nine modules, ablation mask, aggregation integrate:
  1. scheduling (the server in its own process): a fixed latency per call; per question the module graph's wall
     time (`forward_s`) against the longest dependency chain's latency (5 calls x latency for the nine; goal
     <= 1.3x), one question at a time, then `--concurrency` questions in flight (there the client's CPU per call,
     about 3 ms under one GIL, stretches every call: reported against the measured chain too), and the whole
     question (judging included: + one judge round, the 1 + k judge calls run at once). A skewed variant (parse
     and entity +0.25 s, in different levels) shows dependency scheduling against lock-step levels (their sum).
  2. schema faults: `--fault-rate` of module replies are invalid JSON / missing fields / wrong content / a
     confidence over 1; the share of module outputs valid within 2 re-asks (goal >= 99%) and crashed questions
     (status error or a failed batch; goal 0).
  3. error localisation: one module corrupted (each of the 8 non-exit modules in turn, the schema faults still
     on): the share of questions where it gets the lowest contribution (goal >= 90%). The scripted judge scores by
     what it can see (-5 when the answer says CORRUPTED, -1 per removed module), so this measures the plumbing
     (ablation -> judge -> contribution), not a real judge's ability.
  4. rerun: a run again over its folder (parts skipped) and again with its parts deleted (every call replayed
     from the batch journals): calls the server receives (goal 0 both times).
Writes bench/results/modules.json and prints it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from evolforge.storage import module_sets as store
from evolforge.tasks.core.batch import close_gateways
from evolforge.tasks.modules.batch import assemble, run_modules_batch
from evolforge.tasks.modules.graph import ModuleGraph
from evolforge.testing.scripted_server import ScriptedServer
from evolforge.testing.settings import make_settings

RESULTS = Path(__file__).resolve().parent / "results" / "modules.json"
GOALS = {"forward_over_chain": 1.3, "valid_share": 0.99, "crashed_items": 0, "localisation": 0.90, "rerun_calls": 0}


def settings_for(server, concurrency: int, batch_size: int):
    return make_settings(server.base_url, modules={"batch_size": batch_size, "concurrency": concurrency},
                         gateway={"backoff_base_seconds": 0.0, "timeout_seconds": 30.0, "concurrency": 128})


def _serve(queue, latency: float, module_latency: dict) -> None:
    srv = ScriptedServer(latency=latency, nodelay=True)
    srv.module_latency = module_latency
    queue.put(srv.base_url)
    srv.httpd.serve_forever()


class ServerProcess:
    """The scripted server in its own process: the client's and the server's Python threads do not share one GIL
    (a real endpoint is another process too). Calls are counted from the runs' summaries, not the server."""

    def __init__(self, latency: float, module_latency: dict | None = None):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        queue = ctx.Queue()
        self.proc = ctx.Process(target=_serve, args=(queue, latency, module_latency or {}), daemon=True)
        self.proc.start()
        self.base_url = queue.get(timeout=60)

    def posts(self) -> list:
        raise NotImplementedError("count calls from the summaries")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.join(10)


def run_folder(out: Path, server, n_items: int, concurrency: int, tag: str,
               batch_size: int = 20) -> tuple[list[dict], dict, list[dict]]:
    """n questions through every batch of a fresh folder: (items, summary body, batch stats)."""
    settings = settings_for(server, concurrency, batch_size)
    src = out.parent / f"{out.name}.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"{tag}{i:04d}", "question": f"What is {i} times {i % 7 + 2}?"})
                             for i in range(n_items)) + "\n")
    lay = store.ModulesLayout(out).ensure()
    if not lay.input.exists():
        store.build_input(src, lay.input, batch_size)
    run_id = f"bench-{tag}"
    stats = []
    try:
        for b in range(store.batch_count(lay)):
            try:
                stats.append(run_modules_batch(lay.root, b, settings, server.base_url, run_id))
            except Exception as e:  # noqa: BLE001 - a crashed batch is a result here
                stats.append({"failed": f"{type(e).__name__}: {e}"})
    finally:
        close_gateways(run_id)
    summary = assemble(lay.root, settings)
    return store.read_items(lay.items).to_dicts(), summary, stats


def _cpu() -> float:
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 4)


def timing(items: list[dict], latency: float, chain_calls: int, extra_chain: float = 0.0) -> dict:
    nominal = chain_calls * latency + extra_chain
    fwd = [it["forward_s"] for it in items if it["forward_s"] is not None]
    wall = [it["wall_s"] for it in items if it["wall_s"] is not None]
    return {
        "items": len(items), "nominal_chain_s": round(nominal, 4),
        "forward_s": {"median": round(statistics.median(fwd), 4), "p90": pct(fwd, 0.9), "max": round(max(fwd), 4)},
        "forward_over_chain": {"median": round(statistics.median(fwd) / nominal, 3),
                               "p90": round(pct(fwd, 0.9) / nominal, 3)},
        "measured_chain_s_median": round(statistics.median(it["chain_s"] for it in items), 4),
        "forward_over_measured_chain_median": round(statistics.median(it["forward_s"] / it["chain_s"] for it in items), 3),
        "levels_sum_s_median": round(statistics.median(it["levels_s"] for it in items), 4),
        "wall_s_median": round(statistics.median(wall), 4),
        "wall_over_chain_plus_judge": round(statistics.median(wall) / (nominal + latency), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=40, help="questions per scenario")
    ap.add_argument("--latency", type=float, default=0.05, help="seconds per call")
    ap.add_argument("--fault-rate", type=float, default=0.1, help="share of module replies with a schema fault")
    ap.add_argument("--concurrency", type=int, default=8, help="questions in flight per batch")
    ap.add_argument("--localisation-items", type=int, default=10, help="questions per corrupted module")
    a = ap.parse_args()

    graph = ModuleGraph.from_settings(make_settings().modules)
    out: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
                 "params": {"items": a.items, "latency_s": a.latency, "fault_rate": a.fault_rate,
                            "concurrency": a.concurrency, "modules": list(graph.order),
                            "chain_length": graph.chain_length}}
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-modules-") as tmp:
        root = Path(tmp)
        # 1. scheduling, uniform latency (server in its own process): one question at a time, then --concurrency
        for key, conc in (("scheduling_uniform", 1), ("scheduling_uniform_loaded", a.concurrency)):
            with ServerProcess(a.latency) as srv:
                cpu0 = _cpu()
                items, summary, _ = run_folder(root / key, srv, a.items, conc, key[:3])
                cpu = _cpu() - cpu0
                sent = summary["calls"]["module"] + summary["calls"]["judge"]
                out[key] = {"questions_in_flight": conc, **timing(items, a.latency, graph.chain_length),
                            "calls_sent": sent, "calls_per_item": round(sent / len(items), 2),
                            "judge_calls_per_item": summary["calls"]["judge_per_judged_item"],
                            "client_cpu_ms_per_call": round(1000 * cpu / sent, 2)}
        # 1b. skewed latency: parse and entity +0.25 s, in different dependency levels (one question at a time)
        with ServerProcess(a.latency, {"parse": 0.25, "entity": 0.25}) as srv:
            items, _, _ = run_folder(root / "skewed", srv, a.items, 1, "s")
            t = timing(items, a.latency, graph.chain_length, extra_chain=0.25)
            t["nominal_levels_sum_s"] = round(graph.chain_length * a.latency + 2 * 0.25, 4)
            out["scheduling_skewed"] = {"questions_in_flight": 1, **t}
        # 4. rerun (server in this process, to count what it receives): parts skipped, then parts deleted
        with ScriptedServer(latency=a.latency, nodelay=True) as srv:
            run_folder(root / "rerun", srv, a.items, a.concurrency, "r")
            sent = len(srv.posts())
            run_folder(root / "rerun", srv, a.items, a.concurrency, "r")
            skipped_sent = len(srv.posts()) - sent
            for p in (root / "rerun" / "parts").glob("*.parquet"):
                p.unlink()
            _, _, stats = run_folder(root / "rerun", srv, a.items, a.concurrency, "r")
            out["rerun"] = {"calls_first_run": sent, "calls_sent_parts_kept": skipped_sent,
                            "calls_sent_parts_deleted": len(srv.posts()) - sent - skipped_sent,
                            "replayed_calls_parts_deleted": sum(s.get("replayed_calls", 0) for s in stats)}
        # 2. schema faults
        with ScriptedServer(latency=a.latency, nodelay=True) as srv:
            srv.module_fault_rate = a.fault_rate
            items, summary, stats = run_folder(root / "faults", srv, a.items, a.concurrency, "f")
            mods = [m for it in items for m in it["modules"]]
            out["schema_faults"] = {
                "module_outputs": len(mods), "valid": sum(m["status"] == "ok" for m in mods),
                "valid_share": round(sum(m["status"] == "ok" for m in mods) / len(mods), 4),
                "valid_first_try": sum(m["status"] == "ok" and m["reasks"] == 0 for m in mods),
                "reasked": sum(1 for m in mods if m["reasks"]), "reasks": sum(m["reasks"] for m in mods),
                "invalid_with_reason": sum(1 for m in mods if m["status"] != "ok" and m["reason"]),
                "items_by_status": summary["by_status"],
                "crashed_items": summary["by_status"].get("error", 0) + sum(1 for s in stats if "failed" in s),
                "median_forward_s": round(statistics.median(it["forward_s"] for it in items), 4),
            }
        # 3. error localisation, each non-exit module corrupted in turn (faults on)
        per_module = {}
        for m in graph.non_exit:
            with ScriptedServer(latency=a.latency, nodelay=True) as srv:
                srv.corrupt_module, srv.module_fault_rate = m, a.fault_rate
                items, _, _ = run_folder(root / f"corrupt-{m}", srv, a.localisation_items, a.concurrency, f"c{m}")
            hits = 0
            judged = [it for it in items if it["status"] == "ok"]
            for it in judged:
                contrib = {x["id"]: x["contribution"] for x in it["modules"] if x["contribution"] is not None}
                low = min(contrib.values())
                hits += contrib[m] == low and list(contrib.values()).count(low) == 1
            per_module[m] = {"items": len(items), "judged": len(judged), "lowest": hits}
        total = sum(v["items"] for v in per_module.values())
        out["localisation"] = {"per_module": per_module, "items": total,
                               "share_lowest": round(sum(v["lowest"] for v in per_module.values()) / total, 4)}
    out["seconds"] = round(time.perf_counter() - t_all, 1)
    out["goals"] = {
        "forward_over_chain_median<=1.3": out["scheduling_uniform"]["forward_over_chain"]["median"] <= GOALS["forward_over_chain"],
        "loaded_forward_over_measured_chain_median<=1.3":
            out["scheduling_uniform_loaded"]["forward_over_measured_chain_median"] <= GOALS["forward_over_chain"],
        "valid_share>=0.99": out["schema_faults"]["valid_share"] >= GOALS["valid_share"],
        "crashed_items==0": out["schema_faults"]["crashed_items"] == GOALS["crashed_items"],
        "localisation>=0.90": out["localisation"]["share_lowest"] >= GOALS["localisation"],
        "rerun_calls==0": out["rerun"]["calls_sent_parts_kept"] == 0 and out["rerun"]["calls_sent_parts_deleted"] == 0,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))
    return 0 if all(out["goals"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
