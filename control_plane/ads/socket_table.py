"""The xDS port's TCP connections as the kernel holds them (Linux): listed, shut down one by
one, and peer addresses blocked before gRPC accepts them.

gRPC (C-core) accepts the port's connections and owns their descriptors; Python sees a
connection only once it carries a stream, and has no handle to close one. This is the handle:

- `connections()`: every established connection whose local port is the xDS port, with its
  peer address and socket inode, from the kernel's socket diagnostics (netlink `sock_diag`,
  one dump per address family, filtered in the kernel by local port): what `ss -tn sport = :P`
  prints. The kernel walks every TCP socket of the network namespace for it (~1 µs each), and
  parsing takes ~2 µs a connection; `passive_opens()` says cheaply whether any was accepted
  since;
- `close(inodes)`: shuts those sockets down. The process's descriptors are scanned for the
  inodes; each one found is duplicated, the duplicate's inode checked again (gRPC may have
  closed the descriptor and reused its number meanwhile: then it is another socket and is left
  alone), set to reset on close (`SO_LINGER` 0, so no half-closed sockets linger), and shut down
  (`shutdown(2)`, both directions). gRPC then reads the end of the connection and closes it as
  if the peer had: its descriptor is freed and its streams end;
- `block(addresses)`: a classic BPF socket filter on the port's listening sockets drops the
  packets those addresses send to them — their connection attempts (SYNs) never complete, so
  they cost no descriptor, no accept and no handshake. Connections accepted earlier are not
  affected. At most `MAX_BLOCKED` addresses (the filter's size).

Needs Linux; any other platform (or a kernel without `sock_diag`) raises `OSError` at
construction, and the caller runs without it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import socket
import struct
import sys
from collections.abc import Collection, Iterator

from control_plane.ads.connections import MAX_BLOCKED, Endpoint

__all__ = ["SocketTable", "block_program", "endpoint_of"]

# netlink sock_diag (linux/sock_diag.h, linux/inet_diag.h)
_NETLINK_SOCK_DIAG = 4
_SOCK_DIAG_BY_FAMILY = 20
_NLM_F_REQUEST, _NLM_F_DUMP = 0x1, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_INET_DIAG_REQ_BYTECODE = 1
_BC_NOP, _BC_S_GE, _BC_S_LE = 0, 2, 3
_TCP_ESTABLISHED, _TCP_CLOSE_WAIT = 1, 8
_NLMSG = struct.Struct("=IHHII")
# a netlink header (length, type, flags, seq, pid) and its inet_diag_msg (family, state, timer,
# retrans; sockid: sport, dport, src, dst, if, cookie; expires, rqueue, wqueue, uid, inode):
# what is read of them
_DIAG_RECORD = struct.Struct("=IH10x4x2xH16x16s4x8x16xI")

# classic BPF (linux/filter.h)
_SO_ATTACH_FILTER, _SO_DETACH_FILTER = 26, 27
_SKF_NET_OFF = -0x100000
_LD_W_ABS, _LD_B_ABS, _ALU_AND_K, _JEQ_K, _RET_K = 0x20, 0x30, 0x54, 0x15, 0x06
_ACCEPT, _DROP = 0xFFFFFFFF, 0
_INSN = struct.Struct("=HBBI")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]



def endpoint_of(peer: str) -> Endpoint | None:
    """A gRPC peer string (`ipv4:10.0.0.7:5000`, `ipv6:[2001:db8::7]:5000`) as the address and
    port `connections()` lists it under; None for other kinds (unix sockets)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    try:
        return _normal(ipaddress.ip_address(host.strip("[]"))), int(port)
    except ValueError:
        return None


def _normal(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


def block_program(addresses: Collection[str]) -> list[tuple[int, int, int, int]]:
    """The filter: drop what an address of `addresses` sends, accept the rest. IPv4 packets
    (also those reaching a dual-stack socket) compare their source with the IPv4 addresses,
    IPv6 ones with the IPv6 addresses."""
    v4 = [int(a) for a in map(ipaddress.ip_address, addresses) if a.version == 4]
    v6 = [int(a) for a in map(ipaddress.ip_address, addresses) if a.version == 6]
    ipv4_part: list[tuple[int, int, int, int]] = [(_LD_W_ABS, 0, 0, _SKF_NET_OFF + 12)]
    for address in v4:
        ipv4_part += [(_JEQ_K, 0, 1, address), (_RET_K, 0, 0, _DROP)]
    ipv4_part.append((_RET_K, 0, 0, _ACCEPT))
    ipv6_part: list[tuple[int, int, int, int]] = []
    for address in v6:
        words = [(address >> shift) & 0xFFFFFFFF for shift in (96, 64, 32, 0)]
        for i, word in enumerate(words):  # a mismatch skips to the next address
            ipv6_part += [(_LD_W_ABS, 0, 0, _SKF_NET_OFF + 8 + 4 * i),
                          (_JEQ_K, 0, 7 - 2 * i, word)]
        ipv6_part.append((_RET_K, 0, 0, _DROP))
    ipv6_part.append((_RET_K, 0, 0, _ACCEPT))
    # the IP version: the high nibble of the network header's first byte
    head = [(_LD_B_ABS, 0, 0, _SKF_NET_OFF), (_ALU_AND_K, 0, 0, 0xF0),
            (_JEQ_K, 0, len(ipv4_part), 0x40)]
    return head + ipv4_part + ipv6_part


def _sport_bytecode(port: int) -> bytes:
    """inet_diag bytecode: local port >= port and <= port."""
    op = struct.Struct("=BBH")
    return (op.pack(_BC_S_GE, 8, 8 + 8 + 4) + op.pack(_BC_NOP, 0, port)
            + op.pack(_BC_S_LE, 8, 8 + 4) + op.pack(_BC_NOP, 0, port))


class SocketTable:
    def __init__(self, port: int) -> None:
        """The table of the process's listening socket(s) on `port`; OSError when there is
        none, or the platform cannot list connections."""
        if not sys.platform.startswith("linux"):
            raise OSError(f"listing connections needs Linux (not {sys.platform})")
        self.port = port
        self._requests = {family: self._request(family)
                          for family in (socket.AF_INET, socket.AF_INET6)}
        self._addresses: dict[bytes, str] = {}  # raw peer address -> its text, as seen
        self._listening = [inode for inode, fd in self._sockets() if self._listens(inode, fd)]
        if not self._listening:
            raise OSError(f"no listening socket of this process on port {port}")
        self.connections()  # the platform can list connections, or OSError now

    def _request(self, family: int) -> bytes:
        states = (1 << _TCP_ESTABLISHED) | (1 << _TCP_CLOSE_WAIT)
        bytecode = _sport_bytecode(self.port)
        body = (struct.pack("=BBBxI", family, socket.IPPROTO_TCP, 0, states) + bytes(48)
                + struct.pack("=HH", 4 + len(bytecode), _INET_DIAG_REQ_BYTECODE) + bytecode)
        return _NLMSG.pack(_NLMSG.size + len(body), _SOCK_DIAG_BY_FAMILY,
                           _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0) + body

    # -- listing -----------------------------------------------------------------------------

    def connections(self) -> list[tuple[Endpoint, int]]:
        """Every established (or peer-closed) connection of the port: (peer, socket inode)."""
        found: list[tuple[Endpoint, int]] = []
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, _NETLINK_SOCK_DIAG) as diag:
            for family, request in self._requests.items():
                diag.sendto(request, (0, 0))
                self._read_dump(diag, family, found)
        return found

    def _read_dump(self, diag: socket.socket, family: int,
                   found: list[tuple[Endpoint, int]]) -> None:
        names = self._addresses
        unpack = _DIAG_RECORD.unpack_from
        ntohs = socket.ntohs
        size = 4 if family == socket.AF_INET else 16
        while True:
            data = diag.recv(1 << 20)
            offset = 0
            while offset + _NLMSG.size <= len(data):
                length, kind, _, _, _ = _NLMSG.unpack_from(data, offset)
                if kind == _NLMSG_DONE:
                    return
                if kind == _NLMSG_ERROR:
                    code = -struct.unpack_from("=i", data, offset + _NLMSG.size)[0]
                    raise OSError(code, f"sock_diag: {os.strerror(code)}")
                _, _, dport, raw, inode = unpack(data, offset)
                address = names.get(raw)
                if address is None:
                    address = _normal(ipaddress.ip_address(raw[:size]))
                    if len(names) > 65_536:
                        names.clear()
                    names[raw] = address
                found.append(((address, ntohs(dport)), inode))
                offset += (length + 3) & ~3

    @staticmethod
    def passive_opens() -> int | None:
        """Connections accepted in the network namespace so far (`PassiveOpens`, Linux's TCP
        MIB: ~0.2 ms to read): a sweep is due when it grew. None when unreadable."""
        try:
            with open("/proc/self/net/snmp", "rb") as snmp:
                names, values = (line.split() for line in snmp if line.startswith(b"Tcp:"))
            return int(values[names.index(b"PassiveOpens")])
        except (OSError, ValueError):
            return None

    # -- the process's own descriptors -------------------------------------------------------

    @staticmethod
    def _sockets() -> Iterator[tuple[int, int]]:
        """(inode, descriptor) of each socket the process holds."""
        with os.scandir("/proc/self/fd") as entries:
            for entry in entries:
                try:
                    link = os.readlink(entry.path)
                except OSError:
                    continue  # closed meanwhile
                if link.startswith("socket:["):
                    yield int(link[8:-1]), int(entry.name)

    @contextlib.contextmanager
    def _duplicate(self, inode: int, fd: int) -> Iterator[socket.socket | None]:
        """A socket object on a duplicate of `fd`, if it still is the socket `inode`."""
        try:
            dup = os.dup(fd)
        except OSError:
            yield None
            return
        try:
            if os.fstat(dup).st_ino != inode:
                yield None
                return
            sock = socket.socket(fileno=dup)
        except OSError:
            os.close(dup)
            yield None
            return
        with sock:
            yield sock

    def _listens(self, inode: int, fd: int) -> bool:
        with self._duplicate(inode, fd) as sock:
            if sock is None or sock.type != socket.SOCK_STREAM:
                return False
            try:
                return bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)) and \
                    sock.getsockname()[1] == self.port
            except OSError:
                return False

    # -- acting --------------------------------------------------------------------------------

    def close(self, inodes: Collection[int]) -> int:
        """Shut down the process's sockets among `inodes`; how many were."""
        wanted = set(inodes)
        closed = 0
        linger = struct.pack("=ii", 1, 0)
        for inode, fd in self._sockets():
            if inode not in wanted:
                continue
            with self._duplicate(inode, fd) as sock:
                if sock is None:
                    continue
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    sock.shutdown(socket.SHUT_RDWR)
                    closed += 1
        return closed

    def block(self, addresses: Collection[str]) -> None:
        """From now on the listening sockets drop what `addresses` send (none: no filter)."""
        if len(addresses) > MAX_BLOCKED:
            raise ValueError(f"{len(addresses)} addresses to block, at most {MAX_BLOCKED}")
        program = block_program(addresses) if addresses else []
        code = b"".join(_INSN.pack(op, jt, jf, k & 0xFFFFFFFF) for op, jt, jf, k in program)
        buffer = ctypes.create_string_buffer(code, max(1, len(code)))
        fprog = bytes(_SockFprog(len(program), ctypes.addressof(buffer)))
        descriptors = dict(self._sockets())
        for inode in self._listening:
            fd = descriptors.get(inode)
            if fd is None:
                continue
            with self._duplicate(inode, fd) as sock:
                if sock is None:
                    continue
                if program:
                    sock.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_FILTER, fprog)
                else:
                    with contextlib.suppress(OSError):  # ENOENT: no filter attached
                        sock.setsockopt(socket.SOL_SOCKET, _SO_DETACH_FILTER, 0)
