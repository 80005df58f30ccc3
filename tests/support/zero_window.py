"""Raw HTTP/2 ADS clients that never read: each stream sends its first DiscoveryRequest and
grants no flow-control window (SETTINGS_INITIAL_WINDOW_SIZE 0), so the server's first response
write blocks. What a hostile node (or one holding a stolen certificate) can do to the xDS port
without any gRPC library in the way (the `h2` package, pure Python)."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field
from urllib.parse import unquote

import h2.config
import h2.connection
import h2.events
import h2.settings
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DiscoveryRequest

ADS = "/envoy.service.discovery.v3.AggregatedDiscoveryService/"
ADS_PATH = ADS + "StreamAggregatedResources"
DELTA_PATH = ADS + "DeltaAggregatedResources"


def grpc_frame(message: bytes) -> bytes:
    return b"\x00" + len(message).to_bytes(4, "big") + message


@dataclass
class ZeroWindowConnection:
    """One HTTP/2 connection holding streams that never grant window; `status` records each
    stream's grpc-status when the server ends it (trailers are not flow-controlled)."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    conn: h2.connection.H2Connection
    status: dict[int, str] = field(default_factory=dict)
    message: dict[int, str] = field(default_factory=dict)  # grpc-message, when given
    reset: set[int] = field(default_factory=set)
    streams: list[int] = field(default_factory=list)
    closed: bool = False
    _task: asyncio.Task[None] | None = None
    _window: asyncio.Event = field(default_factory=asyncio.Event)  # the server granted window

    @classmethod
    async def open(cls, host: str, port: int, tls: ssl.SSLContext | None) -> ZeroWindowConnection:
        reader, writer = await asyncio.open_connection(
            host, port, ssl=tls, server_hostname=host if tls is not None else None)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        conn.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: 0})
        writer.write(conn.data_to_send())
        await writer.drain()
        self = cls(reader, writer, conn)
        self._task = asyncio.get_running_loop().create_task(self._read())
        return self

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(65536):
                for event in self.conn.receive_data(data):
                    if isinstance(event, h2.events.TrailersReceived | h2.events.ResponseReceived):
                        for name, value in event.headers:
                            key = name.decode() if isinstance(name, bytes) else name
                            text = value.decode() if isinstance(value, bytes) else value
                            if key == "grpc-status":
                                self.status[event.stream_id] = text
                            elif key == "grpc-message":
                                self.message[event.stream_id] = unquote(text)
                    elif isinstance(event, h2.events.StreamReset):
                        self.reset.add(event.stream_id)
                    elif isinstance(event, h2.events.WindowUpdated | h2.events.SettingsAcknowledged
                                    | h2.events.RemoteSettingsChanged):
                        self._window.set()
                # settings and ping acknowledgements; never a WINDOW_UPDATE
                self.writer.write(self.conn.data_to_send())
        except (ConnectionError, ssl.SSLError, h2.exceptions.ProtocolError):
            pass
        finally:
            self.closed = True

    async def stream(self, request: DiscoveryRequest | DeltaDiscoveryRequest | None,
                     authority: str = "ballast") -> int:
        """Open one ADS stream and send `request` as its first message, or (None) only the
        headers; the stream stays open. Large requests go out as the server grants window."""
        stream_id = self.conn.get_next_available_stream_id()
        self.conn.send_headers(stream_id, [
            (":method", "POST"), (":scheme", "https"),
            (":path", DELTA_PATH if isinstance(request, DeltaDiscoveryRequest) else ADS_PATH),
            (":authority", authority), ("content-type", "application/grpc"), ("te", "trailers"),
        ])
        self.writer.write(self.conn.data_to_send())
        self.streams.append(stream_id)
        data = grpc_frame(request.SerializeToString()) if request is not None else b""
        while data and stream_id not in self.status and not self.closed:
            room = min(self.conn.local_flow_control_window(stream_id),
                       self.conn.max_outbound_frame_size, len(data))
            if room <= 0:
                self._window.clear()
                await asyncio.wait_for(self._window.wait(), 10)
                continue
            self.conn.send_data(stream_id, data[:room])
            data = data[room:]
            self.writer.write(self.conn.data_to_send())
        await self.writer.drain()
        return stream_id

    def open_streams(self) -> int:
        """Streams the server has not ended yet."""
        return sum(1 for s in self.streams if s not in self.status and s not in self.reset)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
