"""What a test needs from the machine, and what happens when it is missing.

Outside CI a missing tool or OS feature skips the test with the reason; under ``CI=true`` it fails
it: CI installs every tool the suite drives, so a skip there would count a test that never ran.
"""

from __future__ import annotations

import os

import pytest

IN_CI = os.environ.get("CI", "").lower() == "true"


def skip_or_fail(reason: str) -> None:
    """Skip with ``reason`` (outside CI) or fail with it (under ``CI=true``)."""
    if IN_CI:
        pytest.fail(f"{reason}; under CI=true this is a failure, not a skip")
    pytest.skip(reason)
