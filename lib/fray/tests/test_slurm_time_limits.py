"""Slurm's time limits as ``sinfo`` prints them, read into seconds: what a step's job gets when it asks for none."""

from __future__ import annotations

import pytest

from fray.cluster.slurm_commands import parse_sinfo, parse_time_limit


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30", 1800), ("30:00", 1800), ("5:30", 330), ("2:00:00", 7200), ("1-00:00:00", 86400), ("1-12", 129600),
     ("1-12:30", 131400), ("2-03:04:05", 2 * 86400 + 3 * 3600 + 4 * 60 + 5), ("infinite", None), ("UNLIMITED", None),
     ("", None), ("n/a", None)],
)
def test_slurm_time_limits_read_as_seconds(text, seconds):
    assert parse_time_limit(text) == seconds


def test_each_partition_keeps_its_own_limit_and_the_default_partition_is_asked_for_none():
    found = parse_sinfo("node1|debug*|4|8000|(null)|infinite\nnode1|short|4|8000|(null)|1:00:00\n")
    assert found.time_limit_s(None) is None and found.time_limit_s("debug") is None
    assert found.time_limit_s("short") == 3600
    assert found.time_limit_s("nosuch") is None
    # Five columns, as before the limit was asked for, still read.
    assert parse_sinfo("node1|debug*|4|8000|(null)\n").nodes[0].cpus == 4
