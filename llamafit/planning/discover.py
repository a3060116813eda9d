"""The discovering stage: the server binary and what it accepts, the machine as that server sees it (its device
list in its environment, or the hardware ``--gpu``/``--host-ram`` describe), the RPC servers' devices in front
of the local GPUs, and the Hub resolver."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from llamafit.devices.described import described_host
from llamafit.devices.machine import Machine, discover
from llamafit.devices.rpc import discover_rpc, same_servers
from llamafit.errors import LlamafitError, UsageError
from llamafit.hub.resolve import Hub, offline_from_env
from llamafit.options import Options
from llamafit.paths import cache_dir
from llamafit.planning.asked import Asked
from llamafit.server.args import parse_server_args
from llamafit.server.binary import ServerBinary, find_server
from llamafit.server.capabilities import ASSUMED, Capabilities, probe
from llamafit.server.environment import ChildEnv, child_env


def server_and_caps(
    explicit: str | None, environ: dict[str, str] | None = None
) -> tuple[ServerBinary | None, Capabilities]:
    """The binary that would run and what it accepts; ASSUMED (b11434) when there is none."""
    try:
        srv = find_server(explicit, environ)
    except LlamafitError:
        if explicit:
            raise
        return None, ASSUMED
    caps = probe(srv.path, env=srv.env(), cache_dir=cache_dir())
    # a binary that lists no flags did not answer --completion-bash: plan for the reference build
    return srv, caps if caps.flags else ASSUMED


def discover_for(o: Options, srv: ServerBinary | None) -> Machine:
    """The machine as the server that will run sees it (its device list, in its environment); the host's RAM
    as ``--host-ram`` describes it, when it does."""
    host = described_host(o.host_ram) if o.host_ram else None
    if o.gpu or o.cpu_only or srv is None:
        return discover(gpu_specs=o.gpu, cpu_only=o.cpu_only, host=host)
    return discover(server=srv.path, server_env=launch_env(srv).env, cache=cache_dir(), host=host)


def machine_and_server(o: Options) -> tuple[Machine, tuple[ServerBinary | None, Capabilities]]:
    """The machine as the server that would run sees it, and that server with what it accepts. A bad
    ``--gpu`` is a usage error before any file or binary is touched."""
    if o.host_ram:
        described_host(o.host_ram)  # a bad --host-ram is a usage error before anything runs, too
    described = discover_for(o, None) if o.gpu else None
    found = server_and_caps(o.server)
    return described or discover_for(o, found[0]), found


def machine_for(mach: Machine, asked: Asked, srv: ServerBinary | None, o: Options) -> tuple[Machine, Asked]:
    """The machine a plan is made for: ``mach`` with the RPC servers the flags name in front of its GPUs, as
    llama.cpp orders them; a server named twice (two spellings of one address) is used once; an unreachable
    server under --rpc-optional is left out of the plan and of the server's --rpc."""
    req, user = asked.req, asked.user
    if not req.rpc:
        return mach, _with_margin_notes(mach, asked)
    once, merged = same_servers(req.rpc)
    notes = list(merged)
    mach, unreachable = machine_with_rpc(mach, once, srv, optional=o.rpc_optional, cpu_only=o.cpu_only)
    if unreachable or merged:
        up = [ep for ep in once if ep not in unreachable]
        if unreachable:
            notes.append(f"RPC server(s) {', '.join(unreachable)} unreachable: planned without them (--rpc-optional)")
        user = parse_server_args([*(["--rpc", ",".join(up)] if up else []), *user.without(["--rpc"]).tokens()])
        req = replace(req, server_args=user, rpc=tuple(up))
    return mach, _with_margin_notes(mach, replace(asked, user=user, req=req, notes=(*asked.notes, *notes)))


def _with_margin_notes(mach: Machine, asked: Asked) -> Asked:
    """``--margin DEV=SIZE`` for a device the plan does not have (a typo, a card not in this machine) is said,
    not silently unused."""
    ids = {g.id.upper(): g.id for g in mach.gpus}
    unknown = [k for k in asked.req.margins if k != "host" and k not in ids]
    if not unknown:
        return asked
    devices = ", ".join([*ids.values(), "host"])
    note = f"--margin {', '.join(unknown)}: no such device in this plan (its devices: {devices}); not used"
    return replace(asked, notes=(*asked.notes, note))


def machine_with_rpc(
    mach: Machine, endpoints: Sequence[str], srv: ServerBinary | None, *, optional: bool, cpu_only: bool
) -> tuple[Machine, tuple[str, ...]]:
    """The RPC servers' devices in front of the local GPUs, as llama.cpp orders them (src/llama.cpp:272),
    and the endpoints left out as unreachable (only with ``optional``)."""
    if cpu_only:
        raise UsageError("--cpu-only plans a load without offload devices, RPC ones included", hint="drop one")
    found = discover_rpc(endpoints, srv.path if srv else None, srv.env() if srv else None, optional=optional)
    return Machine((*found.devices, *mach.gpus), mach.host, mach.notes, mach.blind), tuple(found.unreachable)


def new_hub(offline: bool) -> Hub:
    """The Hub resolver: offline with --offline or HF_HUB_OFFLINE, headers cached in the user cache."""
    return Hub(offline=offline or offline_from_env(), cache=cache_dir())


def launch_env(srv: ServerBinary) -> ChildEnv:
    """The server's environment: ours without inherited llama.cpp settings, plus its library path."""
    return child_env(srv.env())
