"""testing/lazy.py: a client library named at a test module's top is imported by the test that uses it, not when
pytest collects the module (pytest asks every module-level name for `_mock_name` and `__wrapped__`)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from evolforge.testing.lazy import lazy_module


@pytest.fixture
def fake_package(tmp_path, monkeypatch):
    (tmp_path / "evolforge_lazy_probe.py").write_text(textwrap.dedent("""
        LOADED = True
        def answer():
            return 42
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "evolforge_lazy_probe", raising=False)
    yield "evolforge_lazy_probe"
    sys.modules.pop("evolforge_lazy_probe", None)


def test_what_collection_asks_does_not_import_the_module(fake_package):
    from _pytest.compat import safe_getattr

    mod = lazy_module(fake_package)
    for name in ("_mock_name", "__wrapped__", "__pytest_wrapped__", "_fixture_function_marker"):
        assert safe_getattr(mod, name, None) is None
    assert fake_package not in sys.modules


def test_a_public_name_imports_the_module_once(fake_package):
    mod = lazy_module(fake_package)
    assert mod.answer() == 42
    assert fake_package in sys.modules
    assert mod.LOADED is True


def test_a_missing_library_skips_the_test_that_uses_it():
    mod = lazy_module("evolforge_no_such_client_library")
    with pytest.raises(pytest.skip.Exception, match="evolforge_no_such_client_library is not installed"):
        mod.Client  # noqa: B018
