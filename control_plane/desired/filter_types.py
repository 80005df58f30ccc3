"""Which Envoy HTTP filter types a desired state's `http_filters` may use: the allow-list.

An extra filter runs inside every edge Envoy on every request, as the user Envoy runs as. Some
types carry code or reach beyond the request: a Lua filter calling `os.execute` ran `id` as root
on the edge, an `ext_authz` or `ext_proc` filter sends each request to a service of the author's
choosing, a `tap` writes requests to files, Wasm and dynamic modules load code. Whoever writes
the desired state is an operator (`docs/security.md`); the allow-list is what the operator who
*runs* Ballast lets the desired state use, checked at validation like any other field (the
filter's `typed_config` is the error's path).

`DEFAULT_ALLOWED` permits the filters that do their work on the request and its answer inside
Envoy — compress, limit, check, rewrite headers and bodies — and run no code of the author's,
read or write no file and open no connection of their own. A type beyond it is permitted by
`ballast serve --allow-filter TYPE` (and the same option of `validate`, `plan` and `render`, so
they judge the file as the server will); `--allow-filter any` permits every type Envoy has. The
list names a filter's own type: wrappers that embed other filters (`composite`, the matcher
wrapper) are not on it, since what they embed would pass unchecked.
"""

from __future__ import annotations

from collections.abc import Iterable

ANY = "any"
DEFAULT_ALLOWED: frozenset[str] = frozenset({
    "envoy.extensions.filters.http.buffer.v3.Buffer",
    "envoy.extensions.filters.http.compressor.v3.Compressor",
    "envoy.extensions.filters.http.cors.v3.Cors",
    "envoy.extensions.filters.http.csrf.v3.CsrfPolicy",
    "envoy.extensions.filters.http.decompressor.v3.Decompressor",
    "envoy.extensions.filters.http.fault.v3.HTTPFault",
    "envoy.extensions.filters.http.grpc_web.v3.GrpcWeb",
    "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
    "envoy.extensions.filters.http.header_to_metadata.v3.Config",
    "envoy.extensions.filters.http.health_check.v3.HealthCheck",
    "envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit",
    "envoy.extensions.filters.http.rbac.v3.RBAC",
    "envoy.extensions.filters.http.transform.v3.TransformConfig",
})
AllowedFilters = frozenset[str] | None  # None: any type


def allowed_filters(given: Iterable[str]) -> AllowedFilters:
    """The allow-list `--allow-filter` options make: the default and the types given (a
    type URL's prefix dropped), or None when one of them is `any`."""
    names = {name.strip().removeprefix("type.googleapis.com/") for name in given}
    return None if ANY in names else DEFAULT_ALLOWED | names


def refusal(type_name: str, allowed: AllowedFilters) -> str | None:
    """Why a filter of `type_name` may not be used, or None when it may."""
    if allowed is None or type_name in allowed:
        return None
    return (f"filter type {type_name} is not on this server's allow-list (the default runs no "
            f"code and opens no file or connection): ballast serve --allow-filter {type_name} "
            "permits it")
