"""Every observability test starts with empty label caps (`fresh_label_caps` in
tests/conftest.py): earlier tests in the same process may have used up a cap's values."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _fresh_caps(fresh_label_caps: None) -> None:
    return None
