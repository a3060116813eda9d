"""llama.cpp RPC servers (``ggml-rpc-server``) as offload devices: which exist, and how much they hold.

Each endpoint is first tried with a plain TCP connection (a timeout per server, so an unreachable one
is named rather than hanging the plan), then the real binary lists the devices as it will see them:
``llama-server --rpc A,B --list-devices`` prints ``RPC<i>: <endpoint> (<total> MiB, <free> MiB free)``
(``common/arg.cpp:1144-1166``). Device ids follow llama.cpp: ``RPC0, RPC1, ...`` in endpoint order,
one per device a server exposes; in a load they come before the local GPUs (``src/llama.cpp:272-276``).

The RPC protocol has no authentication: anyone who can reach the port can run code on that device.
"""

from __future__ import annotations

import atexit
import re
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from llamafit.devices.listed import parse_device_list
from llamafit.devices.machine import Device
from llamafit.errors import NetworkError, ServerNotFoundError, UsageError
from llamafit.server.bounded import finish_bounded, start_bounded
from llamafit.server.children import kill_group

CONNECT_TIMEOUT = 3.0
LIST_TIMEOUT = 30.0
_ENDPOINT = re.compile(r"^(?P<host>[A-Za-z0-9_.-]+):(?P<port>\d{1,5})$")


@dataclass(frozen=True)
class RpcDevices:
    devices: tuple[Device, ...]
    unreachable: tuple[str, ...] = ()  # left out under --rpc-optional


def parse_endpoints(values: Sequence[str]) -> list[str]:
    """``host:port`` items from every ``--rpc`` value (comma-separated, accumulated), in order, once each."""
    out: list[str] = []
    for v in values:
        for ep in (x.strip() for x in v.split(",")):
            if not ep:
                # llama-server registers every comma-separated entry and fails on an empty one
                raise UsageError(f"--rpc {v!r} has an empty endpoint", hint="e.g. --rpc 192.168.1.20:50052")
            if "://" in ep:
                raise UsageError(
                    f"--rpc {ep!r} is a URL: llama.cpp's RPC client takes host:port",
                    hint="e.g. --rpc 192.168.1.20:50052",
                )
            if _ipv6(ep):
                # ggml-rpc's parse_endpoint splits at the first ':' (ggml-rpc.cpp:293-305): an IPv6 address
                # gives it no port, and llama-server aborts
                raise UsageError(
                    f"--rpc {ep!r}: llama.cpp's RPC client cannot take an IPv6 address",
                    hint="give an IPv4 address or a host name, e.g. --rpc 127.0.0.1:50052",
                )
            m = _ENDPOINT.match(ep)
            if not m or not 0 < int(m["port"]) < 65536:
                raise UsageError(f"--rpc {ep!r} is not host:port", hint="e.g. --rpc 192.168.1.20:50052")
            if ep not in out:
                out.append(ep)
    return out


def _ipv6(endpoint: str) -> bool:
    """An IPv6 address, bare (``::1``), with a port (``fe80::2:50052``) or bracketed (``[::1]:50052``)."""
    import ipaddress

    if endpoint.startswith("[") and "]" in endpoint:
        hosts = [endpoint[1 : endpoint.index("]")]]
    else:
        hosts = [endpoint, endpoint.rpartition(":")[0]]
    for host in hosts:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            continue
        return True
    return False


RESOLVE_TIMEOUT = 3.0


def _address(endpoint: str, timeout: float) -> tuple[str, int]:
    """Where an endpoint really is: its host's first address (a name resolved, bounded) and its port."""
    import concurrent.futures
    import ipaddress

    host, _, port = endpoint.rpartition(":")
    host = host.strip("[]")
    try:
        return str(ipaddress.ip_address(host)), int(port)
    except ValueError:
        pass
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        infos = pool.submit(socket.getaddrinfo, host, int(port), type=socket.SOCK_STREAM).result(timeout=timeout)
        return str(ipaddress.ip_address(infos[0][4][0])), int(port)
    except (OSError, concurrent.futures.TimeoutError, IndexError, ValueError):
        return host.lower(), int(port)  # not resolvable now: the name stands for itself
    finally:
        pool.shutdown(wait=False)


def same_servers(endpoints: Sequence[str], timeout: float = RESOLVE_TIMEOUT) -> tuple[list[str], list[str]]:
    """The endpoints with each server once (``127.0.0.1:P`` and ``localhost:P`` are one server: llama-server
    would register its devices twice and the plan count its memory twice), and what was merged."""
    out: list[str] = []
    notes: list[str] = []
    seen: dict[tuple[str, int], str] = {}
    for ep in endpoints:
        addr = _address(ep, timeout)
        if addr in seen:
            notes.append(f"--rpc {ep} is {seen[addr]} again (the same server): used once")
            continue
        seen[addr] = ep
        out.append(ep)
    return out, notes


def reachable(endpoint: str, timeout: float = CONNECT_TIMEOUT) -> str | None:
    """None when a TCP connection opens, else why not."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:.0f} s"
    except OSError as e:
        return e.strerror or type(e).__name__


def rpc_devices(text: str) -> list[Device]:
    """The RPC devices of ``--list-devices`` output; the description of an RPC device is its endpoint."""
    return [
        Device(d.name, d.description, d.total, d.free, kind="rpc", source="rpc", endpoint=d.description, backend="RPC")
        for d in parse_device_list(text)
        if d.backend == "RPC"
    ]


def discover_rpc(
    endpoints: Sequence[str],
    server: str | None,
    env: dict[str, str] | None = None,
    *,
    optional: bool = False,
    timeout: float = CONNECT_TIMEOUT,
) -> RpcDevices:
    """The RPC devices behind ``endpoints`` as llama-server will number them."""
    if not endpoints:
        return RpcDevices(())
    down = [(ep, why) for ep in endpoints if (why := reachable(ep, timeout)) is not None]
    if down and not optional:
        ep, why = down[0]
        raise NetworkError(
            f"the RPC server {ep} cannot be reached ({why})",
            hint="start `ggml-rpc-server -H <its address> -p <port>` there, check the address and firewall, "
            "or pass --rpc-optional to plan without it",
        )
    up = [ep for ep in endpoints if ep not in {d for d, _ in down}]
    if not up:
        return RpcDevices((), tuple(d for d, _ in down))
    if server is None:
        raise ServerNotFoundError(
            "listing RPC devices needs a llama-server built with RPC support",
            hint="install llamafit[server] or pass --server PATH",
        )
    try:
        r = _listed(up, server, env)
    except subprocess.TimeoutExpired:
        raise NetworkError(f"listing the devices of {', '.join(up)} took over {LIST_TIMEOUT:.0f} s") from None
    except OSError as e:
        raise ServerNotFoundError(f"could not run {server}: {e.strerror or e}") from None
    devs = rpc_devices(r.stdout)
    if r.returncode != 0 or not devs:
        if "failed to find RPC backend" in r.stderr:
            raise ServerNotFoundError(
                "this llama-server was built without RPC support", hint="rebuild it with -DGGML_RPC=ON"
            )
        from llamafit.server.failures import abort_reason  # only when it failed: the plan's path stays light

        raise NetworkError(
            f"llama-server could not list the devices of {', '.join(up)}: {abort_reason(r.stderr)}",
            hint="each --rpc endpoint must be a ggml-rpc-server of the same llama.cpp build as this llama-server",
        )
    return RpcDevices(tuple(devs), tuple(d for d, _ in down))


# listings started before a plan asks for them: (endpoints, server, env) -> the child and its deadline
_EARLY: dict[tuple[tuple[str, ...], str, tuple[tuple[str, str], ...]], tuple[subprocess.Popen[bytes], float]] = {}


def start_listing(endpoints: Sequence[str], server: str, env: dict[str, str] | None = None) -> None:
    """Start ``llama-server --rpc ENDPOINTS --list-devices`` now, for ``discover_rpc`` to read when a plan asks for
    these endpoints with this server: the listing (a server start and a round trip to each RPC server) runs while
    the command imports and reads the model. Bounded as any listing; a listing no plan reads is killed at exit, and
    one started for other endpoints than the plan asks for is killed then and not read."""
    key = (tuple(endpoints), server, tuple(sorted((env or {}).items())))
    if not endpoints or key in _EARLY:
        return
    try:
        proc = start_bounded([server, "--rpc", ",".join(endpoints), "--list-devices"], env=env)
    except OSError:
        return  # the plan's own listing says why
    _EARLY[key] = (proc, time.monotonic() + LIST_TIMEOUT)


def _listed(up: Sequence[str], server: str, env: dict[str, str] | None) -> subprocess.CompletedProcess[str]:
    """The device list of ``up``: the one started early for them when there is one, else listed now."""
    key = (tuple(up), server, tuple(sorted((env or {}).items())))
    early = _EARLY.pop(key, None)
    _kill_unread()  # started for other endpoints (one was down, a flag after ``--`` added one): not these devices
    if early is not None:
        return finish_bounded(*early)
    return finish_bounded(
        start_bounded([server, "--rpc", ",".join(up), "--list-devices"], env=env), time.monotonic() + LIST_TIMEOUT
    )


@atexit.register
def _kill_unread() -> None:
    while _EARLY:
        proc, _ = _EARLY.popitem()[1]
        kill_group(proc)
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
