"""A parquet schema's `features` as a dataset card's `dataset_info` lists them, without importing `datasets`.

`datasets.Features.from_arrow_schema(schema)._to_yaml_list()` gives the same list, but importing `datasets`
costs a command ~0.8 s of CPU, and every stage writes a card. The types our tables use (strings, integers,
floats, booleans, timestamps, dates, binary, lists, fixed-size lists, structs, dictionaries) are converted
here by the rules of datasets 4/5 (`datasets/features/features.py`: `_arrow_to_datasets_dtype`,
`generate_from_arrow_type`, `Features._to_yaml_list`); any other type, or a schema that carries datasets' own
features in its `huggingface` metadata, goes to `datasets` itself. tests/storage/test_hf_features.py checks
the two agree type by type.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.types as pt


class _Unhandled(Exception):
    pass


def _dtype(t: pa.DataType) -> str:
    """datasets' Value dtype name of a primitive arrow type."""
    if pt.is_null(t):
        return "null"
    if pt.is_boolean(t):
        return "bool"
    if pt.is_integer(t):
        return str(t)  # int8 ... uint64
    if pt.is_float16(t):
        return "float16"
    if pt.is_float32(t):
        return "float32"
    if pt.is_float64(t):
        return "float64"
    if pt.is_timestamp(t):
        return f"timestamp[{t.unit}, tz={t.tz}]" if t.tz else f"timestamp[{t.unit}]"
    if pt.is_time32(t) or pt.is_time64(t) or pt.is_duration(t):
        return str(t)  # time32[ms], time64[us], duration[s]
    if pt.is_date32(t):
        return "date32"
    if pt.is_date64(t):
        return "date64"
    if pt.is_decimal128(t) or pt.is_decimal256(t):
        return str(t)  # decimal128(10, 2)
    if pt.is_binary(t):
        return "binary"
    if pt.is_large_binary(t):
        return "large_binary"
    if pt.is_string(t):
        return "string"
    if pt.is_large_string(t):
        return "large_string"
    raise _Unhandled(str(t))


def _feature(t: pa.DataType):
    """The simplified yaml form of one arrow type: a dtype string, a list of named fields (struct), or a
    one-key dict for a list type (its element's form, plus `length` for a fixed-size list)."""
    if pt.is_dictionary(t):
        return _feature(t.value_type)
    if pt.is_struct(t):
        return [{"name": f.name, **_named(f.type)} for f in t]
    if pt.is_fixed_size_list(t):
        return {"list": _feature(t.value_type), "length": t.list_size}
    if pt.is_list(t):
        return {"list": _feature(t.value_type)}
    if pt.is_large_list(t):
        return {"large_list": _feature(t.value_type)}
    return _dtype(t)


def _named(t: pa.DataType) -> dict:
    """A field's yaml entry without its name: {"dtype": ...}, {"struct": [...]}, {"list": ...}[, "length"]."""
    f = _feature(t)
    if isinstance(f, str):
        return {"dtype": f}
    if isinstance(f, list):
        return {"struct": f}
    return f


def features_yaml(schema: pa.Schema) -> list[dict]:
    """The `features` list of a card's `dataset_info` entry for a parquet schema."""
    if not (schema.metadata and b"huggingface" in schema.metadata):
        try:
            return [{"name": f.name, **_named(f.type)} for f in schema]
        except _Unhandled:
            pass
    from datasets import Features  # a type (or stored features) only datasets knows: ~0.8 s to import

    return Features.from_arrow_schema(schema)._to_yaml_list()
