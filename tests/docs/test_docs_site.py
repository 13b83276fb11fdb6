"""The documentation site's generated pages (docs/hooks/evolforge_docs.py), checked without MkDocs: the
configuration reference holds every setting with its description, the command page every command's real `--help`,
the troubleshooting page the error table when there is one, the navigation every page; and, where MkDocs is
installed (the `docs` extra), the whole site builds with --strict."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "docs" / "hooks" / "evolforge_docs.py"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("evolforge_docs_hook", HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fields(model: type[BaseModel], prefix: str):
    for name, field in model.model_fields.items():
        ann = field.annotation
        subs = [a for a in (ann, *typing.get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)]
        if subs:
            yield from _fields(subs[0], f"{prefix}{name}.")
            if ann is subs[0]:
                continue
        yield f"{prefix}{name}", field


def test_the_configuration_reference_holds_every_setting_with_its_description(hook):
    from evolforge.config.settings import Settings

    page, missing = hook.config_reference_markdown()
    sections = {name for name in Settings.model_fields}
    for s in sections:
        assert f"## `[{s}]`" in page, f"section [{s}] missing"
    rows = {line for line in page.splitlines() if line.startswith("| `")}
    absent = []
    for key, field in _fields(Settings, ""):
        name = key.rsplit(".", 1)[-1]
        row = [r for r in rows if r.startswith(f"| `{name}` |")]
        if not row:
            absent.append(key)
        elif field.description and hook._cell(field.description)[:60] not in "".join(row):
            absent.append(f"{key} (description)")
    assert not absent, f"settings missing from the configuration reference: {absent}"
    assert "`EVOLFORGE__GATEWAY__KEY=value`" in page and "`EVOLFORGE__SANDBOX__SERVICE__KEY=value`" in page
    undocumented = [k for k, f in _fields(Settings, "") if not f.description]
    assert sorted(missing) == sorted(undocumented)


def test_the_configuration_reference_shows_the_effective_defaults(hook):
    from evolforge.config.settings import DEFAULT_CONFIG, load_settings

    page, _ = hook.config_reference_markdown()
    rounds = load_settings(DEFAULT_CONFIG, environ={}).evol_instruct.rounds
    assert f"| `rounds` | integer | `{rounds}` |" in page


def test_the_command_page_holds_every_command_and_its_real_help(hook):
    commands = hook.cli_commands()
    from evolforge.tasks.core.stages import stages

    assert {st.cli_name for st in stages()} <= set(commands)
    assert {"status", "costs", "preflight", "serve-model", "deploy", "server", "retry"} <= set(commands)
    page = hook.commands_markdown()
    for c in commands:
        assert f"## evolforge {c}" in page
    exe = Path(sys.executable).parent / "evolforge"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "evolforge.cli"]
    real = subprocess.run([*argv, "costs", "--help"], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COLUMNS="110")).stdout
    assert real.strip() and real.strip() in page


def test_the_troubleshooting_page_without_an_error_table(hook, monkeypatch):
    monkeypatch.setattr(hook, "ERROR_TABLE_MODULE", "evolforge.testing.no_such_error_table")
    page = hook.troubleshooting_markdown("# Troubleshooting\n\nintro")
    assert page.startswith("# Troubleshooting\n\nintro")
    assert "not in this checkout yet" in page


@dataclass
class _Case:
    name: str
    argv: tuple[str, ...]
    message: str
    fix: str


def test_the_troubleshooting_page_renders_the_error_table(hook, monkeypatch):
    module = types.ModuleType("evolforge.testing.fake_error_table")
    module.CASES = [
        _Case("rounds 0", ("evolforge", "run", "--rounds", "0"), "evolforge run: --rounds must be at least 1", "use 1+"),
        {"name": "by colour", "command": "evolforge costs --by colour", "message": "unknown column | colour",
         "fix": "--by stage"},
    ]
    monkeypatch.setitem(sys.modules, "evolforge.testing.fake_error_table", module)
    monkeypatch.setattr(hook, "ERROR_TABLE_MODULE", "evolforge.testing.fake_error_table")
    page = hook.troubleshooting_markdown("# Troubleshooting")
    assert "(2 cases)" in page
    assert "| rounds 0 | `evolforge run --rounds 0` | `evolforge run: --rounds must be at least 1` | use 1+ |" in page
    assert "`unknown column \\| colour`" in page


def test_the_troubleshooting_page_reads_the_real_error_table_when_there_is_one(hook):
    rows = hook.error_table_entries()
    if rows is None:
        pytest.skip("testing/error_table.py is not in this checkout yet")
    assert rows and all(r["message"] or r["command"] for r in rows)


def test_the_nav_picks_up_every_page(hook):
    pages = {"index.md": None, "evolve.md": None, "configuration.md": None, "somebody-new.md": None,
             "reference/index.md": None, "reference/tasks.core.stages.md": None, "ops-notes.md": "Operate",
             "brand-new-section.md": "Cookbook"}
    nav = hook.build_nav(pages)
    flat = {}
    for entry in nav:
        (title, value), = entry.items()
        for p in ([value] if isinstance(value, str) else value):
            flat[p] = title
    assert set(flat) == set(pages)
    assert flat["somebody-new.md"] == "Guides" and flat["ops-notes.md"] == "Operate"
    assert flat["brand-new-section.md"] == "Cookbook" and flat["evolve.md"] == "Stages"
    assert nav[0] == {"Home": "index.md"}
    assert flat["reference/index.md"] == "API reference"


def test_every_docs_page_is_in_the_nav(hook):
    pages = {str(p.relative_to(ROOT / "docs")): hook._front_matter_section(p.read_text())
             for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts and not p.name.endswith(".in.md")}
    nav = hook.build_nav(pages)
    listed = {p for entry in nav for v in entry.values() for p in ([v] if isinstance(v, str) else v)}
    assert set(pages) <= listed


def test_stage_facts_render_for_every_stage(hook):
    from evolforge.tasks.core.stages import stages

    for st in stages():
        md = hook.stage_facts_markdown(st.name)
        assert f"`evolforge {st.cli_name}`" in md
        if st.deployment is not None:
            assert f"`{st.name}/{st.name}`" in md


def test_stage_markers_name_registered_stages(hook):
    from evolforge.tasks.core.stages import stages

    names = {st.name for st in stages()}
    used = {m.group(1) for p in (ROOT / "docs").glob("*.md") for m in hook.STAGE_MARKER.finditer(p.read_text())}
    assert used <= names, f"docs name unknown stages: {used - names}"
    assert names <= used, f"stages without a guide (a page holding <!-- evolforge:stage NAME -->): {names - used}"


def test_the_api_reference_names_modules_that_exist(hook):
    for m in hook.API_MODULES:
        rel = m.removeprefix("evolforge.").replace(".", "/")
        assert (ROOT / f"{rel}.py").exists() or (ROOT / rel / "__init__.py").exists(), m


@pytest.mark.slow  # about 12 s; .ci/run builds the site with --strict after the tests anyway (make docs-build)
def test_the_site_builds_strict(tmp_path):
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent))
    if mkdocs is None:
        pytest.skip("mkdocs is not installed (the `docs` extra; `make docs-build` installs it)")
    res = subprocess.run([mkdocs, "build", "--strict", "--quiet", "--site-dir", str(tmp_path / "site")], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert (tmp_path / "site" / "configuration" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "tasks.core.stages" / "index.html").exists()



def test_every_toml_block_of_the_readme_and_the_guides_is_a_valid_config():
    """A config snippet shown to users loads as settings (unknown keys and wrong types fail, as at run time); a block
    whose first line is `# not evolforge: ...` is another tool's file (e.g. Codex's config.toml) and is skipped."""
    import re
    import tomllib

    from evolforge.config.settings import Settings

    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    blocks = [(p, m.group(1)) for p in pages
              for m in re.finditer(r"^```toml\n(.*?)^```", p.read_text(encoding="utf-8"), re.M | re.S)]
    assert any(p.name == "README.md" for p, _ in blocks), "the README shows a config (the price entry)"
    bad = []
    for page, block in blocks:
        if block.lstrip().startswith("# not evolforge:"):
            continue
        try:
            Settings.model_validate(tomllib.loads(block))
        except Exception as e:  # noqa: BLE001
            bad.append(f"{page.relative_to(ROOT)}: {str(e).splitlines()[0:3]}")
    assert not bad, "\n".join(bad)


def test_the_error_table_is_found_under_another_name(hook, monkeypatch):
    module = types.ModuleType("evolforge.testing.fake_error_table2")
    module.USER_ERROR_CASES = (("evolforge", "ppo", "--local-steps", "-1"),)  # not cases: no message field
    module.SOME_CASES = [{"argv": ["evolforge", "costs", "--by", "colour"], "expected": "unknown --by column",
                          "hint": "use stage, model"}]
    monkeypatch.setitem(sys.modules, "evolforge.testing.fake_error_table2", module)
    monkeypatch.setattr(hook, "ERROR_TABLE_MODULE", "evolforge.testing.fake_error_table2")
    assert hook.error_table_entries() == [{"command": "evolforge costs --by colour", "message": "unknown --by column",
                                          "fix": "use stage, model", "case": ""}]
    module.OTHER = [{"message": "x"}]  # two candidate tables: the module must name its table
    with pytest.raises(ValueError, match="ERROR_TABLE"):
        hook.error_table_entries()


def test_an_error_table_that_renders_itself_is_used_as_it_renders(hook, monkeypatch):
    module = types.ModuleType("evolforge.testing.fake_error_table3")
    module.ROWS = (_Case("rounds 0", ("run", "--rounds", "0"), "--rounds 0: at least 1", "Give 1 or more."),)
    module.troubleshooting_markdown = lambda: "| What you did | says | Fix |\n|---|---|---|\n| own row | x | y |"
    monkeypatch.setitem(sys.modules, "evolforge.testing.fake_error_table3", module)
    monkeypatch.setattr(hook, "ERROR_TABLE_MODULE", "evolforge.testing.fake_error_table3")
    assert hook.error_table_entries()[0]["command"] == "evolforge run --rounds 0"
    page = hook.troubleshooting_markdown("# Troubleshooting")
    assert "| own row | x | y |" in page and "(1 cases)" in page
