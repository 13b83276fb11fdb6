"""The README as a user meets it: short, every command it shows is a real one, every link resolves; and no project
file points at notes outside the repository.

- at most 250 lines;
- every command in its shell code blocks is a `make` target that `make -n` accepts, an `export`, or an `evolforge`
  command whose `--help` exits 0 (the installed command's entry point, in a fresh process) and lists every flag
  the README gives it; the same for every `evolforge ...` shown inline (the stages table); and the installed
  `evolforge` itself answers `--help`;
- the same for every `evolforge ...` the docs pages (docs/*.md) show;
- the stages table names every stage of the registry (tasks/core/stages.py) by its command;
- every relative link and image resolves to a file of the repository, every `#anchor` to a heading.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAX_LINES = 250
SHELL_LANGS = {"bash", "sh", "shell", "console"}


def readme() -> str:
    return README.read_text(encoding="utf-8")


def code_blocks(text: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block."""
    return [(m.group(1).strip().lower(), m.group(2))
            for m in re.finditer(r"^```([^\n]*)\n(.*?)^```", text, re.M | re.S)]


def shell_commands(text: str) -> list[str]:
    """The commands of the shell code blocks: continuation lines joined, comments and prompts dropped."""
    out = []
    for lang, body in code_blocks(text):
        if lang not in SHELL_LANGS:
            continue
        body = re.sub(r"\\\n\s*", " ", body)
        for line in body.splitlines():
            line = line.strip().removeprefix("$ ")
            if not line or line.startswith("#"):
                continue
            out.append(line)
    return out


def inline_evolforge_commands(text: str) -> list[str]:
    """`evolforge ...` in inline code (outside code blocks)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return [m.group(1) for m in re.finditer(r"`((?:\.venv/bin/)?evolforge [^`]+)`", prose)]


def split_command(line: str) -> list[str]:
    line = re.split(r"\s#\s", line, maxsplit=1)[0]  # a trailing comment
    return shlex.split(line)


def evolforge_argv() -> list[str]:
    exe = Path(sys.executable).parent / "evolforge"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "evolforge.cli"]


# Runs in one fresh interpreter: the installed command's own entry point (evolforge.cli:main, what
# [project.scripts] names) with `SUB --help` for each sub-command, its exit status and what it printed.
HELP_SCRIPT = """
import contextlib, io, json, sys
from evolforge.cli import main
out = {}
for sub in json.loads(sys.argv[1]):
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            code = main([sub, "--help"])
        except SystemExit as e:
            code = e.code
    out[sub] = [0 if code is None else code, buf.getvalue()]
print(json.dumps(out))
"""


def helps_of(subs: list[str]) -> dict[str, tuple[int, str]]:
    res = subprocess.run([sys.executable, "-c", HELP_SCRIPT, json.dumps(subs)], capture_output=True, text=True,
                         timeout=300, cwd=ROOT)
    assert res.returncode == 0, res.stderr[-2000:]
    return {k: (v[0], v[1]) for k, v in json.loads(res.stdout.strip().splitlines()[-1]).items()}


def evolforge_uses(lines: list[str]) -> dict[str, set[str]]:
    """sub-command -> the flags the README gives it."""
    uses: dict[str, set[str]] = {}
    for line in lines:
        words = split_command(line)
        assert words and words[0] in ("evolforge", ".venv/bin/evolforge"), line
        rest = [w for w in words[1:] if w not in ("[", "]", "|", "/")]
        sub = next((w for w in rest if not w.startswith("-")), None)
        assert sub is not None, f"no sub-command in {line!r}"
        flags = {re.sub(r"[\[\]]", "", w).split("=")[0] for w in rest if re.sub(r"[\[\]]", "", w).startswith("--")}
        uses.setdefault(sub, set()).update(flags)
    return uses


def test_readme_is_at_most_250_lines():
    n = len(readme().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES}: move the rest into docs/)"


def test_readme_shell_blocks_hold_only_known_commands():
    bad = [c for c in shell_commands(readme())
           if split_command(c)[0] not in ("make", "export", "evolforge", ".venv/bin/evolforge")]
    assert not bad, f"README shell lines that are not make / export / evolforge commands: {bad}"


def test_readme_make_targets_exist():
    make = shutil.which("make")
    if make is None:
        pytest.skip("make is not installed")
    targets = [split_command(c)[1] for c in shell_commands(readme()) if split_command(c)[0] == "make"]
    assert "run" in targets and "test" in targets, "the README shows `make run` and `make test`"
    for t in targets:
        res = subprocess.run([make, "-n", t], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"make -n {t}: {res.stderr[-500:]}"


def test_every_readme_command_is_a_real_cli_command():
    text = readme()
    lines = [c for c in shell_commands(text) if split_command(c)[0] in ("evolforge", ".venv/bin/evolforge")]
    lines += inline_evolforge_commands(text)
    uses = evolforge_uses(lines)
    assert len(uses) >= 10, f"expected the README to show the stage commands, found {sorted(uses)}"
    helps = helps_of(sorted(uses))
    problems = []
    for sub, flags in sorted(uses.items()):
        code, out = helps[sub]
        if code != 0:
            problems.append(f"evolforge {sub} --help exited {code}: {out.strip().splitlines()[-1:]}")
            continue
        missing = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", out))
        if missing:
            problems.append(f"evolforge {sub}: flags not in its --help: {missing}")
    assert not problems, "\n".join(problems)


def test_every_command_in_the_guides_is_a_real_cli_command():
    """Every `evolforge ...` of the docs pages (code blocks and inline) names a command whose --help exits 0 and
    lists the flags the page gives it (an upper-case word such as CMD is a placeholder)."""
    uses: dict[str, dict[str, str]] = {}
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text(encoding="utf-8")
        lines = [c for c in shell_commands(text)
                 if split_command(c)[0] in ("evolforge", ".venv/bin/evolforge")]
        for line in lines + inline_evolforge_commands(text):
            for sub, flags in evolforge_uses([line]).items():
                if not sub.isupper():
                    uses.setdefault(sub, {}).update({f: page.name for f in flags} or {"": page.name})
    helps = helps_of(sorted(uses))
    problems = []
    for sub, flags in sorted(uses.items()):
        code, out = helps[sub]
        if code != 0:
            problems.append(f"evolforge {sub} ({sorted(set(flags.values()))}): --help exited {code}")
            continue
        problems += [f"evolforge {sub} {f} ({page}): not in its --help" for f, page in flags.items()
                     if f and not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", out)]
    assert not problems, "\n".join(problems)


def test_the_installed_command_answers_help():
    res = subprocess.run([*evolforge_argv(), "--help"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 0 and "usage: evolforge" in res.stdout, res.stderr[-1000:]


def test_the_stages_table_names_every_registered_stage():
    from evolforge.tasks.core.stages import stages

    table = "\n".join(line for line in readme().splitlines() if line.startswith("|"))
    missing = [st.cli_name for st in stages() if not re.search(rf"`evolforge {re.escape(st.cli_name)}\b", table)]
    assert not missing, f"stages missing from the README's stages table: {missing}"


def _anchors(text: str) -> set[str]:
    out = set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"^```.*?^```", "", text, flags=re.M | re.S), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_readme_links_and_images_resolve():
    text = re.sub(r"^```.*?^```", "", readme(), flags=re.M | re.S)
    targets = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", text)
    assert targets, "no links found"
    bad = []
    for target in targets:
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        if not path:
            if anchor not in _anchors(readme()):
                bad.append(target)
            continue
        if not (ROOT / path).exists():
            bad.append(target)
    assert not bad, f"README links that do not resolve: {bad}"


FORBIDDEN = ("..".__add__("/shared"), "/work".__add__("/shared"), "GUIDE".__add__(".md"))
SKIP_DIRS = {".git", ".venv", ".venv-verl", "runs", "build", "site", "node_modules", "__pycache__", ".pytest_cache",
             ".prefect", "out", "dist"}


def test_no_project_file_points_outside_the_repository():
    bad = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP_DIRS or part.endswith(".egg-info") for part in rel.parts) or not path.is_file():
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if b"\0" in data[:4096]:
            continue  # binary
        text = data.decode("utf-8", "replace")
        bad += [f"{rel}: {word}" for word in FORBIDDEN if word in text]
    assert not bad, f"project files naming notes outside the repository: {bad}"
