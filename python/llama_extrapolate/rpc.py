"""Layers on other machines: llama.cpp's RPC backend (ggml-rpc).

Each machine runs an RPC server (``llama-extrapolate rpc-server``, or llama.cpp's ``rpc-server`` of the same
protocol) that offers its CPU; ``Llama(rpc_servers="host:port,...")`` registers their devices and llama.cpp splits
the offloaded layers over them (n_gpu_layers, by their free memory). The attention's knobs are set on the graph and
its input tensors, which travel to the servers like any other; the custom ops (the statistics' host reduction, the
document memory's block reader) stay on this machine (patch 0016).

ggml-rpc ends the process when it cannot connect (GGML_ABORT), so every server is asked for its protocol here
first, in Python, with a timeout: a wrong address, a server that is down or busy (a server serves one client at a
time) is then a Python exception that says so, not a crash.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Union

# ggml-rpc's wire format (ggml/src/ggml-rpc/ggml-rpc.cpp at the pinned commit): a command byte, the request's size
# (uint64, little-endian) and the request; the answer's size and the answer. HELLO is command 14 for every version;
# its request is the client's transport capabilities (24 bytes, none asked for here), its answer the protocol
# version (major, minor, patch, padding) and the server's capabilities.
RPC_CMD_HELLO = 14
CONN_CAPS_SIZE = 24
HELLO_ANSWER = 4 + CONN_CAPS_SIZE
DEFAULT_PORT_HINT = 50052  # llama.cpp's rpc-server's default port
PROBE_TIMEOUT = 10.0  # seconds to connect and to get the HELLO answer
# seconds a server may take to answer before its connection counts as lost: a batch of a big model's layers on a slow
# machine takes minutes; a server that stopped answering is given up after this
DEFAULT_ANSWER_TIMEOUT = 600.0


class RPCServerError(ConnectionError):
    """An RPC server that cannot take this model's layers: not reached, busy, or of another protocol."""


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_servers(servers: Union[str, Sequence[str]]) -> List[Endpoint]:
    """"host:port,host:port" or a list of "host:port" (IPv4 addresses or names: ggml-rpc splits at the first ':',
    so an IPv6 address cannot be given), each once."""
    if isinstance(servers, str):
        items = [s.strip() for s in servers.split(",")]
    elif isinstance(servers, (list, tuple)):
        items = [str(s).strip() for s in servers]
    else:
        raise TypeError(f"rpc_servers={servers!r}: give \"host:port,host:port\" or a list of \"host:port\"")
    if not items or any(not s for s in items):
        raise ValueError(f"rpc_servers={servers!r} has an empty entry: give \"host:port,host:port\", e.g. "
                         f"\"192.168.1.20:{DEFAULT_PORT_HINT}\"")
    out: List[Endpoint] = []
    for item in items:
        host, sep, port = item.rpartition(":")
        if not sep or not host:
            raise ValueError(f"RPC server {item!r} has no port: write host:port, e.g. {item}:{DEFAULT_PORT_HINT}")
        if ":" in host or host.startswith("["):
            raise ValueError(f"RPC server {item!r}: ggml-rpc takes a host name or an IPv4 address, not IPv6: use a "
                             "name that resolves to the machine")
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"RPC server {item!r}: the port {port!r} must be a number from 1 to 65535")
        endpoint = Endpoint(host, int(port))
        if endpoint in out:
            raise ValueError(f"RPC server {item} is listed twice in rpc_servers={servers!r}: list each server once")
        out.append(endpoint)
    return out


def _receive(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionResetError("the server closed the connection")
        data += chunk
    return data


def probe(endpoint: Endpoint, timeout: float = PROBE_TIMEOUT) -> Tuple[int, int, int]:
    """The protocol version (major, minor, patch) the server at ``endpoint`` answers HELLO with; RPCServerError
    with the reason and the fix where it does not answer."""
    from . import native

    try:
        with socket.create_connection((endpoint.host, endpoint.port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            sock.sendall(bytes([RPC_CMD_HELLO]) + struct.pack("<Q", CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE))
            (size,) = struct.unpack("<Q", _receive(sock, 8))
            answer = _receive(sock, HELLO_ANSWER) if size == HELLO_ANSWER else None
    except socket.gaierror as e:
        raise RPCServerError(f"RPC server {endpoint}: the host {endpoint.host!r} is unknown ({e.strerror}): check "
                             "the name or give its address") from None
    except ConnectionRefusedError:
        raise RPCServerError(f"RPC server {endpoint}: connection refused: start the server there "
                             f"(llama-extrapolate rpc-server --host 0.0.0.0 --port {endpoint.port}) or fix the "
                             "address") from None
    except socket.timeout:
        raise RPCServerError(f"RPC server {endpoint} did not answer within {timeout:g} s: it serves one client at a "
                             "time (is another process using it?), or a firewall drops the connection") from None
    except OSError as e:
        raise RPCServerError(f"RPC server {endpoint}: {e.strerror or e}") from None
    if answer is None:  # (raised out here: RPCServerError is an OSError, which the handlers above would rewrap)
        raise RPCServerError(f"RPC server {endpoint} answered HELLO with {size} bytes, not {HELLO_ANSWER}: "
                             "it is not a ggml RPC server of this protocol")
    major, minor, patch = answer[:3]
    want = native.rpc_protocol()
    if major != want[0] or minor > want[1]:
        raise RPCServerError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, this library "
                             f"{'.'.join(map(str, want))}: run a server of the same llama.cpp (llama-extrapolate "
                             "rpc-server from this package)")
    return major, minor, patch


def add_servers(servers: Union[str, Sequence[str]], answer_timeout: float = DEFAULT_ANSWER_TIMEOUT,
                probe_timeout: float = PROBE_TIMEOUT) -> List[str]:
    """Checks every server, then registers their devices for the models loaded after (llama.cpp puts RPC devices
    first in its offload order); the device names (e.g. ["RPC0", "RPC1"]). A server that takes longer than
    ``answer_timeout`` seconds to answer (0: no limit) counts as lost (patch 0016's GGML_RPC_TIMEOUT, read when the
    process first connects to it)."""
    import os

    from . import native

    if isinstance(answer_timeout, bool) or not isinstance(answer_timeout, (int, float)) or not answer_timeout >= 0:
        raise ValueError(f"rpc_timeout={answer_timeout!r} must be a number of seconds >= 0 (0: no limit)")
    endpoints = parse_servers(servers)
    for endpoint in endpoints:
        probe(endpoint, probe_timeout)
    os.environ["GGML_RPC_TIMEOUT"] = f"{float(answer_timeout):g}"
    names: List[str] = []
    for endpoint in endpoints:
        try:
            names += native.rpc_add_server(str(endpoint))
        except RuntimeError as exc:
            raise RPCServerError(f"{exc} (it answered a moment ago: did it stop?)") from None
    return names


def serve(host: str, port: int, threads: Optional[int] = None, cache_dir: Optional[str] = None) -> None:
    """Serves this machine's CPU at host:port until the process is stopped (one client at a time)."""
    import os
    import signal

    from . import native

    if not 0 < int(port) < 65536:
        raise ValueError(f"--port {port} must be from 1 to 65535")
    if threads is not None and threads < 1:
        raise ValueError(f"--threads {threads} must be >= 1")
    n_threads = threads or os.cpu_count() or 1
    if cache_dir is not None:
        os.makedirs(cache_dir, exist_ok=True)
    # the server loop is native code: Ctrl-C and SIGTERM end the process as they would a C program
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    native.rpc_serve(f"{host}:{int(port)}", n_threads, cache_dir or "")
    raise RPCServerError(f"the RPC server could not listen at {host}:{port} (see the message above): is the port in "
                         "use, or the address not this machine's?")


def start_local(log_path: str, threads: int = 1, timeout: float = 120.0):
    """An RPC server of this package in a child process on a free port of 127.0.0.1: (process, endpoint) once it
    answers. For tests and benchmarks that play several machines on one; the caller stops the process. Its output
    goes to ``log_path``, quoted in the error when it ends or does not answer within ``timeout`` seconds."""
    import subprocess
    import sys
    import time
    from pathlib import Path

    from .server import free_port

    port = free_port()
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "llama_extrapolate", "rpc-server", "--host", "127.0.0.1",
                                 "--port", str(port), "--threads", str(threads)], stdout=log, stderr=subprocess.STDOUT)
    endpoint = Endpoint("127.0.0.1", port)
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RPCServerError(f"the RPC server on port {port} ended: {Path(log_path).read_text()}")
        try:
            probe(endpoint, timeout=5)
            return proc, endpoint
        except RPCServerError:
            if time.monotonic() > deadline:
                proc.kill()
                raise RPCServerError(f"the RPC server at {endpoint} did not answer within {timeout:.0f} s: "
                                     f"{Path(log_path).read_text()}") from None
            time.sleep(0.2)
