"""The stage registry end to end with a stage of the test's own (tests/fixtures/dry_stage: its two files plus
one `register` line): the CLI builds its command and flags from the stage's Params, bad flags and inputs are one
line and exit 2, the flow runs on the stage runner (one Prefect task per batch), the folder gets its stage.json
marker, and `evolforge status` reads the kind from the marker and the batches from the folder's BatchedSet."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from evolforge.cli import main
from evolforge.cli.status import stage_status
from evolforge.storage.folder import read_marker
from evolforge.storage.parts import read_part
from evolforge.tasks.core import stages

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "dry_stage"  # tests/fixtures/dry_stage


@pytest.fixture
def dry_stage():
    spec = importlib.util.spec_from_file_location("dry_stage_fixture", FIXTURE / "__init__.py",
                                                  submodule_search_locations=[str(FIXTURE)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules["dry_stage_fixture"] = pkg
    spec.loader.exec_module(pkg)
    from dry_stage_fixture.stage import STAGE

    stages.register(STAGE)  # the one registry line
    try:
        yield STAGE
    finally:
        stages.unregister(STAGE.name)
        for name in [m for m in sys.modules if m.startswith("dry_stage_fixture")]:
            del sys.modules[name]


def test_registered_stage_gets_its_command_with_flags_from_its_params(dry_stage, capsys):
    with pytest.raises(SystemExit):
        main(["dry-run", "--help"])
    help_text = capsys.readouterr().out
    for flag in ("--input", "--out", "--batch-size", "--case {upper,lower}", "--keep-blank", "--config"):
        assert flag in help_text, help_text
    assert "Lines per batch." in help_text  # the field's description is the help
    assert "--overrides" not in help_text


def test_bad_flags_and_inputs_are_one_line_and_exit_2(dry_stage, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("a\nb\n")
    assert main(["dry-run", "--input", str(src), "--out", str(tmp_path / "o"), "--batch-size", "0"]) == 2
    err = capsys.readouterr().err
    assert "--batch-size" in err and "greater than or equal to 1" in err and "Traceback" not in err
    assert main(["dry-run", "--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 2
    assert "input file not found" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # nothing created before the checks pass
    with pytest.raises(SystemExit):
        main(["dry-run", "--input", str(src), "--out", str(tmp_path / "o"), "--case", "title"])


@pytest.mark.usefixtures("prefect_harness")
def test_dry_stage_runs_marks_its_folder_and_status_reads_it(dry_stage, tmp_path, capsys):
    src = tmp_path / "in.txt"
    src.write_text("Alpha\nBeta\n\nGamma\nDelta\nEpsilon\n")
    out = tmp_path / "out"
    assert main(["dry-run", "--input", str(src), "--out", str(out), "--case", "lower"]) == 0
    printed = capsys.readouterr().out
    assert "{\n" not in printed  # the terminal shows progress and a short summary, not the summary JSON
    result = json.loads((out / "summary.json").read_text())  # the whole summary goes to its file
    assert result["lines"] == 5
    lines = [r["line"] for b in range(3) for r in read_part(out / "parts" / f"batch_{b:05d}.parquet").to_pylist()]
    assert lines == ["alpha", "beta", "gamma", "delta", "epsilon"]
    marker = read_marker(out)
    assert marker["kind"] == "dry-run" and marker["counts"] == {"lines": 5} and marker["finished_at"]
    st = stage_status(out)
    assert st["kind"] == "dry-run" and st["finished"] is True
    assert [(u["unit"], u["batches"], u["done"], u["records"]) for u in st["units"]] == [("lines", 3, 3, 5)]
    # another stage over the same folder is refused, naming the stage that owns it
    from evolforge.storage.folder import FolderOfAnotherStage, StageFolder

    with pytest.raises(FolderOfAnotherStage, match="dry-run"):
        StageFolder(out).start_marker("synthesize")


def _stage_names_after_importing(first: str) -> list[str]:
    import subprocess

    code = (f"import importlib; importlib.import_module({first!r})\n"
            "from evolforge.tasks.core.stages import stages\nprint(' '.join(s.name for s in stages()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_stage_order_is_the_packages_order_whatever_was_imported_first():
    """The CLI's command list, prefect.yaml and the preflight report follow stages(): importing one stage's
    module before the others (a flow file, a test) must not reorder them."""
    from evolforge.tasks import STAGE_PACKAGES

    plain = _stage_names_after_importing("evolforge.tasks.core.stages")
    assert _stage_names_after_importing("evolforge.tasks.ppo.stage") == plain
    assert _stage_names_after_importing("evolforge.tasks.trajectories.stage") == plain
    assert plain[0] == "evolve" and plain[-1] == "pipeline" and len(plain) >= len(STAGE_PACKAGES), plain
