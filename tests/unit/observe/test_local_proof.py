"""Every alert says how it is proven on a running fleet, or why it cannot be locally."""

from __future__ import annotations

from fleetserve.observe.alerts import ALERT_LOCAL_PROOF, alert_rules


def test_every_alert_is_proven_live_or_says_why_not() -> None:
    assert set(ALERT_LOCAL_PROOF) == {r.alert for r in alert_rules()}
    for name, (proof, why) in ALERT_LOCAL_PROOF.items():
        assert why.strip(), name
        assert proof in ("fake engine", "real engine", "not locally"), name
