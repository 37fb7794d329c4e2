"""Marks the conformance checks a model test lists in `slow_tests` as slow (a mark on the mixin's
method would mark it for every model)."""
from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(items):
    for item in items:
        if getattr(item, "originalname", None) in getattr(item.cls, "slow_tests", ()):
            item.add_marker(pytest.mark.slow)
