"""A card's features, converted without `datasets`, are exactly what `datasets.Features` gives, type by type."""

from __future__ import annotations

import pyarrow as pa
import pytest

from evolforge.storage.hf_features import features_yaml
from evolforge.testing.lazy import lazy_module

datasets = lazy_module("datasets")  # imported by the first test, not by every worker's collection (~1.2 s of CPU)

PRIMITIVES = [pa.null(), pa.bool_(), pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint16(),
              pa.uint32(), pa.uint64(), pa.float16(), pa.float32(), pa.float64(), pa.string(), pa.large_string(),
              pa.binary(), pa.large_binary(), pa.date32(), pa.date64(), pa.timestamp("s"), pa.timestamp("ms"),
              pa.timestamp("us", tz="UTC"), pa.timestamp("ns", tz="Europe/Paris"), pa.time32("s"),
              pa.time32("ms"), pa.time64("us"), pa.time64("ns"), pa.duration("s"), pa.duration("us"),
              pa.decimal128(10, 2), pa.decimal256(40, 5), pa.dictionary(pa.int32(), pa.string())]


def _nested(t: pa.DataType) -> list[pa.DataType]:
    return [pa.list_(t), pa.large_list(t), pa.list_(t, 3), pa.struct([("x", t), ("y", pa.list_(t))]),
            pa.list_(pa.struct([("k", pa.string()), ("v", t)])), pa.list_(pa.list_(t)),
            pa.struct([("inner", pa.struct([("z", t)])), ("n", pa.int64())])]


TYPES = PRIMITIVES + [n for t in (pa.string(), pa.int64(), pa.float32(), pa.bool_()) for n in _nested(t)]


@pytest.mark.parametrize("t", TYPES, ids=str)
def test_same_as_datasets(t):
    schema = pa.schema([("col", t), ("id", pa.string())])
    assert features_yaml(schema) == datasets.Features.from_arrow_schema(schema)._to_yaml_list()


def test_every_table_schema_of_a_card_matches():
    """The schemas our stages write (strings, floats, nullable ints, lists of structs) in one table."""
    schema = pa.schema([("id", pa.large_string()), ("reward", pa.float64()), ("round", pa.int64()),
                        ("steps", pa.list_(pa.struct([("text", pa.string()), ("label", pa.int8())]))),
                        ("meta", pa.struct([("model", pa.string()), ("tokens", pa.list_(pa.int32()))]))])
    assert features_yaml(schema) == datasets.Features.from_arrow_schema(schema)._to_yaml_list()


@pytest.mark.parametrize("t", [pa.map_(pa.string(), pa.int64()), pa.string_view(),
                               pa.dense_union([pa.field("a", pa.int8())])], ids=str)
def test_types_it_does_not_know_go_to_datasets(t):
    """A type outside its table is never guessed: datasets decides (here: the same error datasets raises)."""
    schema = pa.schema([("col", t)])
    try:
        expected = datasets.Features.from_arrow_schema(schema)._to_yaml_list()
    except Exception as e:  # noqa: BLE001 - whatever datasets raises, features_yaml raises too
        with pytest.raises(type(e)):
            features_yaml(schema)
    else:
        assert features_yaml(schema) == expected


def test_stored_huggingface_features_are_used():
    """A table written by `datasets` carries its own features (e.g. a ClassLabel): those win, as in datasets."""
    feats = datasets.Features.from_dict({"label": {"_type": "ClassLabel", "names": ["bad", "good"]},
                                         "t": {"_type": "Value", "dtype": "string"}})
    schema = feats.arrow_schema
    assert b"huggingface" in schema.metadata
    assert features_yaml(schema) == datasets.Features.from_arrow_schema(schema)._to_yaml_list()
    assert features_yaml(schema)[0]["dtype"]["class_label"]["names"] == {"0": "bad", "1": "good"}


def test_no_datasets_import_for_our_types():
    import subprocess
    import sys

    code = ("import sys, pyarrow as pa\nfrom evolforge.storage.hf_features import features_yaml\n"
            "features_yaml(pa.schema([('a', pa.list_(pa.struct([('b', pa.string())])))]))\n"
            "print('datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
