"""`listeners`: ports per PoP, virtual hosts and their domains, TLS listeners and the
certificates they serve, operator-added HTTP filters."""

from __future__ import annotations

import ipaddress

from control_plane.desired.document import Document, Named
from control_plane.desired.errors import At
from control_plane.desired.fields import (
    Bad,
    Fields,
    boolean,
    did_you_mean,
    file_path,
    integer,
    text,
)
from control_plane.desired.filter_types import refusal
from control_plane.desired.layers import GLOBAL, blame, known, read_layer
from control_plane.desired.model import (
    ExtraFilter,
    Listener,
    ListenerTls,
    ServedCertificate,
    VirtualHost,
)
from control_plane.desired.schema import LISTENER_TLS_FIELDS, domain, server_name
from control_plane.desired.served_certs import chain_pem, load_chain, served_certificate
from control_plane.desired.typed_json import typed_config
from control_plane.desired.yaml_nodes import join, plain_value

MAX_EXTRA_FILTERS = 16
# a certificate directory's layouts: certbot's live/<name>/, cert-manager's Secret volume
CERT_DIR_LAYOUTS = (("fullchain.pem", "privkey.pem"), ("tls.crt", "tls.key"))
RESERVED_FILTERS = frozenset({"envoy.filters.http.router"})


def read_listeners(document: Document, doc: Fields) -> list[Listener]:
    # without listeners, Envoys get nothing: a fleet of proxyless gRPC clients only
    _, items = document.list_of(doc, "listeners", "listener", required=not doc.has("grpc_services"))
    listeners: list[Listener] = []
    ports: dict[tuple[str, int], tuple[str, str]] = {}
    for named, listener in document.unique_names(items, "listeners", "listener"):
        port = listener.read("port", integer(1, 65535), required=True)
        filters = _extra_filters(document, listener)
        hosts = _virtual_hosts(document, listener, tuple(f.name for f in filters))
        pops = _listener_pops(document, listener)
        tls = _listener_tls(document, listener, named.name if named else "?")
        redirect = listener.read("redirect_to_https", boolean) or False
        if redirect and listener.has("tls"):
            document.sink.add(listener.at("redirect_to_https"), "a TLS listener cannot redirect "
                              "to https; set redirect_to_https on the plain listener")
        listener.finish()
        if named is None or port is None:
            continue
        _check_ports(document, named.name, port, listener.at("port"), ports, pops)
        listeners.append(Listener(named.name, port, hosts, tls, pops, redirect, filters))
    return listeners


def _listener_pops(document: Document, listener: Fields) -> tuple[str, ...] | None:
    """`pops: [ewr]`: the PoPs that serve the listener (left out: every PoP)."""
    if not listener.has("pops"):
        return None
    path, items = document.list_of(listener, "pops", "pop")
    pops: list[str] = []
    for index, item in enumerate(items):
        value = listener.convert(item, f"{path}[{index}]", text)
        if value is None:
            continue
        if value not in document.pops and "pops" not in document.broken:
            document.sink.add(At.of(item, f"{path}[{index}]"), f"unknown pop '{value}'"
                              + did_you_mean(value, list(document.pops)))
        elif value in pops:
            document.sink.add(At.of(item, f"{path}[{index}]"), f"pop '{value}' is listed twice")
        else:
            pops.append(value)
    return tuple(pops)


def _listener_tls(document: Document, listener: Fields, listener_name: str) -> ListenerTls | None:
    node = listener.node_of("tls")
    if node is None:
        return None
    tls = Fields(node, join(listener.path, "tls"), document.sink)
    values = read_layer(tls, LISTENER_TLS_FIELDS, GLOBAL)
    certs_path, items = document.list_of(tls, "certificates", "certificate")
    certificates: list[ServedCertificate] = []
    defaults: list[str] = []
    hostnames_seen: dict[str, str] = {}
    for named, cert in document.unique_names(items, certs_path, "certificate"):
        hostnames = _hostnames(document, cert, hostnames_seen, named)
        if cert.read("default", boolean) and named is not None:
            defaults.append(named.name)
        files = _certificate_files(document, cert)
        cert.finish()
        if named is None or files is None:
            continue
        served = _served_certificate(document, cert, named.name,
                                     f"{listener_name}.{named.name}", hostnames, files)
        if served is not None:
            certificates.append(served)
    if len(defaults) > 1:
        document.sink.add(tls.at("certificates"), f"only one certificate may be the default, "
                          f"got {', '.join(defaults)}")
    default = defaults[0] if defaults else certificates[0].name if certificates else None
    for cert in certificates:
        if not cert.hostnames and cert.name != default:
            document.sink.add(tls.at("certificates"), f"certificate '{cert.name}' has no "
                              "hostnames and is not the default: no client would get it")
    client_ca = tls.read("client_ca_file", file_path)
    client_ca_pem = None
    if client_ca is not None:
        client_ca_file = _read_file(document, tls.at("client_ca_file"), client_ca)
        if client_ca_file is not None:
            try:  # served as parsed: nothing of the file but its certificates
                client_ca_pem = chain_pem(load_chain(client_ca_file, client_ca))
            except Bad as bad:
                document.sink.add(tls.at("client_ca_file"), str(bad))
    low, high = values.get("min_version"), values.get("max_version")
    if low is not None and high is not None and known(low, high) \
            and float(low.value) > float(high.value):
        document.sink.add(blame(tls.at(), low, high), f"min_version {low.value} is above "
                          f"max_version {high.value}")
    tls.finish()
    if document.sink.problems or not certificates:
        return None
    plain = {key: located.value for key, located in values.items()}
    assert default is not None
    return ListenerTls(
        certificates=tuple(certificates),
        default=default,
        client_ca_file=client_ca,
        client_ca_pem=client_ca_pem,
        **plain,
    )


def _hostnames(document: Document, cert: Fields, seen: dict[str, str],
               named: Named | None) -> tuple[str, ...]:
    path, items = document.list_of(cert, "hostnames", "hostname", required=False)
    hostnames: list[str] = []
    for index, item in enumerate(items):
        value = cert.convert(item, f"{path}[{index}]", server_name)
        if value is None:
            continue
        if value in seen:
            document.sink.add(At.of(item, f"{path}[{index}]"), f"hostname '{value}' is already "
                              f"served by certificate '{seen[value]}' of this listener")
        else:
            seen[value] = named.name if named else "?"
            hostnames.append(value)
    return tuple(hostnames)


def _certificate_files(document: Document, cert: Fields) -> tuple[tuple[str, str], At] | None:
    """(certificate file, key file) and where they were written: `cert_file` and
    `key_file`, or `dir` (certbot's fullchain.pem + privkey.pem, else cert-manager's
    tls.crt + tls.key)."""
    directory = cert.read("dir", file_path)
    cert_file = cert.read("cert_file", file_path)
    key_file = cert.read("key_file", file_path)
    if directory is not None and (cert.has("cert_file") or cert.has("key_file")):
        document.sink.add(cert.at("dir"), "give dir, or cert_file and key_file, not both")
        return None
    if directory is not None:
        for crt, key in CERT_DIR_LAYOUTS:
            pair = (f"{directory.rstrip('/')}/{crt}", f"{directory.rstrip('/')}/{key}")
            if document.files.exists(pair[0]):
                return pair, cert.at("dir")
        layouts = " or ".join(f"{c} + {k}" for c, k in CERT_DIR_LAYOUTS)
        document.sink.add(cert.at("dir"), f"{directory}: holds neither {layouts}")
        return None
    if cert_file is None or key_file is None:
        if cert.ok and not (cert.has("cert_file") and cert.has("key_file")):
            document.sink.add(cert.at(), "needs cert_file and key_file (or dir)")
        return None
    return (cert_file, key_file), cert.at("cert_file")


def _served_certificate(
    document: Document, cert: Fields, name_value: str, secret_name: str,
    hostnames: tuple[str, ...],
    files: tuple[tuple[str, str], At],
) -> ServedCertificate | None:
    (cert_file, key_file), at = files
    chain_pem = _read_file(document, at, cert_file)
    key_at = cert.at("key_file") if cert.has("key_file") else at
    key_pem = _read_file(document, key_at, key_file)
    if chain_pem is None or key_pem is None:
        return None
    try:
        return served_certificate(name_value, secret_name, hostnames,
                                  (cert_file, key_file), (chain_pem, key_pem),
                                  document.files.now_s)
    except Bad as bad:
        document.sink.add(at, str(bad))
        return None


def _read_file(document: Document, at: At, path: str) -> bytes | None:
    try:
        return document.files.read(path)
    except OSError as err:
        document.sink.add(at, f"cannot read {path}: {err.strerror or err}")
        return None


def _extra_filters(document: Document, listener: Fields) -> tuple[ExtraFilter, ...]:
    path, items = document.list_of(listener, "http_filters", "filter", required=False)
    if len(items) > MAX_EXTRA_FILTERS:
        document.sink.add(At.of(items[MAX_EXTRA_FILTERS], path),
                          f"at most {MAX_EXTRA_FILTERS} filters")
    filters: list[ExtraFilter] = []
    names: set[str] = set()
    for index, item in enumerate(items[:MAX_EXTRA_FILTERS]):
        entry = Fields(item, f"{path}[{index}]", document.sink)
        filter_name = entry.read("name", text, required=True)
        node = entry.node_of("typed_config")
        if entry.ok and node is None:
            document.sink.add(entry.at(), "missing required key 'typed_config' (typed JSON: "
                              "'@type' and the message's fields)")
        typed = None
        if node is not None:
            typed = entry.convert(node, join(entry.path, "typed_config"),
                                  lambda n: typed_config(plain_value(n)))
        entry.finish()
        refused = None if typed is None else refusal(
            typed[0].rsplit("/", 1)[-1], document.allowed_filters)
        if refused is not None:
            document.sink.add(entry.at("typed_config"), refused)
        elif filter_name in RESERVED_FILTERS:
            document.sink.add(entry.at("name"), f"'{filter_name}' is Ballast's own filter")
        elif filter_name is not None and filter_name in names:
            document.sink.add(entry.at("name"), f"filter '{filter_name}' is listed twice")
        elif filter_name is not None and typed is not None:
            names.add(filter_name)
            filters.append(ExtraFilter(filter_name, typed[0], typed[1]))
    return tuple(filters)


def _check_ports(document: Document, listener: str, port: int, at: At,
                 taken: dict[tuple[str, int], tuple[str, str]],
                 pops: tuple[str, ...] | None = None) -> None:
    """Each PoP listens on port + port_offset; two sockets on one machine may not collide.

    Within a PoP every listener needs its own port. Across PoPs, only a shared loopback
    address means one machine (the demo set-up port_offset exists for).
    """
    for pop in document.pops.values():
        if pop.name in document.unsure_pops or (pops is not None and pop.name not in pops):
            continue
        effective = port + pop.port_offset
        if effective > 65535:
            document.sink.add(at, f"port {port} + port_offset {pop.port_offset} of pop "
                              f"'{pop.name}' = {effective} is above 65535")
            continue
        shared = _is_loopback(pop.listen_address)
        key = (pop.listen_address if shared else f"pop {pop.name}", effective)
        if key in taken:
            other_pop, other_listener = taken[key]
            document.sink.add(at, f"listener '{listener}' of pop '{pop.name}' and listener "
                              f"'{other_listener}' of pop '{other_pop}' would both listen on "
                              f"{pop.listen_address}:{effective}")
        else:
            taken[key] = (pop.name, listener)


def _virtual_hosts(document: Document, listener: Fields,
                   filter_names: tuple[str, ...]) -> tuple[VirtualHost, ...]:
    path, items = document.list_of(listener, "virtual_hosts", "virtual host")
    hosts = []
    domains_seen: dict[str, str] = {}
    for named, vhost in document.unique_names(items, path, "virtual host"):
        group = document.reference(vhost, "origin_group", "origin_groups", document.groups)
        domains = _domains(document, vhost, named, domains_seen)
        per_filter = _per_filter_configs(document, vhost, filter_names)
        vhost.finish()
        if named is not None and group is not None:
            hosts.append(VirtualHost(named.name, domains, group, per_filter))
    return tuple(hosts)


def _per_filter_configs(document: Document, vhost: Fields,
                        filter_names: tuple[str, ...]) -> tuple[ExtraFilter, ...]:
    """`typed_per_filter_config: {<filter name>: typed JSON}`: per-route configs of the
    listener's operator-added filters, for this host's routes."""
    fields = Fields(vhost.node_of("typed_per_filter_config"),
                    join(vhost.path, "typed_per_filter_config"), document.sink)
    configs: list[ExtraFilter] = []
    for key, node in fields.items():
        filter_name = str(key.value)
        if filter_name not in filter_names:
            document.sink.add(At.of(key, fields.path), f"no filter named '{filter_name}' in "
                              "this listener's http_filters"
                              + did_you_mean(filter_name, filter_names))
            continue
        typed = fields.convert(node, join(fields.path, filter_name),
                               lambda n: typed_config(plain_value(n)))
        if typed is not None:
            configs.append(ExtraFilter(filter_name, typed[0], typed[1]))
    fields.finish()
    return tuple(configs)


def _domains(document: Document, vhost: Fields, named: Named | None,
             seen: dict[str, str]) -> tuple[str, ...]:
    path, items = document.list_of(vhost, "domains", "domain (or '*')")
    domains = []
    for index, item in enumerate(items):
        value = vhost.convert(item, f"{path}[{index}]", domain)
        if value is None:
            continue
        owner = named.name if named else "?"
        if value in seen:
            document.sink.add(At.of(item, f"{path}[{index}]"), f"domain '{value}' is already "
                              f"used by virtual host '{seen[value]}' of this listener")
        else:
            seen[value] = owner
            domains.append(value)
    return tuple(domains)


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback
