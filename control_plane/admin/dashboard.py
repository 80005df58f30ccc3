"""The on-call dashboard: a single page served by the admin API, with its JSON and live stream.

Routes (on the admin API's application, so its bind and its authentication apply to every one):

- ``/dashboard/`` the page; ``/dashboard/static/{name}`` its script and style, shipped inside the
  package (nothing is fetched from anywhere else: the page's Content-Security-Policy says so).
- ``/dashboard/api/overview`` fleet cards (see ``dashboard_views.overview``) with each
  origin's last reading and health score (``origins``, as ``/status`` has them), the
  certificates the TLS listeners serve with their days to expiry, and the latest rollout of a
  desired-state version (its waves, the wave baking, the last gate reading, each PoP's version
  and its nodes' ACKs).
- ``/dashboard/api/pops/{pop}`` one PoP's nodes and groups.
- ``/dashboard/api/timeline?pop=P&group=G&range=15m|1h|6h|24h`` one group's weights over time,
  with its active tier actions and whatever ``controllers`` (given by the server) report for it
  (the failover ramp in words: ``dashboard_views.ramp_view``).
- ``/dashboard/api/decisions?[pop][&group][&kind][&limit]`` the newest matching records.
- ``/dashboard/api/decisions/{seq}`` one record.
- ``/dashboard/api/stream?[pop][&group][&kind]`` new records as server-sent events
  (``id:`` is the seq; a reconnect with ``Last-Event-ID`` replays what it missed).

Every read of the decision log is bounded (``decisions/recent.py``): by the range's start, a
record count and a byte cap; an answer cut by the cap says ``truncated``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from aiohttp import web

from control_plane.admin.dashboard_views import (
    NACKED_LISTED_PER_POP,
    NODES_LISTED_PER_POP,
    RAMP,
    actions_json,
    overview,
    pop_view,
    ramp_view,
    timeline,
)
from control_plane.admin.decision_feed import (
    REMEMBERED_KINDS,
    DecisionFeed,
    Subscription,
    TooManySubscribers,
)
from control_plane.ads.nodes import NodeRegistry
from control_plane.decisions.kinds import KINDS
from control_plane.decisions.read import Query, record_time
from control_plane.decisions.recent import by_seq, newest
from control_plane.intent.owner import IntentOwner
from control_plane.observe.certificates import served_certificates

RANGES: dict[str, timedelta] = {
    "15m": timedelta(minutes=15),
    "1h": timedelta(hours=1),
    "6h": timedelta(hours=6),
    "24h": timedelta(hours=24),
}
TIMELINE_MAX_RECORDS = 20_000
LIST_DEFAULT, LIST_MAX = 50, 500
SCAN_BYTES = 32 * 1024 * 1024  # per request, at most the log's default rotation budget
CONFIG_SCAN_BYTES = 8 * 1024 * 1024
KEEPALIVE_S = 15.0
LEAD_IN = timedelta(seconds=10)
STATIC = {
    "dashboard.js": "application/javascript",
    "dashboard.css": "text/css",
}
CSP = "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'"


# (PoP, group) -> controller name -> its state, JSON-ready (None: idle); shown key by key
Controllers = Callable[[str, str], dict[str, dict[str, Any] | None]]


class BadParameter(ValueError):
    """A query parameter the dashboard cannot use; answered 400 with this message."""


def _asset(name: str) -> bytes:
    return resources.files("control_plane.admin").joinpath("static", name).read_bytes()


def _filter(params: Mapping[str, str], allowed: frozenset[str]) -> Query:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise BadParameter(f"unknown query parameter(s) {', '.join(unknown)}; "
                           f"allowed: {', '.join(sorted(allowed))}")
    kinds = frozenset(k.strip() for k in params.get("kind", "").split(",") if k.strip())
    unknown_kinds = sorted(kinds - set(KINDS))
    if unknown_kinds:
        raise BadParameter(f"kind: unknown {', '.join(unknown_kinds)}; known: {', '.join(KINDS)}")
    return Query(pop=params.get("pop") or None, group=params.get("group") or None, kinds=kinds)


def _bad(err: ValueError) -> web.Response:
    return web.json_response({"error": str(err)}, status=400)


class Dashboard:
    def __init__(
        self,
        *,
        nodes: NodeRegistry,
        intent: IntentOwner,
        feed: DecisionFeed,
        state_dir: Path,
        clock: Callable[[], datetime],
        controllers: Controllers | None = None,
        rollout: Callable[[], dict[str, Any]] | None = None,
        origins: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        """`rollout`: the latest rollout of a desired-state version, its gate reading and each
        PoP's version (`RolloutControl.shown`), for the overview's rollout panel; `origins`:
        PoP -> group -> each origin's last reading and health score (`/status`'s `origins`),
        for the PoP cards."""
        self.nodes = nodes
        self._rollout = rollout
        self._origins = origins
        self._controllers = controllers
        self.intent = intent
        self.feed = feed
        self.state_dir = state_dir
        self._clock = clock
        self._assets = {name: _asset(name) for name in STATIC}
        self._page = _asset("dashboard.html")
        self._config_search: asyncio.Task[None] | None = None

    def register(self, app: web.Application) -> None:
        add = app.router.add_get
        add("/dashboard", self.redirect)
        add("/dashboard/", self.page)
        add("/dashboard/static/{name}", self.static)
        add("/dashboard/api/overview", self.overview)
        add("/dashboard/api/pops/{pop}", self.pop)
        add("/dashboard/api/timeline", self.timeline)
        add("/dashboard/api/decisions", self.decisions)
        add("/dashboard/api/decisions/{seq}", self.decision)
        add("/dashboard/api/stream", self.stream)
        app.on_startup.append(self._bind)
        app.on_shutdown.append(self._close_streams)

    async def _bind(self, app: web.Application) -> None:
        self.feed.bind(asyncio.get_running_loop())

    async def _close_streams(self, app: web.Application) -> None:
        self.feed.close_all()

    # -- the page --------------------------------------------------------------------------

    async def redirect(self, request: web.Request) -> web.Response:
        raise web.HTTPFound("/dashboard/")

    async def page(self, request: web.Request) -> web.Response:
        return web.Response(body=self._page, content_type="text/html", charset="utf-8",
                            headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store"})

    async def static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in self._assets:
            return web.json_response({"error": f"no dashboard asset {name!r}"}, status=404)
        return web.Response(body=self._assets[name], content_type=STATIC[name], charset="utf-8")

    # -- data ------------------------------------------------------------------------------

    async def _config_records(self) -> dict[str, Any]:
        """The last config_applied / config_rejected: from the feed, searched in the log once
        (concurrent first requests wait for the same search)."""
        if self._config_search is None:
            self._config_search = asyncio.create_task(self._search_config())
        await asyncio.shield(self._config_search)
        return {kind: self.feed.latest(kind) for kind in REMEMBERED_KINDS}

    async def _search_config(self) -> None:
        for kind in REMEMBERED_KINDS:
            query = Query(kinds=frozenset({kind}), limit=1)
            window = await asyncio.to_thread(newest, self.state_dir, query, CONFIG_SCAN_BYTES)
            for record in window.records:
                self.feed.remember(record)

    async def overview(self, request: web.Request) -> web.Response:
        config = await self._config_records()
        desired = self.intent.desired
        census = self.nodes.census(NODES_LISTED_PER_POP, NACKED_LISTED_PER_POP)
        body = overview(desired, census, self.intent.pushed_weights(),
                        self.intent.all_tier_actions(), config)
        body["groups"] = [g.name for g in desired.origin_groups]
        body["kinds"] = list(KINDS)
        now_ms = int(self._clock().timestamp() * 1000)
        body["served_certificates"] = [s.as_dict() for s in served_certificates(desired, now_ms)]
        body["rollout"] = None if self._rollout is None else self._rollout()
        body["origins"] = {} if self._origins is None else self._origins()
        return web.json_response(body)

    def _known_pop(self, pop: str) -> web.Response | None:
        if self.intent.has_pop(pop):
            return None
        known = ", ".join(self.intent.desired.pop_names)
        return web.json_response({"error": f"unknown PoP {pop!r}; known: {known}"}, status=404)

    async def pop(self, request: web.Request) -> web.Response:
        pop = request.match_info["pop"]
        missing = self._known_pop(pop)
        if missing is not None:
            return missing
        desired = self.intent.desired
        weights = {pop: {g.name: self.intent.weights(pop, g.name) for g in desired.origin_groups}}
        body = pop_view(desired, pop, self.nodes.statuses(pop), weights,
                        self.intent.all_tier_actions())
        return web.json_response(body)

    async def timeline(self, request: web.Request) -> web.Response:
        params = request.query
        try:
            unknown = sorted(set(params) - {"pop", "group", "range"})
            if unknown:
                raise BadParameter(f"unknown query parameter(s) {', '.join(unknown)}; "
                                   "allowed: group, pop, range")
            span = params.get("range", "1h")
            if span not in RANGES:
                raise BadParameter(f"range={span!r}: one of {', '.join(RANGES)}")
            pop, group_name = params.get("pop", ""), params.get("group", "")
            if not pop or not group_name:
                raise BadParameter("pop and group are required")
        except BadParameter as err:
            return _bad(err)
        missing = self._known_pop(pop)
        if missing is not None:
            return missing
        desired = self.intent.desired
        if group_name not in {g.name for g in desired.origin_groups}:
            known = ", ".join(g.name for g in desired.origin_groups)
            return web.json_response(
                {"error": f"unknown origin group {group_name!r}; known: {known}"}, status=404)
        end = self._clock()
        start = end - RANGES[span]
        query = Query(pop=pop, group=group_name, since=start, limit=TIMELINE_MAX_RECORDS)
        window = await asyncio.to_thread(newest, self.state_dir, query, SCAN_BYTES)
        log_begins = window.exhausted and bool(window.records)
        if log_begins:  # a log younger than the range: the chart starts where the log does
            start = max(start, record_time(window.records[0]) - LEAD_IN)
        body = timeline(desired, pop, desired.group(group_name), window.records,
                        self.intent.weights(pop, group_name), start, end,
                        truncated=window.truncated
                        or len(window.records) >= TIMELINE_MAX_RECORDS)
        actions = self.intent.tier_actions(pop, group_name)
        body["range"] = span
        body["log_begins"] = log_begins
        controllers = self._controllers(pop, group_name) if self._controllers is not None \
            else {}
        ramp = controllers.get(RAMP)
        if ramp is not None:  # in words: each standby's stage, share, since when and why
            controllers[RAMP] = ramp_view(desired.group(group_name), ramp, window.records,
                                          self.intent.weights(pop, group_name))
        body["controllers"] = {
            "Tier actions": None if actions is None else actions_json(actions), **controllers}
        return web.json_response(body)

    async def decisions(self, request: web.Request) -> web.Response:
        params = request.query
        try:
            query = _filter({k: v for k, v in params.items() if k != "limit"},
                            frozenset({"pop", "group", "kind"}))
            text = params.get("limit", str(LIST_DEFAULT))
            limit = int(text) if text.isdigit() and len(text) <= 6 else 0
            if not 1 <= limit <= LIST_MAX:
                raise BadParameter(f"limit={params.get('limit')!r}: a whole number 1..{LIST_MAX}")
        except BadParameter as err:
            return _bad(err)
        bounded = Query(query.pop, query.group, query.kinds, limit=limit)
        window = await asyncio.to_thread(newest, self.state_dir, bounded, SCAN_BYTES)
        return web.json_response({"records": window.records, "truncated": window.truncated})

    async def decision(self, request: web.Request) -> web.Response:
        text = request.match_info["seq"]
        if not text.isdigit() or len(text) > 18:
            return _bad(BadParameter(f"seq {text!r}: a whole number"))
        record = await asyncio.to_thread(by_seq, self.state_dir, int(text))
        if record is None:
            return web.json_response(
                {"error": f"no decision {text} in the log (never written, or rotated away)"},
                status=404)
        return web.json_response({"record": record})

    # -- live ------------------------------------------------------------------------------

    async def stream(self, request: web.Request) -> web.StreamResponse:
        try:
            query = _filter(request.query, frozenset({"pop", "group", "kind"}))
        except BadParameter as err:
            return _bad(err)
        last = request.headers.get("Last-Event-ID", "0")
        after = int(last) if last.isdigit() and len(last) <= 18 else 0
        try:
            subscription = self.feed.subscribe(query, after)
        except TooManySubscribers as err:
            return web.json_response({"error": str(err)}, status=503)
        response = web.StreamResponse(headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-store",
            "X-Accel-Buffering": "no",
        })
        try:
            await response.prepare(request)
            await response.write(b"retry: 1000\n\n")
            await self._pump(response, subscription)
        except ConnectionResetError:  # the client went away
            pass
        finally:
            self.feed.unsubscribe(subscription)
        return response

    async def _pump(self, response: web.StreamResponse, subscription: Subscription) -> None:
        if subscription.gap:
            await response.write(b"event: gap\ndata: {}\n\n")
        for record in subscription.backlog:
            await response.write(_event(record))
        while True:
            try:
                record = await asyncio.wait_for(subscription.queue.get(), KEEPALIVE_S)
            except TimeoutError:
                await response.write(b": keep-alive\n\n")
                continue
            if record is None:
                if subscription.lagging:
                    await response.write(b"event: lagging\ndata: {}\n\n")
                return
            await response.write(_event(record))


def _event(record: Mapping[str, Any]) -> bytes:
    data = json.dumps(record, separators=(",", ":"), ensure_ascii=False)
    return f"id: {record['seq']}\nevent: decision\ndata: {data}\n\n".encode()
