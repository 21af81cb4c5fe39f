"""The soak benchmark's arithmetic (the benchmark itself runs a local cloud for an hour: not a test)."""

from __future__ import annotations

import os

import pytest

from berth_tools.bench.soak_bench import rss_kib, slope_per_hour


def test_slope_per_hour_fits_a_line_and_is_zero_when_flat_or_short() -> None:
    assert slope_per_hour([(0.0, 100.0), (1800.0, 105.0), (3600.0, 110.0)]) == pytest.approx(10.0)
    assert slope_per_hour([(0.0, 7.0), (60.0, 7.0), (120.0, 7.0)]) == 0.0
    assert slope_per_hour([(0.0, 7.0)]) == 0.0
    assert slope_per_hour([(5.0, 1.0), (5.0, 2.0)]) == 0.0  # no spread in time: no slope


def test_rss_of_this_process_and_of_a_gone_one() -> None:
    assert rss_kib(os.getpid()) > 1000
    assert rss_kib(2**22 + 12345) == 0  # above the kernel's pid limit: never a process
