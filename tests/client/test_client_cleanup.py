"""``dsh prune``'s duration parser: strict, whole numbers and one unit, nothing guessed."""

import pytest

from client.cli.cleanup import parse_duration


@pytest.mark.parametrize("text, seconds", [
    ("30s", 30), ("15m", 900), ("12h", 43_200), ("7d", 604_800), ("2w", 1_209_600),
    ("0s", 0), (" 7d ", 604_800),
])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", [
    "", "7", "d", "1.5h", "-1d", "7dd", "7 d", "7D", "1e3s", "inf", "nan", "7d2h", "1234567890s",
    "７d",
])
def test_anything_else_is_refused(text):
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)
