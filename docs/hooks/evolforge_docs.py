"""The documentation site's generated pages and navigation (an MkDocs hook: mkdocs.yml `hooks:`).

Generated at every build, from the code, never copied by hand:

    configuration.md    every setting of config/sections/*.py: key, type, default (config/default.toml
                        applied), environment variable, its Field description
    commands.md         the `--help` of every `evolforge` command, as the installed CLI prints it
    troubleshooting.md  the user errors of testing/error_table.py (when that module exists; its ROWS, rendered by
                        its troubleshooting_markdown() when it has one) with their one-line messages and fixes,
                        after the page's hand-written part (docs/troubleshooting.in.md)
    reference/*.md      the API reference: one mkdocstrings page per module of API_MODULES
    benchmarks.md       BENCHMARKS.md of the repository root

A page may hold `<!-- evolforge:stage NAME -->`: it is replaced by that stage's facts from the stage registry
(tasks/core/stages.py): its command, inputs, outputs and deployment.

The navigation is built here, not listed in mkdocs.yml: the pages of NAV below in that order, then every other
page of docs/ (a new docs/*.md appears without editing anything) under "Guides", or under the section its
front matter names (`nav_section: Stages`).

The functions that make the pages are plain (no MkDocs object): tests/test_docs.py calls them.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import re
import sys
import types
import typing
from pathlib import Path
from typing import Any

try:
    from mkdocs.plugins import event_priority
except ImportError:  # the page generators are used without MkDocs too (tests/docs/)
    def event_priority(priority):
        return lambda f: f

log = logging.getLogger("mkdocs.hooks.evolforge")

ROOT = Path(__file__).resolve().parents[2]

# The site's sections and their pages, in order. A page listed here that does not exist is left out; a page that
# exists and is not listed goes to "Guides" (or its front matter's nav_section).
NAV: list[tuple[str, list[str]]] = [
    ("Home", ["index.md"]),
    ("Get started", ["getting-started.md", "endpoints.md", "embedded-model.md", "runs.md"]),
    ("Stages", ["evolve.md", "dedup.md", "synthesis.md", "sandbox.md", "reward.md", "modules.md", "proxy.md",
                "trajectories.md", "sft.md", "ppo.md", "eval.md", "pipeline.md"]),
    ("Operate", ["prefect.md", "nightly-chain.md", "storage.md", "security.md"]),
    ("Guides", []),
    ("Reference", ["commands.md", "configuration.md", "troubleshooting.md", "datasets.md", "architecture.md",
                   "benchmarks.md", "status.md"]),
    ("API reference", []),  # reference/*.md, generated
]

# The modules the API reference documents (mkdocstrings, python handler), in nav order.
API_MODULES = (
    "evolforge.config.settings",
    "evolforge.tasks.core.stages",
    "evolforge.tasks.core.params",
    "evolforge.tasks.core.checks",
    "evolforge.tasks.core.gateway",
    "evolforge.tasks.core.batch",
    "evolforge.tasks.core.pricing",
    "evolforge.storage.folder",
    "evolforge.storage.ledger",
    "evolforge.storage.status",
    "evolforge.tasks.ppo.reward",
    "evolforge.tasks.sandbox.run",
    "evolforge.testing.scripted_server",
)

STAGE_MARKER = re.compile(r"<!--\s*evolforge:stage\s+([\w-]+)\s*-->")


# ---------------------------------------------------------------------------------------------------------------
# configuration.md
# ---------------------------------------------------------------------------------------------------------------

def _cell(text: str) -> str:
    """Text fit for one markdown table cell: one line, pipes escaped, and brackets outside code spans escaped (a
    description's `[a-z]` is text, not a link)."""
    parts = " ".join(str(text).split()).split("`")
    parts = [p if i % 2 else p.replace("[", "\\[").replace("]", "\\]") for i, p in enumerate(parts)]
    return "`".join(parts).replace("|", "\\|")


def _type_name(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (typing.Union, types.UnionType):
        return " or ".join("none" if a is type(None) else _type_name(a) for a in args)
    if origin in (list, tuple, set, frozenset):
        return f"list of {_type_name(args[0])}" if args else "list"
    if origin is dict:
        return f"table of {_type_name(args[1])}" if len(args) == 2 else "table"
    if isinstance(annotation, type):
        return {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}.get(
            annotation.__name__, annotation.__name__)
    return str(annotation).replace("typing.", "")


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "model_dump"):
        value = value.model_dump()
    if isinstance(value, list):
        value = [v.model_dump() if hasattr(v, "model_dump") else v for v in value]
    if isinstance(value, dict):
        value = {k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in value.items()}
    return json.dumps(value, ensure_ascii=False)


def _constraints(field: Any) -> str:
    words = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "max_length": "at most items:",
             "min_length": "at least items:"}
    out = []
    for meta in field.metadata:
        for attr, word in words.items():
            v = getattr(meta, attr, None)
            if v is not None:
                out.append(f"{word} {v}")
    return ", ".join(out)


def _model_of(annotation: Any) -> tuple[type | None, str]:
    """The settings model a field holds, and how: "" (a table), "list" ([[array of tables]]), "dict" (table of
    tables)."""
    from pydantic import BaseModel

    def is_model(a: Any) -> bool:
        return isinstance(a, type) and issubclass(a, BaseModel)

    if is_model(annotation):
        return annotation, ""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple) and args and is_model(args[0]):
        return args[0], "list"
    if origin is dict and len(args) == 2 and is_model(args[1]):
        return args[1], "dict"
    return None, ""


LONG_DEFAULT = 60


def _section_markdown(title: str, model: type, values: Any, env_path: list[str] | None, level: int,
                      missing: list[str]) -> list[str]:
    """One section's table, then the sections it holds. `values`: the effective values of this section (None for
    the fields of an array / table of tables, whose defaults are the model's own)."""
    from pydantic_core import PydanticUndefined

    lines = [f"{'#' * level} `{title}`", ""]
    doc = (model.__doc__ or "").strip()
    if doc and not doc.startswith(model.__name__ + "("):
        lines += [" ".join(doc.split()), ""]
    module = model.__module__.removeprefix("evolforge.").replace(".", "/") + ".py"
    where = f"Defined in `{module}` (`{model.__name__}`)."
    if env_path:
        where += (f" From the environment: `EVOLFORGE__{'__'.join(p.upper() for p in env_path)}__KEY=value` (the key in"
                  " capitals; a value parses as JSON when it can).")
    lines += [where, ""]
    rows, long_defaults, nested = [], [], []
    for name, field in model.model_fields.items():
        sub, how = _model_of(field.annotation)
        key = f"{title.strip('[]')}.{name}"
        if sub is not None and how == "":
            nested.append((f"[{key}]", sub, getattr(values, name, None), env_path and [*env_path, name]))
            continue
        if values is not None:
            default = getattr(values, name)
        elif field.default is not PydanticUndefined:
            default = field.default
        elif field.default_factory is not None:
            default = field.default_factory()
        else:
            default = PydanticUndefined
        if default is PydanticUndefined:
            shown = "required"
        else:
            text = _toml_value(default)
            if len(text) > LONG_DEFAULT:
                long_defaults.append((name, text))
                shown = "see below"
            else:
                shown = f"`{text}`"
        description = field.description or ""
        if not description:
            missing.append(key)
            description = "*(no description in the code yet)*"
        limits = _constraints(field)
        if limits:
            description += f" ({limits})"
        rows.append(f"| `{name}` | {_cell(_type_name(field.annotation))} | {_cell(shown)} | {_cell(description)} |")
        if sub is not None:
            sub_title = f"[[{key}]]" if how == "list" else f'[{key}."NAME"]'
            nested.append((sub_title, sub, None, None))
    if rows:
        lines += ["| key | type | default | description |", "|---|---|---|---|", *rows, ""]
    for name, text in long_defaults:
        lines += [f"Default of `{name}`:", "", "```json", text, "```", ""]
    for sub_title, sub, sub_values, sub_env in nested:
        lines += _section_markdown(sub_title, sub, sub_values, sub_env, min(level + 1, 4), missing)
    return lines


def config_reference_markdown() -> tuple[str, list[str]]:
    """The configuration reference page, and the keys that have no Field description."""
    from evolforge.config.settings import DEFAULT_CONFIG, load_settings

    effective = load_settings(DEFAULT_CONFIG, environ={})
    missing: list[str] = []
    lines = [
        "# Configuration reference",
        "",
        "Generated from the settings' own field descriptions (`config/sections/*.py`) at every build of this site;",
        "the defaults are those a run starts from (`config/default.toml` applied). One typed tree: the root, the",
        "loader and the precedence are in `config/settings.py`.",
        "",
        "Precedence, later wins: the defaults < the TOML file (`--config FILE`, else `config/default.toml`) <",
        "environment variables `EVOLFORGE__SECTION__KEY=value` (values parse as JSON when they can) < the command's",
        "flags and the flow's parameters. An unknown key or a wrong type stops the command before it starts, with",
        "one line naming the key. The API key is never a setting: it is read from `EVOLFORGE_API_KEY`, else",
        "`OPENAI_API_KEY`.",
        "",
        "```toml",
        "# my.toml: evolforge run --config my.toml ...",
        "[gateway]",
        'base_url = "http://gpu-box:8000/v1"',
        "",
        "[models]",
        'default = "Qwen/Qwen2.5-7B-Instruct"',
        "",
        '[pricing.overrides."Qwen/Qwen2.5-7B-Instruct"]',
        "input_per_mtok = 0.10",
        "output_per_mtok = 0.30",
        "```",
        "",
    ]
    for name, field in type(effective).model_fields.items():
        sub, how = _model_of(field.annotation)
        if sub is None or how:
            continue
        lines += _section_markdown(f"[{name}]", sub, getattr(effective, name), [name], 2, missing)
    return "\n".join(lines) + "\n", missing


# ---------------------------------------------------------------------------------------------------------------
# commands.md
# ---------------------------------------------------------------------------------------------------------------

def cli_help(argv: list[str]) -> str:
    """What `evolforge ARGV` prints (for `--help`), produced in this process by the CLI's own parser."""
    from evolforge import cli

    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "110"
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            try:
                cli.main(argv)
            except SystemExit:
                pass
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    return out.getvalue()


def cli_parser():
    """The `evolforge` parser, as the CLI's own main() builds it (caught just before it parses anything)."""
    import argparse

    from evolforge import cli

    class Built(Exception):
        pass

    def catch(self, *args, **kwargs):
        raise Built(self)

    real = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = catch
    try:
        cli.main([])
    except Built as built:
        return built.args[0]
    finally:
        argparse.ArgumentParser.parse_args = real
    raise RuntimeError("evolforge.cli.main built no parser")


def cli_commands() -> dict[str, str]:
    """The `evolforge` sub-commands, in the order the CLI registers them, with their one-line help."""
    import argparse

    sub = next(a for a in cli_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {a.dest: (a.help or "").replace("%%", "%") for a in sub._choices_actions}
    return {name: helps.get(name, "") for name in sub.choices}


def commands_markdown() -> str:
    lines = ["# Commands", "",
             "Generated at every build of this site from the `evolforge` command's own parser: each command's",
             "`--help`, as it prints it. Every command also takes `--debug` (show the traceback of an error).", ""]
    commands = cli_commands()
    lines += ["| command | what it does |", "|---|---|"]
    lines += [f"| [`evolforge {c}`](#evolforge-{c}) | {_cell(summary)} |" for c, summary in commands.items()]
    lines.append("")
    for c in commands:
        lines += [f"## evolforge {c}", "", "```text", cli_help([c, "--help"]).rstrip(), "```", ""]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# troubleshooting.md
# ---------------------------------------------------------------------------------------------------------------

ERROR_TABLE_MODULE = "evolforge.testing.error_table"
_FIELDS = {
    "command": ("command", "cmd", "argv", "args", "invocation", "shell"),
    "message": ("message", "says", "expected_message", "expected", "line", "stderr", "error"),
    "fix": ("fix", "hint", "remedy", "advice"),
    "case": ("symptom", "name", "case", "id", "title", "what"),
}


def _get(entry: Any, names: tuple[str, ...]) -> Any:
    for n in names:
        if isinstance(entry, dict) and n in entry:
            return entry[n]
        if not isinstance(entry, dict) and hasattr(entry, n):
            return getattr(entry, n)
    return None


def _as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        return " ".join(str(v) for v in value)
    if hasattr(value, "pattern"):  # a compiled regular expression
        return value.pattern
    return str(value)


def error_table_entries() -> list[dict[str, str]] | None:
    """The user errors of testing/error_table.py as {case, command, message, fix}; None when the module is not
    there. The table is the module's ROWS / ERROR_TABLE / ERRORS / CASES / TABLE (or what its cases() returns): a
    sequence of dicts, dataclasses or named tuples. A module with its own troubleshooting_markdown() renders the
    page's table itself."""
    try:
        module = importlib.import_module(ERROR_TABLE_MODULE)
    except ModuleNotFoundError as e:
        if e.name and ERROR_TABLE_MODULE.startswith(e.name):
            return None
        raise
    table = None
    for name in ("ROWS", "ERROR_TABLE", "ERRORS", "CASES", "TABLE", "USER_ERRORS"):
        if hasattr(module, name):
            table = getattr(module, name)
            break
    if table is None and callable(getattr(module, "cases", None)):
        table = module.cases()
    if table is None:  # else: the one public module-level sequence whose entries carry a message
        found = [v for k, v in vars(module).items() if not k.startswith("_") and isinstance(v, (list, tuple))
                 and v and all(_get(_as_mapping(e), _FIELDS["message"]) is not None for e in v)]
        if len(found) != 1:
            raise ValueError(f"{ERROR_TABLE_MODULE}: name its table ERROR_TABLE (a sequence of dicts, dataclasses or "
                             "named tuples with command, message and fix fields) for docs/troubleshooting.md")
        table = found[0]
    if isinstance(table, dict):
        table = [dict(v, name=k) if isinstance(v, dict) else v for k, v in table.items()]
    rows = [{k: _as_text(_get(_as_mapping(entry), names)) for k, names in _FIELDS.items()} for entry in table]
    for r in rows:  # an argv without the program name
        if r["command"] and not r["command"].startswith(("evolforge", ".venv/bin/evolforge")):
            r["command"] = "evolforge " + r["command"]
    return rows


def _as_mapping(entry: Any) -> Any:
    if hasattr(entry, "_asdict"):
        return entry._asdict()
    if hasattr(entry, "__dataclass_fields__"):
        return {k: getattr(entry, k) for k in entry.__dataclass_fields__}
    return entry


def troubleshooting_markdown(intro: str) -> str:
    entries = error_table_entries()
    lines = [intro.rstrip(), "", "## User errors, one by one", ""]
    module = sys.modules.get(ERROR_TABLE_MODULE) if entries is not None else None
    own = getattr(module, "troubleshooting_markdown", None)
    if callable(own):  # the table renders itself
        lines += [f"Generated from `testing/error_table.py` ({len(entries)} cases), the table the CLI's error test",
                  "runs: each command prints the one line shown (a piece of it here), with no traceback. `{out}`,",
                  "`{seeds}` and the like stand for your own folders and files.", "", own().rstrip(), ""]
    elif entries is None:
        lines += ["The table of user errors (`testing/error_table.py`) is not in this checkout yet; this section is",
                  "generated from it once it is.", ""]
    else:
        lines += [f"Generated from `testing/error_table.py` ({len(entries)} cases), the table the CLI's error test",
                  "runs: each command exits with status 2 and prints the one line shown, no traceback.", "",
                  "| case | command | what it says | fix |", "|---|---|---|---|"]
        for e in entries:
            command = f"`{_cell(e['command'])}`" if e["command"] else ""
            message = f"`{_cell(e['message'])}`" if e["message"] else ""
            lines.append(f"| {_cell(e['case'])} | {command} | {message} | {_cell(e['fix'])} |")
        lines.append("")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# stage facts, API pages, benchmarks
# ---------------------------------------------------------------------------------------------------------------

def stage_facts_markdown(name: str) -> str:
    """A stage's command, inputs, outputs and deployment, from its descriptor (tasks/core/stages.py)."""
    from evolforge.tasks.core.stages import get

    st = get(name)
    lines = [f"??? abstract \"`evolforge {st.cli_name}`: {_cell(st.help)} (reads, writes, deployment)\"", "",
             f"    From the stage registry (`{st.flow.split(':')[0].removeprefix('evolforge.').replace('.', '/')}.py`"
             f", `tasks/*/stage.py`). Flags: [`evolforge {st.cli_name} --help`](commands.md#evolforge-{st.cli_name}).",
             ""]
    for title, tables in (("Reads", st.inputs), ("Writes", st.outputs)):
        if tables:
            lines += [f"    **{title}**", "", "    | table | file | columns | what |", "    |---|---|---|---|"]
            for t in tables:
                cols = ", ".join(t.columns)
                lines.append(f"    | `{t.name}` | `{_cell(t.path)}` | {_cell(cols)} | {_cell(t.description)} |")
            lines.append("")
    if st.deployment is not None:
        d = st.deployment
        extra = []
        if d.schedule:
            extra.append("on the `[schedule]` cron")
        if d.trigger is not None:
            extra.append(f"chained after `{d.trigger.after}` when `{st.name}` is in `[schedule] chain`")
        if d.concurrency_limit:
            extra.append(f"at most {d.concurrency_limit} run(s) at once")
        lines += [f"    **Deployment** `{st.name}/{st.name}`: {_cell(d.description)}"
                  + (f" ({'; '.join(extra)})" if extra else ""), ""]
    return "\n".join(lines) + "\n"


def api_pages() -> dict[str, str]:
    pages = {"reference/index.md": "\n".join([
        "# API reference", "",
        "Generated by mkdocstrings from the docstrings of the main modules. The layers, lowest first:",
        "config < storage < tasks < flows < cli / deployments (`tests/test_architecture.py` enforces them).", "",
        *[f"- [`{m}`]({m.removeprefix('evolforge.')}.md)" for m in API_MODULES], ""])}
    for m in API_MODULES:
        pages[f"reference/{m.removeprefix('evolforge.')}.md"] = (
            f"# `{m}`\n\n::: {m}\n    options:\n      show_root_heading: false\n      show_source: false\n")
    return pages


def benchmarks_markdown() -> str | None:
    path = ROOT / "BENCHMARKS.md"
    if not path.exists():
        return None
    text = path.read_text(encoding="utf-8")
    # links relative to the repository root do not resolve inside the site: show them as code
    text = re.sub(r"(?<!!)\[([^\]]+)\]\((?!https?://|#)([^)]+)\)", r"\1 (`\2`)", text)
    return text


# ---------------------------------------------------------------------------------------------------------------
# navigation
# ---------------------------------------------------------------------------------------------------------------

def _front_matter_section(text: str) -> str | None:
    if not text.startswith("---"):
        return None
    end = text.find("\n---", 3)
    found = re.search(r"^nav_section:\s*(.+?)\s*$", text[3:end if end > 0 else 0], re.M)
    return found.group(1).strip("'\"") if found else None


def build_nav(pages: dict[str, str | None]) -> list[dict[str, Any]]:
    """The nav: `pages` maps every page's path (relative to docs/) to its front matter section (or None)."""
    listed = {p for _, ps in NAV for p in ps}
    sections: dict[str, list[str]] = {title: [p for p in ps if p in pages] for title, ps in NAV}
    for path in sorted(pages):
        if path in listed or path.startswith("reference/"):
            continue
        wanted = pages[path]
        sections.setdefault(wanted if wanted else "Guides", []).append(path)
    order = {"reference/index.md": -1, **{f"reference/{m.removeprefix('evolforge.')}.md": i
                                          for i, m in enumerate(API_MODULES)}}
    sections["API reference"] = sorted((p for p in pages if p.startswith("reference/")),
                                       key=lambda p: (order.get(p, len(order)), p))
    nav: list[dict[str, Any]] = []
    for title, ps in sections.items():
        if not ps:
            continue
        nav.append({title: ps[0]} if title == "Home" and len(ps) == 1 else {title: ps})
    return nav


# ---------------------------------------------------------------------------------------------------------------
# the MkDocs events
# ---------------------------------------------------------------------------------------------------------------

AUTOREFS_LOGGER = "mkdocs.plugins.mkdocs_autorefs._internal.plugin"


def _docstring_refs_filter(record: logging.LogRecord) -> bool:
    """Docstrings are written for `help()`, not as Markdown: `result[i][j]` in one reads as a reference link that
    autorefs cannot resolve. On the API reference pages that is not a broken link of the site: log it as INFO, so
    `--strict` does not fail on it (every other page's unresolved references stay warnings)."""
    msg = record.getMessage()
    if record.levelno == logging.WARNING and "Could not find cross-reference target" in msg and \
            msg.lstrip().startswith(("reference/", "mkdocs_autorefs: reference/")):
        record.levelno, record.levelname = logging.INFO, "INFO"
    return True


def package_search_path() -> str:
    """A folder holding `evolforge` (a link to the repository root, which *is* the package but is not named so),
    for mkdocstrings' static analysis: griffe finds a package by its folder name, and the editable install maps
    `evolforge` to a folder of another name."""
    import hashlib
    import tempfile

    folder = Path(tempfile.gettempdir()) / f"evolforge-docs-{hashlib.sha256(str(ROOT).encode()).hexdigest()[:12]}"
    link = folder / "evolforge"
    if not (link.is_symlink() and link.resolve() == ROOT):
        folder.mkdir(parents=True, exist_ok=True)
        fresh = folder / f".evolforge-{os.getpid()}"
        fresh.unlink(missing_ok=True)
        fresh.symlink_to(ROOT, target_is_directory=True)
        os.replace(fresh, link)  # atomic: a build running beside this one sees the old link or the new one
    return str(folder)


@event_priority(100)  # before mkdocstrings' own on_config, which creates its handlers from this configuration
def on_config(config):
    logging.getLogger(AUTOREFS_LOGGER).addFilter(_docstring_refs_filter)
    plugin = config.plugins.get("mkdocstrings")
    if plugin is not None:
        python = plugin.config.handlers.setdefault("python", {})
        paths = python.setdefault("paths", [])
        search = package_search_path()
        if search not in paths:
            paths.insert(0, search)
    return config


def on_files(files, config):
    from mkdocs.structure.files import File

    def add(path: str, content: str) -> None:
        known = files.get_file_from_path(path)
        if known is not None:
            files.remove(known)
        files.append(File.generated(config, path, content=content))

    config_md, missing = config_reference_markdown()
    if missing:
        log.info("settings without a Field description: %s", ", ".join(missing))
    add("configuration.md", config_md)
    add("commands.md", commands_markdown())
    intro_file = files.get_file_from_path("troubleshooting.in.md")
    intro = Path(intro_file.abs_src_path).read_text(encoding="utf-8") if intro_file else "# Troubleshooting\n"
    if intro_file is not None:
        files.remove(intro_file)
    add("troubleshooting.md", troubleshooting_markdown(intro))
    for path, content in api_pages().items():
        add(path, content)
    bench = benchmarks_markdown()
    if bench is not None:
        add("benchmarks.md", bench)

    pages: dict[str, str | None] = {}
    for f in files.documentation_pages():
        section = None
        if not f.generated_by and f.abs_src_path:
            section = _front_matter_section(Path(f.abs_src_path).read_text(encoding="utf-8"))
        pages[f.src_uri] = section
    config["nav"] = build_nav(pages)
    return files


def on_page_markdown(markdown, page, config, files):
    return STAGE_MARKER.sub(lambda m: stage_facts_markdown(m.group(1)), markdown)
