"""Kill -9 a real dshd at random moments, a few times: nothing acknowledged is lost (issue 3).

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
