"""The per-snapshot index of the ADS core (`control_plane/ads/index.py`): built once per
snapshot and shared by every stream, and equal to computing everything per stream.

The oracle for the protocol properties is `harness/protocol_baseline.py`, a verbatim copy of the
protocol core before the index (it copies, sorts and hashes per stream): fed the same requests
and snapshots, both must produce the same responses and events.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

from envoy.config.cluster.v3.cluster_pb2 import Cluster
from envoy.config.endpoint.v3.endpoint_pb2 import ClusterLoadAssignment
from envoy.config.listener.v3.listener_pb2 import Listener
from envoy.config.route.v3.route_pb2 import RouteConfiguration
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from control_plane.ads import index as index_module
from control_plane.ads.delta import DeltaStream
from control_plane.ads.index import EMPTY, ResourceSet, index, items_version
from control_plane.ads.protocol import Ack, ProtocolError
from control_plane.ads.sotw import SotwStream
from control_plane.translate.resources import (
    CLUSTER_TYPE as CDS,
)
from control_plane.translate.resources import (
    ENDPOINT_TYPE as EDS,
)
from control_plane.translate.resources import (
    LISTENER_TYPE as LDS,
)
from control_plane.translate.resources import (
    ROUTE_TYPE as RDS,
)
from control_plane.translate.resources import (
    Capabilities,
    PopResources,
    Resource,
)
from harness import protocol_baseline as baseline
from tests.support.ads_requests import delta_request, sotw_request

CLUSTERS = ("a", "b", "c", "d", "e")
LISTENERS = ("l1", "l2")
TYPES = (CDS, EDS, LDS, RDS)


def make(type_url: str, name: str, variant: int) -> Resource:
    if type_url == CDS:
        return Resource.of(CDS, name, Cluster(name=name, connect_timeout={"seconds": variant}))
    if type_url == EDS:
        cla = ClusterLoadAssignment(cluster_name=name)
        cla.endpoints.add().load_balancing_weight.value = variant + 1
        return Resource.of(EDS, name, cla)
    if type_url == LDS:
        return Resource.of(LDS, name, Listener(name=name, stat_prefix=str(variant)))
    return Resource.of(RDS, name, RouteConfiguration(name=name, max_direct_response_body_size_bytes={"value": variant + 1}))  # noqa: E501


def snapshot(spec: dict[str, dict[str, int]]) -> PopResources:
    """spec: type -> name -> variant (its content; equal variant, equal version)."""
    by_type = {t: {n: make(t, n, v) for n, v in items.items()} for t, items in spec.items()}
    return PopResources("ewr", Capabilities(), by_type)


def plain_snapshot(clusters: dict[str, int], listeners: tuple[str, ...] = ("l1",)) -> PopResources:
    return snapshot({
        CDS: clusters, EDS: dict.fromkeys(clusters, 0),
        LDS: dict.fromkeys(listeners, 0), RDS: dict.fromkeys(listeners, 0),
    })


def synced_streams(served: PopResources) -> list[SotwStream | DeltaStream]:
    """A SotW and a delta stream that subscribed to every type of `served` and ACKed it."""
    streams: list[SotwStream | DeltaStream] = [SotwStream(), DeltaStream()]
    for stream in streams:
        for type_url, names in ((CDS, ()), (EDS, CLUSTERS), (LDS, ()), (RDS, ("l1",))):
            if isinstance(stream, SotwStream):
                (r,) = stream.on_request(sotw_request(type_url, names), served).responses
                stream.on_request(sotw_request(type_url, names, r.nonce), served)
            else:
                (r,) = stream.on_request(delta_request(type_url, names), served).responses
                stream.on_request(delta_request(type_url, nonce=r.nonce), served)
    return streams


# -- building blocks --------------------------------------------------------------------------


def test_index_is_built_once_per_snapshot_and_views_are_shared() -> None:
    s = plain_snapshot(dict.fromkeys(CLUSTERS, 1))
    assert index(s, CDS) is index(s, CDS)
    assert index(s, CDS) is not index(plain_snapshot(dict.fromkeys(CLUSTERS, 1)), CDS)
    idx = index(s, EDS)
    # equal subscriptions (different set objects) get the same view
    assert idx.view(False, frozenset({"a", "b"})) is idx.view(False, frozenset(["b", "a"]))
    assert idx.view(True, frozenset()) is idx.view(True, frozenset({"x"}))
    whole = idx.view(True, frozenset())
    assert whole.version == s.type_version(EDS) == items_version(
        {n: r.version for n, r in s.of_type(EDS).items()}
    )
    assert s.type_version(EDS) is s.type_version(EDS)  # kept with the snapshot


def test_many_streams_share_views_and_hash_each_set_once(monkeypatch: Any) -> None:
    calls: list[int] = []
    real = index_module.items_version

    def counting(items: Any) -> str:
        calls.append(len(items))
        return real(items)

    monkeypatch.setattr(index_module, "items_version", counting)
    first, second = plain_snapshot(dict.fromkeys(CLUSTERS, 1)), plain_snapshot(
        {**dict.fromkeys(CLUSTERS, 1), "a": 2}
    )
    sotw = [SotwStream() for _ in range(40)]
    delta = [DeltaStream() for _ in range(40)]
    for stream in sotw:
        for type_url, names in ((CDS, ()), (EDS, CLUSTERS), (LDS, ()), (RDS, ("l1",))):
            (response,) = stream.on_request(sotw_request(type_url, names), first).responses
            stream.on_request(sotw_request(type_url, names, response.nonce), first)
    for stream in delta:
        for type_url, names in ((CDS, ()), (EDS, CLUSTERS), (LDS, ()), (RDS, ("l1",))):
            (response,) = stream.on_request(delta_request(type_url, names), first).responses
            stream.on_request(delta_request(type_url, nonce=response.nonce), first)
    connected = len(calls)
    assert connected <= 8  # one version per (type, subscription), not per stream
    sotw_steps = [stream.on_resources(second) for stream in sotw]
    delta_steps = [stream.on_resources(second) for stream in delta]
    assert len(calls) - connected <= 8
    # every stream's response holds the very same tuple of resources
    cds = {id(step.responses[0].resources) for step in sotw_steps}
    assert len(cds) == 1
    assert len({id(step.responses[0].resources) for step in delta_steps}) == 1
    # ACKs re-hash nothing
    before = len(calls)
    for stream, step in zip(sotw, sotw_steps, strict=True):
        for r in step.responses:
            names = CLUSTERS if r.type_url == EDS else ()
            assert stream.on_request(sotw_request(r.type_url, names, r.nonce), second).events
    for stream, step in zip(delta, delta_steps, strict=True):
        for r in step.responses:
            events = stream.on_request(delta_request(r.type_url, nonce=r.nonce), second).events
            assert events == [Ack(r.type_url, r.version, r.nonce)]
    assert len(calls) == before


def test_a_snapshot_warmed_like_the_one_served_is_pushed_without_computing(
        monkeypatch: Any) -> None:
    """`warm_like(new, old)` (the output cache's prepare, on a worker thread) computes what the
    push of `new` to streams holding `old` asks: the push then hashes and diffs nothing, and
    sends what the push of an unwarmed equal snapshot sends."""
    computed: list[str] = []
    real_version, real_diff = index_module.items_version, index_module.Diff

    def counting_version(items: Any) -> str:
        computed.append("version")
        return real_version(items)

    class CountingDiff(real_diff):  # type: ignore[misc,valid-type]
        def __init__(self, old: ResourceSet, new: ResourceSet) -> None:
            computed.append("diff")
            super().__init__(old, new)

    monkeypatch.setattr(index_module, "items_version", counting_version)
    monkeypatch.setattr(index_module, "Diff", CountingDiff)
    first = plain_snapshot(dict.fromkeys(CLUSTERS, 1), ("l1", "l2"))
    later = {**dict.fromkeys(CLUSTERS[1:], 1), "a": 2, "f": 1}  # a changed, f added, e kept
    warm, cold = plain_snapshot(later), plain_snapshot(later)  # l2 gone from both
    streams = {kind: synced_streams(first) for kind in ("warm", "cold")}
    index_module.warm_like(warm, first)
    computed.clear()
    warm_steps = [stream.on_resources(warm) for stream in streams["warm"]]
    assert computed == []  # no hash, no diff: looked up
    cold_steps = [stream.on_resources(cold) for stream in streams["cold"]]
    assert "diff" in computed and "version" in computed  # what the warming spared

    def sent(step: Any) -> list[tuple[Any, ...]]:
        return [(r.type_url, r.version, [(x.name, x.version) for x in r.resources],
                 getattr(r, "removed", ())) for r in step.responses]

    assert [sent(s) for s in warm_steps] == [sent(s) for s in cold_steps]
    assert all(step.responses for step in warm_steps)


def test_diffs_are_kept_per_pair_and_weakly() -> None:
    old = ResourceSet.of([make(CDS, "a", 1), make(CDS, "b", 1)])
    new = index(plain_snapshot({"a": 2, "c": 1}), CDS).view(True, frozenset())
    diff = new.diff_from(old)
    assert new.diff_from(old) is diff
    assert [r.name for r in diff.changed] == ["a", "c"] and diff.gone == ("b",)
    assert diff.removed == ("b",)  # wildcard view: everything gone is announced
    del diff, old
    gc.collect()
    assert len(new._diffs) == 0  # the old set went away: so did its diff


def test_a_warmed_snapshot_keeps_no_earlier_one_alive() -> None:
    """`warm_like` asks each diff every `after` (updates and/or removals). A diff that cached
    `old` (no removals) kept the weak key of its entry alive, and through that set's own diffs
    every earlier snapshot's views: each reload kept the last one's resources (the soak,
    docs/benchmarks.md §7). One that cached `new` made a cycle, never freed once the heap is
    frozen (`app/heap.py`). So with the collector off, reference counting alone must free them."""
    gc.collect()
    gc.disable()
    try:
        served = plain_snapshot(dict.fromkeys(CLUSTERS, 0), ("l1", "l2"))
        streams = synced_streams(served)
        earlier: list[Any] = []
        for version in range(1, 8):  # a change every time, "e" gone and back (removals too)
            clusters = {n: version for n in CLUSTERS if n != "e" or version % 2}
            fresh = plain_snapshot(clusters, ("l1", "l2") if version % 2 else ("l1",))
            index_module.warm_like(fresh, served)
            for stream in streams:
                stream.on_resources(fresh)
            earlier.append(weakref.ref(served))
            earlier += [weakref.ref(view) for _, _, view in index(served, CDS).subscriptions()]
            served = fresh
        del fresh
        alive = [ref for ref in earlier[:-6] if ref() is not None]  # the last two may be held
        assert not alive, f"{len(alive)} earlier snapshots or views kept alive"
    finally:
        gc.enable()


# -- ResourceSet / Diff against the direct computation (hypothesis) ---------------------------

content = st.dictionaries(st.sampled_from(CLUSTERS), st.integers(0, 2), max_size=len(CLUSTERS))


@settings(max_examples=200, deadline=None)
@given(content, content, st.booleans(), st.sets(st.sampled_from(CLUSTERS)))
def test_view_and_diff_equal_the_direct_computation(
    held: dict[str, int], now: dict[str, int], wildcard: bool, names: set[str]
) -> None:
    old = ResourceSet.of(make(CDS, n, v) for n, v in held.items())
    available = {n: make(CDS, n, v) for n, v in now.items()}
    view = index(snapshot({CDS: now}), CDS).view(wildcard, frozenset(names))
    wanted = (
        dict(available) if wildcard
        else {n: available[n] for n in sorted(names) if n in available}
    )
    assert list(view.items) == list(wanted)
    assert view.version == items_version({n: r.version for n, r in wanted.items()})
    diff = view.diff_from(old)
    has = {n: r.version for n, r in old.items.items()}
    assert [r.name for r in diff.changed] == [
        n for n, r in wanted.items() if has.get(n) != r.version
    ]
    assert set(diff.gone) == set(has) - set(wanted)
    scope = set(has) if wildcard else names & set(has)
    assert diff.removed == tuple(sorted(n for n in scope if n not in available))
    for updates in (False, True):
        for removals in (False, True):
            expected = dict(has)
            if updates:
                expected.update({r.name: r.version for r in diff.changed})
            if removals:
                for n in diff.removed:
                    expected.pop(n)
            after = diff.after(updates=updates, removals=removals)
            assert after.versions == expected
            assert after.version == items_version(expected)
    kept = diff.kept
    assert kept.versions == {**{n: has[n] for n in diff.gone}, **view.versions}


# -- the protocol core against the baseline (hypothesis) --------------------------------------


def names_of(type_url: str) -> tuple[str, ...]:
    return LISTENERS if type_url in (LDS, RDS) else CLUSTERS


specs = st.fixed_dictionaries({
    t: st.dictionaries(st.sampled_from(names_of(t)), st.integers(0, 2),
                       max_size=len(names_of(t)))
    for t in TYPES
})


def subscription(type_url: str) -> st.SearchStrategy[tuple[str, ...]]:
    pool = (*names_of(type_url), "*", "zz")
    return st.lists(st.sampled_from(pool), max_size=4).map(tuple)


sotw_ops = st.one_of(
    st.tuples(st.just("snapshot"), st.integers(0, 3)),
    st.sampled_from(TYPES).flatmap(lambda t: st.tuples(
        st.just("request"), st.just(t), subscription(t),
        st.sampled_from(("latest", "none", "stale")), st.booleans(),
    )),
)
delta_ops = st.one_of(
    st.tuples(st.just("snapshot"), st.integers(0, 3)),
    st.sampled_from(TYPES).flatmap(lambda t: st.tuples(
        st.just("request"), st.just(t), subscription(t), subscription(t),
        st.sampled_from(("latest", "none", "other")), st.booleans(),
        st.dictionaries(st.sampled_from(names_of(t)), st.sampled_from(("x", "keep"))),
    )),
)


def comparable(step: Any) -> tuple[Any, ...]:
    """A step with each response's resources as sorted (name, version): SotW's
    make-before-break response lists what goes away in set order in the baseline."""
    responses = tuple(
        (type(r).__name__, r.type_url, r.version, r.nonce,
         tuple(sorted((x.name, x.version) for x in r.resources)),
         tuple(getattr(r, "removed", ())))
        for r in step.responses
    )
    return responses, tuple(step.events)


Nonces = dict[str, list[str]]


def replay(
    new: Any, old: Any, spec_list: list[Any], ops: list[Any],
    request_for: Callable[[Any, PopResources, Nonces], Any], *, same_errors: bool = False,
) -> None:
    """Feed the current stream and the baseline's the same snapshots and requests; compare every
    step. `request_for(op, current snapshot, nonces sent so far by type)` builds the request of a
    request op; with `same_errors`, a request may raise ProtocolError if both raise the same."""
    snaps = [snapshot(s) for s in spec_list]
    current = snaps[0]
    nonces: Nonces = {}
    for op in ops:
        if op[0] == "snapshot":
            current = snaps[op[1]]
            a, b = new.on_resources(current), old.on_resources(current)
        elif not same_errors:
            request = request_for(op, current, nonces)
            a, b = new.on_request(request, current), old.on_request(request, current)
        else:
            request = request_for(op, current, nonces)
            raised = []
            for stream in (new, old):
                try:
                    step = stream.on_request(request, current)
                except ProtocolError as err:
                    raised.append(str(err))
                    step = None
                if stream is new:
                    a = step
                else:
                    b = step
            if raised:
                assert len(raised) == 2 and raised[0] == raised[1]
                continue
        assert a is not None and b is not None
        assert comparable(a) == comparable(b)
        for r in a.responses:
            nonces.setdefault(r.type_url, []).append(r.nonce)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(specs, min_size=4, max_size=4), st.lists(sotw_ops, max_size=25))
def test_sotw_stream_equals_the_baseline(spec_list: list[Any], ops: list[Any]) -> None:
    def request_for(op: Any, current: PopResources, nonces: Nonces) -> DiscoveryRequest:
        _, type_url, names, which, error = op
        sent = nonces.get(type_url, [])
        nonce = {"latest": sent[-1] if sent else "", "none": "",
                 "stale": sent[0] if sent else "1"}[which]
        return sotw_request(type_url, names, nonce, "bad" if error else "")

    replay(SotwStream(), baseline.SotwStream(), spec_list, ops, request_for)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(specs, min_size=4, max_size=4), st.lists(delta_ops, max_size=25))
def test_delta_stream_equals_the_baseline(spec_list: list[Any], ops: list[Any]) -> None:
    def request_for(op: Any, current: PopResources, nonces: Nonces) -> DeltaDiscoveryRequest:
        _, type_url, subscribe, unsubscribe, which, error, initial = op
        sent = nonces.get(type_url, [])
        others = [n for t, ns in nonces.items() if t != type_url for n in ns]
        nonce = {"latest": sent[-1] if sent else "", "none": "",
                 "other": others[-1] if others else ""}[which]
        versions = {
            n: (current.of_type(type_url)[n].version
                if v == "keep" and n in current.of_type(type_url) else v)
            for n, v in initial.items()
        }
        return delta_request(type_url, subscribe, unsubscribe, nonce,
                             "bad" if error else "", versions)

    replay(DeltaStream(), baseline.DeltaStream(), spec_list, ops, request_for,
           same_errors=True)


def test_empty_set_is_shared_and_versioned_like_nothing() -> None:
    assert EMPTY.version == items_version({}) and EMPTY.resources == ()
