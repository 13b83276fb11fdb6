"""Datasets others can load: dataset cards (README.md with a YAML header) and the SFT view of an evolved dataset.

A dataset folder holds several tables (an evolve run's dataset/: sft, evolved, lineage, final_pool; a synthesis
run: tasks, rejected, cost_per_task; reward data: irm_pairs, irm_groups, prm_steps, prm_rejected; a PPO
run's data/: prompts with a train and a test split; trajectories: transitions, tokens, duplicates, skipped;
module-DAG: items, prm_steps, prm_rejected, comparison). Its card lists each table as its own `configs:` entry
(the Hugging Face Hub and `datasets` read it):

    datasets.load_dataset("runs/x/dataset", "lineage")        # one config, split "train"
    datasets.load_dataset("parquet", data_dir="runs/x/dataset")  # the SFT view: dataset/sft/train.parquet
    datasets.load_dataset("parquet", data_dir="runs/x/syn")      # the main table: data/train-00000-of-00001.parquet

`load_dataset("parquet", data_dir=FOLDER)` ignores the card. It resolves data files by fixed rules, first match
wins (datasets 5.x, datasets/data_files.py `_get_data_files_patterns`): `data/{split}-NNNNN-of-NNNNN.*` files;
else any file (any extension: it would read a model's training_args.bin or a PNG as parquet) under a folder, or
named, with a split keyword (train / training, test / eval, validation / valid / dev / val) followed by one of
"-._ " or a digit; else every file as one table. So a folder with several tables keeps its main table at
MAIN_TABLE, `data/train-00000-of-00001.parquet` (`main_table`): the first rule matches it alone and every other
file is ignored, whatever its name. That holds for the synthesis (tasks), reward (irm_pairs), module-DAG (items)
and trajectories (transitions) folders; an evolve run's dataset/ holds only tables and its SFT view
sft/train.parquet, the PPO data/ train.parquet and test.parquet (both by the second rule). The other tables
load by config name: `datasets` reads the card's configs when given the folder itself.
The header also carries `dataset_info` (each config's features and row count, from the parquet schema by the
rules of `datasets.Features` (storage/hf_features.py), so it always matches the files), `size_categories`, and
an `evolforge:` block with the lineage, generation settings, models and cost the body shows.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import yaml

from evolforge.storage.fs import AnyPath, exists, parquet_file, read_parquet, read_text, write_text_atomic
from evolforge.storage.hf_features import features_yaml

CARD = "README.md"
MAIN_TABLE = ("data", "train-00000-of-00001.parquet")  # what data_dir loads as split "train" (see above)
SIZE_CATEGORIES = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                   (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M")]


def card_path(folder: AnyPath) -> AnyPath:
    return folder / CARD


def main_table(folder: AnyPath) -> AnyPath:
    """FOLDER/data/train-00000-of-00001.parquet: the table `load_dataset("parquet", data_dir=FOLDER)` loads."""
    return folder / MAIN_TABLE[0] / MAIN_TABLE[1]


def _size_category(n: int) -> str:
    return next((label for bound, label in SIZE_CATEGORIES if n < bound), "n>100M")


def _config_info(name: str, splits: dict[str, AnyPath]) -> tuple[dict, dict]:
    """(the table's `dataset_info` entry, its size facts) from the parquet footers of its split files."""
    schema = parquet_file(next(iter(splits.values()))).schema_arrow
    split_infos = []
    for split, path in splits.items():
        meta = parquet_file(path).metadata
        n_bytes = sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        split_infos.append({"name": split, "num_bytes": n_bytes, "num_examples": meta.num_rows})
    n_bytes = sum(s["num_bytes"] for s in split_infos)
    info = {"config_name": name, "features": features_yaml(schema), "splits": split_infos, "dataset_size": n_bytes}
    return info, {"rows": sum(s["num_examples"] for s in split_infos), "bytes": n_bytes, "columns": schema.names,
                  "splits": {s["name"]: s["num_examples"] for s in split_infos}}


def _relative(folder: AnyPath, path: AnyPath) -> str:
    rel = str(path)[len(str(folder)):].lstrip("/")
    if str(path) != f"{str(folder).rstrip('/')}/{rel}":
        raise ValueError(f"{path} is not inside the dataset folder {folder}")
    return rel


def write_dataset_card(folder: AnyPath, tables: dict[str, AnyPath | dict[str, AnyPath]], *, title: str,
                       description: str, sections: dict[str, list[str]], facts: dict,
                       default: str | None = None) -> AnyPath:
    """README.md in `folder`: YAML header (configs, dataset_info, size_categories, `evolforge:` facts) and a body
    with how to load it, one line per table, then `sections` (heading -> markdown lines). `tables` maps config
    name -> parquet file inside `folder` (its split "train"), or -> {split name: parquet file} for a table in
    several splits (PPO prompts: train, test). Files that do not exist or have no rows are left out (a config
    with none left is no config). Parquet only: `datasets` picks one builder for every config of a card (from
    the first config's files), so a card cannot mix parquet and json configs."""
    by_config = {name: (dict(path) if isinstance(path, dict) else {"train": path}) for name, path in tables.items()}
    present: dict[str, dict[str, AnyPath]] = {}
    empty = []
    for name, splits in by_config.items():
        found = {split: path for split, path in splits.items() if exists(path)}
        # a file without rows is no split: `datasets` cannot load an empty parquet file (ArrowInvalid: BatchSize 0)
        rows = {split: path for split, path in found.items() if parquet_file(path).metadata.num_rows > 0}
        if rows:
            present[name] = rows
        elif found:
            empty.append(name)
    default = default if default in present else next(iter(present), None)
    configs, infos, sizes = [], [], {}
    for name, splits in present.items():
        configs.append({"config_name": name,
                        "data_files": [{"split": split, "path": _relative(folder, path)} for split, path in splits.items()],
                        **({"default": True} if name == default else {})})
        info, sizes[name] = _config_info(name, splits)
        infos.append(info)
    header = {"pretty_name": title, "tags": ["evolforge", "synthetic"],
              "size_categories": [_size_category(max((s["rows"] for s in sizes.values()), default=0))],
              "configs": configs, "dataset_info": infos, "evolforge": facts}
    body = [f"# {title}", "", description, "", "## Load it", "", "```python", "from datasets import load_dataset",
            "", f'where = "{folder}"  # this folder, or its Hugging Face Hub repo id once published', ""]
    body += [f'{name} = load_dataset(where, "{name}"' + (', split="train")' if list(splits) == ["train"] else
                                                         ")  # splits: " + ", ".join(splits))
             for name, splits in present.items()]
    body += ["```", "", "## Tables", "", "| config | file | rows | bytes (uncompressed) | columns |",
             "|---|---|---|---|---|"]
    body += [f"| {name} | " + ", ".join(f"`{f['path']}`" + (f" ({f['split']})" if len(c["data_files"]) > 1 else "")
                                        for f in c["data_files"]) +
             f" | {sizes[name]['rows']}" + (" (" + ", ".join(f"{k} {v}" for k, v in sizes[name]["splits"].items()) + ")"
                                            if len(c["data_files"]) > 1 else "") +
             f" | {sizes[name]['bytes']} | {', '.join(sizes[name]['columns'])} |" for name, c in zip(present, configs)]
    if empty:
        body += ["", f"Empty, so not a config: {', '.join(empty)}."]
    for heading, lines in sections.items():
        body += ["", f"## {heading}", "", *lines]
    text = "---\n" + yaml.safe_dump(header, sort_keys=False, allow_unicode=True, width=1000) + "---\n\n" + \
        "\n".join(body) + "\n"
    return write_text_atomic(card_path(folder), text)


def column_counts(path: AnyPath, column: str, sums: tuple[str, ...] = ()) -> list[dict]:
    """Rows of a parquet file grouped by `column` (nulls left out): [{column: value, "rows": n, each of `sums`:
    its total}], most rows first; [] when the file does not exist."""
    if not exists(path):
        return []
    t = read_parquet(path, columns=[column, *sums]).filter(pc.is_valid(pc.field(column)))
    grouped = t.group_by(column).aggregate([(column, "count"), *((s, "sum") for s in sums)])
    rows = [{column: r[column], "rows": r[f"{column}_count"], **{s: r[f"{s}_sum"] or 0 for s in sums}}
            for r in grouped.to_pylist()]
    return sorted(rows, key=lambda r: (-r["rows"], str(r[column])))


def read_card(folder: AnyPath) -> tuple[dict, str] | None:
    """(YAML header, body) of the folder's card, or None when it has none."""
    path = card_path(folder)
    if not exists(path):
        return None
    text = read_text(path)
    if not text.startswith("---\n"):
        return {}, text
    head, _, body = text[4:].partition("\n---\n")
    return yaml.safe_load(head) or {}, body


def card_files(folder: AnyPath) -> list[str]:
    """The files a card names (README.md and each config's data files), relative to the folder: what to publish."""
    card = read_card(folder)
    if card is None:
        return []
    return [CARD] + [f["path"] for c in card[0].get("configs", []) for f in c.get("data_files", [])]


def dataset_folders(out: Path) -> list[Path]:
    """Folders under the local folder `out` (itself, or up to two levels down) with an evolforge dataset card:
    an evolve run's dataset/, a synthesis or reward-data folder, each stage folder of a pipeline."""
    found = []
    for pattern in (CARD, f"*/{CARD}", f"*/*/{CARD}"):
        for path in sorted(out.glob(pattern)):
            card = read_card(path.parent)
            if card and "evolforge" in card[0]:
                found.append(path.parent)
    return found


def card_for_repo(folder: Path, repo: str) -> bytes:
    """The folder's card as published to the Hub repo `repo`: the load example names the repo, not the folder."""
    text = read_text(card_path(folder))
    local = f'where = "{folder}"  # this folder, or its Hugging Face Hub repo id once published'
    return text.replace(local, f'where = "{repo}"  # or a local copy of this folder').encode("utf-8")
