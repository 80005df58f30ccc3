"""Loopback HTTPS origins, each presenting its own certificate; they count the requests served.

Each origin answers every GET with 200 and its name in the body; the TLS handshake happens in
the serving thread, so a client that refuses the certificate never gets a request counted.
"""

from __future__ import annotations

import ssl
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.support.certs import Issued


class TlsOrigins:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.served: Counter[str] = Counter()
        self.servers: dict[str, ThreadingHTTPServer] = {}

    def start(self, name: str, issued: Issued) -> int:
        """Serve HTTPS with `issued` as origin `name`; returns its port."""
        cert, key = issued.write(self.directory, name)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        served = self.served

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                served[name] += 1
                body = name.encode()
                self.send_response(200)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                return

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def finish_request(self, request, client_address) -> None:  # type: ignore[no-untyped-def]
                try:
                    tls = context.wrap_socket(request, server_side=True)
                except (ssl.SSLError, OSError):
                    return  # the client refused our certificate (or went away)
                super().finish_request(tls, client_address)

        server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.servers[name] = server
        return int(server.server_address[1])

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()
