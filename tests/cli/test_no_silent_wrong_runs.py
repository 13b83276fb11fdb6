"""No silent wrong runs: an empty --out is refused; OPENAI_BASE_URL is the endpoint when no flag, config file or
EVOLFORGE__ variable names one, and a run's first line names the endpoint and model it uses; the config file is
validated before flags override it; a seed file with a UTF-8 byte-order mark is read. (The one-line user errors
are rows of testing/error_table.py: out-empty, config-is-a-folder, config-wrong-type-under-a-flag,
seed-file-is-a-folder, out-in-use.)"""

from __future__ import annotations

import json
import os

import pytest

from evolforge.cli import main
from evolforge.config.settings import ConfigError, load_settings
from evolforge.storage.inputs import first_usable_row, folder_problem, iter_rows
from evolforge.testing.scripted_server import ScriptedServer


@pytest.fixture
def seeds(tmp_path):
    path = tmp_path / "seeds.jsonl"
    path.write_text("".join(json.dumps({"id": f"s{i}", "instruction": f"Add {i} and {i + 3}, then explain."}) + "\n"
                            for i in range(3)))
    return path


def test_an_empty_out_is_refused_and_nothing_is_written_in_the_current_folder(tmp_path, seeds, capsys, monkeypatch):
    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    assert main(["run", "--seeds", str(seeds), "--out", ""]) == 2
    err = capsys.readouterr().err
    assert "--out is empty" in err and len(err.strip().splitlines()) == 1, err
    assert list(work.iterdir()) == []
    assert "empty" in folder_problem("")  # a flow started without the CLI is refused by its check too


def test_openai_base_url_comes_after_the_flag_and_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://env.example/v1")
    assert load_settings().gateway.base_url == "http://env.example/v1"
    config = tmp_path / "c.toml"
    config.write_text('[gateway]\nbase_url = "http://file.example/v1"\n')
    assert load_settings(config).gateway.base_url == "http://file.example/v1"
    assert load_settings(None, {"gateway": {"base_url": "http://flag.example/v1"}}).gateway.base_url == \
        "http://flag.example/v1"
    monkeypatch.setenv("EVOLFORGE__GATEWAY__BASE_URL", "http://var.example/v1")
    assert load_settings().gateway.base_url == "http://var.example/v1"


def test_the_first_line_names_the_endpoint_the_model_and_where_the_endpoint_came_from(monkeypatch):
    from evolforge.cli.common import endpoint_line
    from evolforge.tasks.evolve.stage import EvolveParams

    monkeypatch.setenv("OPENAI_BASE_URL", "http://env.example/v1")
    assert endpoint_line("run", EvolveParams(model="m1")) == \
        "evolforge run: endpoint http://env.example/v1 (from OPENAI_BASE_URL), model m1"
    assert endpoint_line("run", EvolveParams(base_url="http://flag.example/v1", model="m1")) == \
        "evolforge run: endpoint http://flag.example/v1 (from --base-url), model m1"
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert endpoint_line("run", EvolveParams()).startswith("evolforge run: endpoint the embedded model ")


def test_rejected_input_rows_are_counted_with_their_file(tmp_path):
    from evolforge.cli.common import rejected_rows

    assert rejected_rows(str(tmp_path)) is None
    (tmp_path / "rejects.jsonl").write_text('{"line": 3}\n{"line": 9}\n')
    assert rejected_rows(str(tmp_path)) == \
        f"2 input rows rejected (not used; line and reason in {tmp_path / 'rejects.jsonl'})"


@pytest.mark.usefixtures("prefect_harness")
@pytest.mark.long("a whole run through the command (its parts: the two quick tests above)")
def test_a_run_uses_openai_base_url_and_says_so_on_its_first_line(tmp_path, seeds, capsys, monkeypatch):
    """...and the seed rows it could not use are counted on the terminal, with the file that lists them."""
    out = tmp_path / "out"
    with seeds.open("a") as fh:
        fh.write("not json\n" + json.dumps({"id": "x", "instruction": ""}) + "\n")
    with ScriptedServer() as srv:
        monkeypatch.setenv("OPENAI_BASE_URL", srv.base_url)
        code = main(["run", "--seeds", str(seeds), "--out", str(out), "--rounds", "1", "--model", "scripted"])
        captured = capsys.readouterr()
        assert code == 0, captured.err[-3000:]
        assert srv.posts()  # the endpoint named, not the embedded model
    first = captured.out.splitlines()[0]
    assert first == f"evolforge run: endpoint {srv.base_url} (from OPENAI_BASE_URL), model scripted", first
    assert f"2 input rows rejected (not used; line and reason in {out / 'rejects.jsonl'})" in captured.out


def test_the_config_file_is_validated_before_a_flag_overrides_it(tmp_path):
    config = tmp_path / "c.toml"
    config.write_text('[evol_instruct]\nrounds = "three"\n[gateway]\nbase_url = 5\n')
    with pytest.raises(ConfigError) as e:
        load_settings(config, {"evol_instruct": {"rounds": 2}, "gateway": {"base_url": "http://x/v1"}},
                      flags={"evol_instruct.rounds": "--rounds", "gateway.base_url": "--base-url"})
    assert f"gateway.base_url: Input should be a valid string (got 5, from {config})" in str(e.value)
    assert "evol_instruct.rounds: Input should be a valid integer" in str(e.value) and "'three'" in str(e.value)


def test_byte_order_marks_are_read(tmp_path):
    seeds = tmp_path / "bom.jsonl"
    seeds.write_bytes(b"\xef\xbb\xbf" + json.dumps({"id": "a", "instruction": "Add 2 and 3."}).encode() + b"\n")
    assert first_usable_row(seeds, "instruction")["id"] == "a"
    csv = tmp_path / "bom.csv"
    csv.write_bytes(b"\xef\xbb\xbfid,instruction\nb,Add 1 and 1.\n")
    assert [row for _, row, _ in iter_rows(csv)] == [{"id": "b", "instruction": "Add 1 and 1."}]
    config = tmp_path / "bom.toml"
    config.write_bytes(b"\xef\xbb\xbf[evol_instruct]\nrounds = 2\n")
    assert load_settings(config).evol_instruct.rounds == 2
    assert os.path.getsize(config) > 0


def test_nightly_takes_a_folder_that_is_not_a_dataset_only_with_new(tmp_path, seeds):
    from evolforge.tasks.core.checks import InputError
    from evolforge.tasks.core.stages import get

    stage = get("nightly")
    with ScriptedServer() as srv:
        common = dict(seeds=str(seeds), base_url=srv.base_url, model="scripted")
        typo = stage.params(dataset=str(tmp_path / "nighlty"), new=False, **common)  # as the command gives it
        with pytest.raises(InputError, match="is not a nightly dataset .* pass --new"):
            stage.check(typo, typo.settings())
        assert not (tmp_path / "nighlty").exists()
        for ok in (typo.model_copy(update={"new": True}), typo.model_copy(update={"new": None})):  # --new; a flow
            stage.check(ok, ok.settings())
        (tmp_path / "ds").mkdir()
        (tmp_path / "ds" / "stage.json").write_text(json.dumps({"kind": "nightly", "version": 1}))
        existing = typo.model_copy(update={"dataset": str(tmp_path / "ds")})
        stage.check(existing, existing.settings())


def test_a_folder_given_as_an_optional_input_file_says_so(tmp_path):
    from evolforge.tasks.core.checks import InputError, check_file

    with pytest.raises(InputError, match="is a folder: give the file inside it"):
        check_file(str(tmp_path), "--tasks")
    with pytest.raises(InputError, match="not found"):
        check_file(str(tmp_path / "nope.parquet"), "--tasks")
