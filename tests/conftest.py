"""Fixtures and settings for every test folder; the helpers the tests share are in tests/support/."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run, so CI cannot fail on a draw that
# no earlier run saw; a property that breaks still breaks on every run.
settings.register_profile("kvaudit", derandomize=True)
settings.load_profile("kvaudit")


@pytest.fixture
def trace_dir(tmp_path: Path) -> Path:
    path = tmp_path / "traces"
    path.mkdir()
    return path
