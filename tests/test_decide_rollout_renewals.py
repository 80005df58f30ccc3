"""Certificate renewals in the pure rollout core (`decide/rollout.py`): what counts as a renewal,
the `rollout.renewals` policy, a renewal during a rollout (`renew`: the wave goes on, its bake
not restarted, however many renewals come), and versions renamed by files renewed while
Ballast was down (`rebase`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from control_plane.decide.gates import GateResult
from control_plane.decide.rollout import (
    RolloutError,
    advance,
    reached,
    rebase,
    renew,
    renewal,
    start,
    supersede,
    version_of,
)
from control_plane.desired.model import (
    Desired,
    Listener,
    ListenerTls,
    RolloutPolicy,
    ServedCertificate,
    VirtualHost,
)
from harness.models import example_desired

OLD, NEW, RENEWED, LAST_RENEWED = "a" * 64, "b" * 64, "c" * 64, "d" * 64
POPS = ("ewr", "sjc", "lhr", "fra", "nrt")
WAVES = RolloutPolicy(renewals="waves")
AT_ONCE = RolloutPolicy()  # renewals: immediate, the default
BAKE = AT_ONCE.bake_ms


def cert(name: str, hostnames: tuple[str, ...], issue: int = 1) -> ServedCertificate:
    return ServedCertificate(name, f"https.{name}", hostnames, f"/c/{name}.pem",
                             f"/c/{name}-key.pem", b"chain", b"key",
                             fingerprint=f"{name}-cert-{issue}",
                             key_fingerprint=f"{name}-key-{issue}")


def site(*certs: ServedCertificate, client_ca: bytes | None = None) -> Desired:
    desired = example_desired()
    https = Listener("https", 443, (VirtualHost("all", ("*",), "shop"),),
                     tls=ListenerTls(certs, certs[0].name, client_ca_pem=client_ca))
    return replace(desired, listeners=(*desired.listeners, https))


SHOP = cert("shop", ("shop.example.com",))
MEDIA = cert("media", ("media.example.com",))
BASE = site(SHOP, MEDIA)


@pytest.mark.parametrize(("new", "renewed"), [
    (BASE, ()),  # nothing differs
    (site(cert("shop", ("shop.example.com",), 2), MEDIA), ("https.shop",)),
    (site(cert("shop", ("shop.example.com",), 2), cert("media", ("media.example.com",), 2)),
     ("https.shop", "https.media")),
    # other files with the same certificate names and hostnames: still a renewal
    (site(replace(cert("shop", ("shop.example.com",), 2), cert_file="/n/s.pem"), MEDIA),
     ("https.shop",)),
    # a new hostname, a new certificate, a removed one: changes like any other
    (site(cert("shop", ("shop.example.com", "www.example.com"), 2), MEDIA), ()),
    (site(cert("shop", ("shop.example.com",), 2), MEDIA, cert("img", ("img.example.com",))), ()),
    (site(cert("shop", ("shop.example.com",), 2)), ()),
    # renewed, and something else changed with it (a client CA, the bake): not a renewal
    (site(cert("shop", ("shop.example.com",), 2), MEDIA, client_ca=b"ca"), ()),
    (replace(site(cert("shop", ("shop.example.com",), 2), MEDIA),
             rollout=RolloutPolicy(bake_ms=60_000)), ()),
], ids=["same", "one", "both", "other-files", "hostname-added", "certificate-added",
        "certificate-removed", "client-ca", "with-another-change"])
def test_what_counts_as_a_renewal(new: Desired, renewed: tuple[str, ...]) -> None:
    assert renewal(BASE, replace(new, digest="x", source="elsewhere.yaml")) == renewed


def test_a_version_without_tls_renews_nothing() -> None:
    assert renewal(example_desired(), replace(example_desired(), digest="x")) == ()


def test_the_policy_sends_a_renewal_at_once_or_in_waves() -> None:
    now, events = start(AT_ONCE, OLD, NEW, POPS, POPS, 0, renewed=("https.shop",))
    assert now.phase == "passed" and now.immediate and reached(now) == frozenset(POPS)
    assert [e.kind for e in events] == ["rollout_started", "rollout_passed"]
    assert "rollout.renewals: immediate" in now.reason and "https.shop" in now.reason
    assert events[0].detail is not None and events[0].detail["renewed"] == ["https.shop"]
    waves, events = start(WAVES, OLD, NEW, POPS, POPS, 0, renewed=("https.shop",))
    assert waves.phase == "baking" and reached(waves) == {"ewr"}
    assert [e.kind for e in events] == ["rollout_started", "wave_started"]
    # a change that is not a renewal goes in waves whatever the renewal policy
    change, _ = start(AT_ONCE, OLD, NEW, POPS, POPS, 0)
    assert change.phase == "baking"


@given(st.lists(st.integers(1, BAKE - 1), min_size=1, max_size=12))
def test_renewals_within_a_bake_do_not_restart_the_canary(offsets: list[int]) -> None:
    """However many renewals come, at whatever times within the canary's bake: the rollout is
    the same one, its wave the first, baking since it started; the canary serves the newest
    renewal; the wave passes one bake after it first started."""
    for policy in (WAVES, AT_ONCE):
        rollout, _ = start(policy, OLD, NEW, POPS, POPS, 0)
        for i, at in enumerate(sorted(offsets)):
            to_version, from_version = f"{i:064x}", f"{i + 100:064x}"
            rollout, events = renew(rollout, policy, to_version, from_version, ("https.shop",),
                                    at)
            assert [e.kind for e in events] == ["certificates_renewed"]
            assert (rollout.wave, rollout.phase, rollout.started_ms, rollout.wave_started_ms) \
                == (0, "baking", 0, 0)
            assert version_of(rollout, "ewr") == to_version
            expected = from_version if policy is AT_ONCE else OLD
            assert all(version_of(rollout, pop) == expected for pop in POPS[1:])
        before, _ = advance(rollout, _pass(), BAKE - 1, policy)
        assert before.wave == 0
        after, events = advance(rollout, _pass(), BAKE, policy)
        assert after.wave == 1 and [e.kind for e in events] == ["wave_passed", "wave_started"]


def _pass() -> GateResult:
    return GateResult("pass", ("every node ACKed",))


def test_a_renewal_when_the_last_passed_version_cannot_be_read_again() -> None:
    rollout, _ = start(AT_ONCE, OLD, NEW, POPS, POPS, 0)
    kept, (event,) = renew(rollout, AT_ONCE, RENEWED, None, ("https.shop",), 10)
    assert kept.from_version == OLD and kept.to_version == RENEWED
    assert "keep" in event.rule and "does not read with the renewed files" in event.rule
    same, (event,) = renew(rollout, AT_ONCE, RENEWED, OLD, ("https.shop",), 10)
    assert same.from_version == OLD and "serve none of them" in event.rule
    with pytest.raises(RolloutError):
        renew(replace(rollout, phase="passed"), AT_ONCE, RENEWED, OLD, ("https.shop",), 10)


def test_a_renewal_after_a_rollout_ended_starts_from_the_last_passed_version() -> None:
    rollout, _ = start(WAVES, OLD, NEW, POPS, POPS, 0)
    rolled_back = replace(rollout, phase="rolled_back")
    _, new, events = supersede(rolled_back, AT_ONCE, RENEWED, POPS, POPS, 5,
                                   renewed=("https.shop",))
    assert new.from_version == OLD and new.phase == "passed" and new.immediate
    assert [e.kind for e in events] == ["rollout_started", "rollout_passed"]


def test_files_renewed_while_down_rename_the_versions() -> None:
    rollout, _ = start(WAVES, OLD, NEW, POPS, POPS, 0)
    assert rebase(rollout, {}, 9) is rollout
    renamed = rebase(rollout, {NEW: RENEWED}, 9)
    assert (renamed.from_version, renamed.to_version, renamed.phase) == (OLD, RENEWED, "baking")
    # both versions read the same files now: nothing is left to roll out
    merged = rebase(rollout, {OLD: LAST_RENEWED, NEW: LAST_RENEWED}, 9)
    assert merged.phase == "passed" and merged.to_version == LAST_RENEWED
    assert reached(merged) == frozenset(POPS) and "renewed while Ballast was down" in \
        merged.reason


def test_a_renewal_that_makes_both_versions_one_ends_the_rollout() -> None:
    """A rollout of a renewal (`renewals: waves`) renewed again, the last passed version read
    with the new files being that same version: nothing is left to roll out."""
    rollout, _ = start(AT_ONCE, OLD, NEW, POPS, POPS, 0)
    done, (event,) = renew(rollout, AT_ONCE, RENEWED, RENEWED, ("https.shop",), 10)
    assert done.phase == "passed" and done.to_version == RENEWED == done.from_version
    assert reached(done) == frozenset(POPS) and event.kind == "certificates_renewed"
