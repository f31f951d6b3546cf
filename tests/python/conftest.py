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


def pytest_addoption(parser):
    parser.addoption("--runtime-matrix-once", action="store_true",
                     help="run one case of each test marked runtime_matrix (the first), deselect the rest")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "runtime_matrix: a parametrized test whose cases vary only what the C++ runtime and launcher do "
        "(policy, architecture, worker count, launcher, compression on the wire, which worker stops); "
        "--runtime-matrix-once runs its first case only")


def runtime_matrix_once(config, items):
    """scripts/test.sh's second PyTorch (torch 2.x): the cases of a runtime matrix run the
    same Python code under either torch, and the build's torch runs them all; one case each
    here (CI's 30 minutes, docs/ci.md)."""
    seen, kept, dropped = set(), [], []
    for item in items:
        if item.get_closest_marker("runtime_matrix") is None:
            kept.append(item)
            continue
        key = (item.fspath, getattr(item, "originalname", item.name))
        (dropped if key in seen else kept).append(item)
        seen.add(key)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def pytest_collection_modifyitems(config, items):
    if config.getoption("--runtime-matrix-once"):
        runtime_matrix_once(config, items)
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
