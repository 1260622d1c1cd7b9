"""Kill -9 a real dshd at random moments, a few times: nothing acknowledged is lost (issue 3),
and calls outlive the kills (issue 13): half the kills land while a long call has been running
for 10 s, and those calls settle with their real exit codes after the restarts, once each.

The full campaign (≥ 300 kills) is ``make crash-test``; this runs a short one.
"""

from __future__ import annotations

from .campaign import run_campaign


async def test_kill9_campaign_short():
    summary = await run_campaign(8, max_kill_delay=0.8)
    print("\n".join(summary.lines()))
    assert summary.violations == []
    assert summary.kills == 8
    assert summary.calls_acked > 0
    assert summary.long_kills == 4 and summary.long_hit >= 1
    assert summary.long_real == summary.long_hit  # a few calls: every one has its exit code
