"""A module imported when a test first uses it, not when pytest collects the test module.

    anthropic = lazy_module("anthropic")      # at a test module's top
    client = anthropic.Anthropic(...)         # the import happens here, in the test that needs it

Every test worker collects every test module, so a module-level `import anthropic` (about 3.5 s of CPU) or
`import openai` (about 1 s) is paid by each worker whether or not it runs those tests. A client library that is
not installed skips the test that uses it, with the reason.
"""

from __future__ import annotations

import importlib
import types


class _LazyModule(types.ModuleType):
    def __init__(self, name: str):
        super().__init__(name)
        self.__dict__["_lazy_real"] = None

    def _load(self):
        real = self.__dict__["_lazy_real"]
        if real is None:
            try:
                real = importlib.import_module(self.__name__)
            except ImportError as e:
                import pytest

                pytest.skip(f"{self.__name__} is not installed ({e})")
            self.__dict__["_lazy_real"] = real
        return real

    def __getattr__(self, attr: str):
        if attr.startswith("_"):
            # what pytest asks of every name of a test module when it collects fixtures (`_mock_name`, `__wrapped__`,
            # ...), and inspect and copy of any object: answered without importing the module. Tests use the
            # client libraries' public names only.
            raise AttributeError(attr)
        return getattr(self._load(), attr)


def lazy_module(name: str) -> types.ModuleType:
    """`name`, imported on its first attribute access."""
    return _LazyModule(name)


def needs(*modules: str):
    """A skip mark for tests that need `modules` installed, looked up without importing them (a module-level
    `pytest.importorskip` imports the package in every worker's collection)."""
    import pytest

    from evolforge.tasks.core.extras import installed

    missing = [m for m in modules if not installed(m)]
    return pytest.mark.skipif(bool(missing), reason=f"not installed: {', '.join(missing)}")
