"""Shared fixtures: job configs written to a temporary directory and local
clusters of real processes (ps.testing.LocalCluster)."""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Callable

import pytest

# The package under test: the runfiles' copy under Bazel, else the checkout's.
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import ps  # noqa: E402
import ps.testing  # noqa: E402


def timeout_scale() -> float:
    """How much longer to allow under sanitizers (tests/testing/subprocess.h)."""
    scale = float(os.environ.get("PS_TIMEOUT_SCALE", "1") or 1)
    if os.environ.get("PS_SANITIZER"):
        scale = max(scale, 3.0)
    return scale


@pytest.fixture
def write_config(tmp_path: pathlib.Path) -> Callable[[str, str], str]:
    """write_config(text, name="job.pbtxt") -> path of the config file."""

    def write(text: str, name: str = "job.pbtxt") -> str:
        path = tmp_path / name
        path.write_text(text)
        return str(path)

    return write


@pytest.fixture
def cluster_factory(tmp_path: pathlib.Path):
    """cluster_factory(config_path, **kwargs) -> a started LocalCluster,
    killed at the end of the test."""
    started = []

    def make(config: str, **kwargs) -> ps.testing.LocalCluster:
        kwargs.setdefault("dir", str(tmp_path / f"cluster{len(started)}"))
        c = ps.testing.LocalCluster(config, **kwargs)
        started.append(c)
        return c

    yield make
    for c in started:
        c.close()
