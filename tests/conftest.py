"""Fixtures shared by the test modules (helpers that are plain functions live in helpers.py)."""
import pytest


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """A temporary compile cache (POLYFT_CACHE) shared by the tests of one module; a module
    uses it with `pytestmark = pytest.mark.usefixtures("compile_cache")`."""
    d = tmp_path_factory.mktemp("polyft-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("POLYFT_CACHE", str(d))
        yield d


@pytest.fixture
def fresh_fallback(monkeypatch):
    """No fallback compile-cache directory yet in this process; the one a test makes is removed after it."""
    import shutil

    from polyft.emit import runtime_c
    monkeypatch.setattr(runtime_c, "_fallback_dir", None)
    yield
    if runtime_c._fallback_dir is not None:
        shutil.rmtree(runtime_c._fallback_dir, ignore_errors=True)
