"""Finds the built package (build/python, or QS_BUILD_DIR/python) and skips the PyTorch
tests where torch or the module is missing."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
BUILD = os.environ.get("QS_BUILD_DIR", os.path.join(ROOT, "build"))
PYDIR = os.path.join(BUILD, "python")
sys.path.insert(0, PYDIR)
sys.path.insert(0, HERE)


def pytest_collection_modifyitems(config, items):
    reason = None
    try:
        import torch  # noqa: F401
    except ImportError:
        reason = "torch is not installed for " + sys.executable
    if reason is None and not os.path.isdir(os.path.join(PYDIR, "quicksilver")):
        reason = "no quicksilver package in " + PYDIR + " (build with QS_WITH_TORCH=ON)"
    if reason:
        for item in items:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def build_dir():
    return BUILD
