"""The admin HTTP API (aiohttp, JSON, loopback by default): what on-call and `ballast` CLIs read.

Built from explicit parts — node registry, intent owner, output cache, decision-log source,
metrics and two callables for readiness and the server summary — so it runs against any of them
in tests.
Every handler but the rollout's actions only reads; a bad query parameter gets HTTP 400 and an
unknown name 404, both as `{"error": "..."}`.

Endpoints: `/healthz`, `/readyz`, `/status`, `/nodes`, `/nodes/{id}`, `/decisions`, `/weights`,
`/tier-actions[?pop=P][&group=G]`, `/intent` (the running intent as `intent/shown.py` writes it,
what `ballast plan` carries over), `/resources?pop=P[&caps=fifo|lifo]`, `/metrics`, and when
given a `Dashboard`, the on-call page under `/dashboard/` (see `admin/dashboard.py`).

Rollouts (`rollout/rollouts.py`), given a `RolloutControl`: `GET /rollout` (the latest rollout, its
last gate reading, each PoP's version and its nodes' ACKs) and `POST /rollout/<action>` for
`pause`, `resume`, `abort`, `promote` and `apply` (`?now=1`: the desired-state file applied on
every PoP at once, the operator's `--now`); an action that does not apply to the rollout's
phase answers 409 and changes nothing. Each action is recorded with who asked (`token`,
`session`, `cert:<name>`, or `loopback` without authentication).

Authentication (`admin/auth.py`): one middleware in front of every route — a bearer token, a
browser session, or an admin client certificate, for all but `/healthz` and `/readyz` (and the
scrape token for `/metrics` alone); a state-changing request from another page is refused
(`admin/sessions.py`). `/login`, `/logout` and `/session` are the sessions' own routes. A
request aiohttp cannot parse gets 400 and one log line (`admin/request_errors.py`).

`/tier-actions` (also under `tier_actions` in `/status`) is what the intent owner holds now:
PoP -> origin group -> the active tier actions (`TierActions.to_dict()` plus a `description` in
words); every PoP is listed, groups only while they have actions active.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from control_plane.admin.auth import AdminAuth, Login, auth_middleware, check_bind
from control_plane.admin.capability_keys import capabilities_for_key, most_common_key
from control_plane.admin.connections import (
    DEFAULT_ADMIN_LIMITS,
    AdminLimits,
    ConnectionGuard,
    GuardedSite,
)
from control_plane.admin.dashboard import Dashboard
from control_plane.admin.host_check import host_check
from control_plane.admin.request_errors import RequestErrors, reason
from control_plane.ads.nodes import NodeRegistry, NodeStatus
from control_plane.ads.snapshots import SnapshotCache
from control_plane.decisions.explain import describe_active
from control_plane.decisions.kinds import KINDS
from control_plane.decisions.read import Query, Record, RecordSource, parse_since, since_cutoff
from control_plane.desired.model import TierActions
from control_plane.intent.owner import IntentOwner
from control_plane.intent.shown import intent_json
from control_plane.observe.certificates import served_certificates
from control_plane.own_metrics.registry import BallastMetrics
from control_plane.translate import render_json
from control_plane.translate.resources import Capabilities

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18001
NOT_READY = "not ready: controller state not restored or desired state not loaded yet"
STATUSES = ("SYNCED", "STALE", "NACKED")
DECISION_PARAMS = frozenset({"pop", "group", "kind", "since", "limit", "after"})
RESOURCE_PARAMS = frozenset({"pop", "caps"})
TIER_ACTION_PARAMS = frozenset({"pop", "group"})
DECISIONS_BATCH = 500  # records read and written per batch of a /decisions answer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BadQuery(ValueError):
    """A query parameter that cannot be used; the message says which and why."""


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure answers JSON: 400 for bad parameters and for a body aiohttp cannot read (a
    broken chunked encoding), aiohttp's own 404/405 rewritten."""
    try:
        return await handler(request)
    except BadQuery as err:
        return error(400, str(err))
    except HttpProcessingError as err:
        return error(400, f"bad request: {reason(err)}")
    except web.HTTPException as err:
        if err.status < 400:
            raise
        return error(err.status, f"{err.reason}: {request.method} {request.path}")


def check_params(params: Mapping[str, str], allowed: frozenset[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise BadQuery(
            f"unknown query parameter(s) {', '.join(unknown)}; "
            f"allowed: {', '.join(sorted(allowed))}"
        )


def _whole(params: Mapping[str, str], name: str, minimum: int) -> int | None:
    text = params.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise BadQuery(f"{name}={text!r}: wants a whole number >= {minimum}")
    return value


def decision_query(params: Mapping[str, str], now: datetime) -> tuple[Query, int]:
    """`/decisions` parameters as a `Query` (limit applied after `after`) and the `after` seq."""
    check_params(params, DECISION_PARAMS)
    kinds: frozenset[str] = frozenset()
    if "kind" in params:
        kinds = frozenset(part.strip() for part in params["kind"].split(",") if part.strip())
        unknown = sorted(kinds - set(KINDS))
        if unknown or not kinds:
            raise BadQuery(
                f"kind={params['kind']!r}: unknown kind {', '.join(unknown) or 'none given'}; "
                f"known kinds: {', '.join(KINDS)}"
            )
    since = None
    if "since" in params:
        try:
            since = since_cutoff(parse_since(params["since"]), now)
        except ValueError as err:
            raise BadQuery(f"since: {err}") from None
    query = Query(
        pop=params.get("pop"),
        group=params.get("group"),
        kinds=kinds,
        since=since,
        limit=_whole(params, "limit", 1),
    )
    return query, _whole(params, "after", 0) or 0


def _encoded_batch(records: Iterator[Record], size: int = DECISIONS_BATCH) -> list[bytes]:
    """The next `size` records as JSON (fewer at the end; none when done)."""
    return [
        json.dumps(record, separators=(",", ":"), ensure_ascii=False).encode()
        for record in itertools.islice(records, size)
    ]


def node_counts(statuses: list[NodeStatus], pops: tuple[str, ...]) -> dict[str, Any]:
    by_pop = Counter(status.pop for status in statuses)
    by_status = Counter(status.status for status in statuses)
    return {
        "total": len(statuses),
        "by_pop": {pop: by_pop.get(pop, 0) for pop in sorted({*pops, *by_pop})},
        "by_status": {name: by_status.get(name, 0) for name in STATUSES},
    }


def active_tier_actions(intent: IntentOwner) -> dict[str, dict[str, TierActions]]:
    """PoP -> group -> the tier actions active now; every PoP, active groups only."""
    desired = intent.desired
    active: dict[str, dict[str, TierActions]] = {}
    for pop in desired.pop_names:
        active[pop] = {}
        for group in desired.origin_groups:
            actions = intent.tier_actions(pop, group.name)
            if actions is not None:
                active[pop][group.name] = actions
    return active


def configured_tier_actions(intent: IntentOwner) -> dict[str, dict[str, TierActions]]:
    """PoP -> group -> the actions its enabled policy would switch on (for the zero series)."""
    desired = intent.desired
    return {
        pop: {g.name: g.tier_actions.actions() for g in desired.origin_groups
              if g.tier_actions.enabled}
        for pop in desired.pop_names
    }


def tier_actions_json(
    active: Mapping[str, Mapping[str, TierActions]],
) -> dict[str, dict[str, dict[str, Any]]]:
    return {
        pop: {
            group: {**actions.to_dict(), "description": describe_active(actions.to_dict())}
            for group, actions in groups.items()
        }
        for pop, groups in active.items()
    }


def _sorted_nodes(statuses: list[NodeStatus]) -> list[dict[str, Any]]:
    return [
        status.as_dict()
        for status in sorted(statuses, key=lambda s: (s.pop, s.node_id, s.stream))
    ]


class RolloutControl(Protocol):
    """The rollout's face for the admin API (the service's `lifecycle/rollout_control.py`)."""

    def shown(self) -> dict[str, Any]:
        """The latest rollout, its gate reading, each PoP's version (JSON)."""
        ...

    async def act(self, action: str, by: str, *, now: bool = False) -> dict[str, Any]:
        """`pause`, `resume`, `abort`, `promote`, `apply`; ValueError (RolloutError) when it
        does not apply, KeyError for an unknown action."""
        ...


class AdminApi:
    def __init__(
        self,
        *,
        nodes: NodeRegistry,
        intent: IntentOwner,
        cache: SnapshotCache[Any],
        decisions: RecordSource,
        metrics: BallastMetrics,
        ready: Callable[[], bool],
        status: Callable[[], dict[str, Any]],
        not_ready_reason: Callable[[], str] = lambda: NOT_READY,
        degraded: Callable[[], str | None] = lambda: None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        dashboard: Dashboard | None = None,
        auth: AdminAuth | None = None,
        limits: AdminLimits = DEFAULT_ADMIN_LIMITS,
        host_names: tuple[str, ...] = (),
        rollouts: RolloutControl | None = None,
    ) -> None:
        """`limits`: connection timeouts and cap (`connections.py`); `host_names`: names
        besides IP literals and localhost that requests may give as `Host` (`host_check.py`)."""
        self.auth = auth if auth is not None else AdminAuth()
        self.guard = ConnectionGuard(limits)
        self.nodes = nodes
        self.intent = intent
        self.cache = cache
        self.decisions = decisions
        self.metrics = metrics
        self._ready = ready
        self._status = status
        self._not_ready_reason = not_ready_reason
        self._degraded = degraded
        self._clock = clock
        self.rollouts = rollouts
        # connection bookkeeping, the Host check, then authentication: every route below (and
        # any added later) goes through them
        self.app = web.Application(middlewares=[
            self.guard.middleware, host_check(host_names), auth_middleware(self.auth),
            json_errors])
        Login(self.auth).register(self.app)
        self.app.router.add_get("/healthz", self.healthz)
        self.app.router.add_get("/readyz", self.readyz)
        self.app.router.add_get("/status", self.status)
        self.app.router.add_get("/nodes", self.list_nodes)
        self.app.router.add_get("/nodes/{node_id}", self.node)
        self.app.router.add_get("/decisions", self.list_decisions)
        self.app.router.add_get("/weights", self.weights)
        self.app.router.add_get("/tier-actions", self.tier_actions)
        self.app.router.add_get("/intent", self.running_intent)
        self.app.router.add_get("/resources", self.resources)
        self.app.router.add_get("/metrics", self.scrape)
        if rollouts is not None:
            self.app.router.add_get("/rollout", self.rollout)
            self.app.router.add_post("/rollout/{action}", self.rollout_action)
        if dashboard is not None:
            dashboard.register(self.app)
        self._runner: web.AppRunner | None = None
        self.host = DEFAULT_HOST
        self.port = 0
        self.scheme = "http"

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"

    async def start(
        self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        """Bind and serve; `port` (0: any free one) is readable afterwards. Without
        authentication only a loopback address is allowed (AdminAuthError)."""
        host = host.strip("[]")  # an IPv6 address as written in HOST:PORT
        check_bind(host, self.auth)
        runner = web.AppRunner(self.app, access_log=None, logger=RequestErrors(),
                               keepalive_timeout=self.guard.limits.idle_timeout_s)
        await runner.setup()
        site = GuardedSite(runner, host, port, self.guard, ssl_context=ssl_context)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self.host = host
        self.port = int(runner.addresses[0][1])
        self.scheme = "https" if ssl_context is not None else "http"
        log.info("admin API on %s", self.url)

    async def stop(self) -> None:
        self.guard.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
            log.info("admin API stopped")

    # -- handlers ------------------------------------------------------------------------------

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(self, request: web.Request) -> web.Response:
        if self._ready():
            # degraded (replicas without etcd): still serving the last intent, so still ready
            degraded = self._degraded()
            return web.json_response({"ready": True, **({"degraded": degraded} if degraded
                                                        else {})})
        return web.json_response({"ready": False, "reason": self._not_ready_reason()}, status=503)

    async def status(self, request: web.Request) -> web.Response:
        summary = dict(self._status())
        summary["ready"] = self._ready()
        summary["nodes"] = node_counts(self.nodes.statuses(), self.intent.desired.pop_names)
        summary["tier_actions"] = tier_actions_json(active_tier_actions(self.intent))
        return web.json_response(summary)

    async def list_nodes(self, request: web.Request) -> web.Response:
        return web.json_response({"nodes": _sorted_nodes(self.nodes.statuses())})

    async def node(self, request: web.Request) -> web.Response:
        node_id = request.match_info["node_id"]
        streams = self.nodes.by_node(node_id)
        if not streams:
            return error(404, f"no connected node {node_id!r}")
        return web.json_response({"node_id": node_id, "streams": _sorted_nodes(streams)})

    async def list_decisions(self, request: web.Request) -> web.StreamResponse:
        """`{"records": [...]}`, streamed: records are read from the log (off the event loop)
        and written in batches, so memory stays bounded whatever the answer's size."""
        query, after = decision_query(request.query, self._clock())
        records = self.decisions.records(query, after)
        batch = await asyncio.to_thread(_encoded_batch, records)  # errors here still get a 500
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"records":[')
        separator = b""
        while batch:
            await response.write(separator + b",".join(batch))
            separator = b","
            batch = await asyncio.to_thread(_encoded_batch, records)
        await response.write(b"]}")
        await response.write_eof()
        return response

    async def weights(self, request: web.Request) -> web.Response:
        return web.json_response({"weights": self.intent.all_weights()})

    async def rollout(self, request: web.Request) -> web.Response:
        """The latest rollout, its gate reading, each PoP's version."""
        assert self.rollouts is not None
        return web.json_response(self.rollouts.shown())

    async def rollout_action(self, request: web.Request) -> web.Response:
        """An operator's action on the rollout (409 when it does not apply)."""
        assert self.rollouts is not None
        action = request.match_info["action"]
        now = request.query.get("now", "0")
        if now not in ("0", "1"):
            raise BadQuery(f"now must be 0 or 1, got {now[:20]!r}")
        by = f"{self.auth.who(request) or 'loopback'} via the admin API"
        try:
            shown = await self.rollouts.act(action, by, now=now == "1")
        except KeyError:
            return error(404, f"unknown rollout action {action[:40]!r}; known: pause, resume, "
                              "abort, promote, apply")
        except ValueError as err:
            return error(409, str(err))
        return web.json_response(shown)

    async def running_intent(self, request: web.Request) -> web.Response:
        check_params(request.query, frozenset())
        return web.json_response(intent_json(self.intent.intent))

    async def tier_actions(self, request: web.Request) -> web.Response:
        params = request.query
        check_params(params, TIER_ACTION_PARAMS)
        pop, group = params.get("pop"), params.get("group")
        desired = self.intent.desired
        if pop is not None and not self.intent.has_pop(pop):
            return error(404, f"unknown PoP {pop!r}; known: {', '.join(desired.pop_names)}")
        groups = [g.name for g in desired.origin_groups]
        if group is not None and group not in groups:
            return error(404, f"unknown origin group {group!r}; known: {', '.join(groups)}")
        active = {
            name: {g: a for g, a in by_group.items() if group is None or g == group}
            for name, by_group in active_tier_actions(self.intent).items()
            if pop is None or name == pop
        }
        return web.json_response({"tier_actions": tier_actions_json(active)})

    async def resources(self, request: web.Request) -> web.Response:
        params = request.query
        check_params(params, RESOURCE_PARAMS)
        pop = params.get("pop")
        if not pop:
            raise BadQuery("pop: required (the PoP whose resources to show)")
        if not self.cache.has_pop(pop):
            known = ", ".join(self.cache.pops)
            return error(404, f"unknown PoP {pop!r}; known: {known}")
        caps, why = self._capabilities(pop, params.get("caps"))
        resources = self.cache.resources(pop, caps)
        return web.json_response(
            {
                "pop": pop,
                "capabilities": caps.key,
                "capabilities_reason": why,
                "notes": list(resources.notes),
                "resources": render_json(resources),
            }
        )

    async def scrape(self, request: web.Request) -> web.Response:
        self.metrics.set_weights(self.intent.all_weights())
        self.metrics.set_served_certificates(
            (s.listener, s.certificate, s.days_to_expiry)
            for s in served_certificates(self.intent.desired, int(time.time() * 1000)))
        self.metrics.set_tier_actions(
            active_tier_actions(self.intent), configured_tier_actions(self.intent)
        )
        return web.Response(
            body=self.metrics.exposition(), headers={"Content-Type": self.metrics.content_type}
        )

    def _capabilities(self, pop: str, asked: str | None) -> tuple[Capabilities, str]:
        """Asked for, else what most connected nodes of the PoP get, else the PoP's default."""
        if asked is not None:
            try:
                return capabilities_for_key(asked), "caps parameter"
            except ValueError as err:
                raise BadQuery(f"caps: {err}") from None
        key = most_common_key(s.capability_key for s in self.nodes.statuses() if s.pop == pop)
        if key is not None:
            return capabilities_for_key(key), f"most connected nodes of PoP {pop}"
        effective = self.cache.effective_capabilities(pop, Capabilities())
        if effective.capabilities != Capabilities():
            return effective.capabilities, effective.reason
        return effective.capabilities, f"no connected nodes in PoP {pop}: the fifo default"
