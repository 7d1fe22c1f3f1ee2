"""Shared test set-up: Hypothesis profiles.

Profiles (pick with HYPOTHESIS_PROFILE=name):
- ``ci`` (default): 2,000 examples per property, no deadline (CI machines are slow and noisy).
- ``dev``: 200 examples, for a quick local loop.
- ``million``: 1,000,000 examples; used by ``bench/fuzz_million.py`` through ``fuzz_one_input``.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile(
    "million",
    max_examples=1_000_000,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
