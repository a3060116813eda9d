"""The devices a load offloads to: what the server would pick from the machine and the request."""

from __future__ import annotations

from llamafit.devices.machine import Device, Machine
from llamafit.errors import UsageError
from llamafit.fit.request import Request

# -ts takes fewer values than llama_max_devices() = 16 (common/arg.cpp:2843, src/llama.cpp:86-88)
MAX_SPLIT_DEVICES = 15


def select_gpus(machine: Machine, req: Request) -> list[Device]:
    """The devices the server will offload to: all, the ``-dev`` ones, or the main one with ``-sm none``."""
    if req.cpu_only:
        return []
    gpus = list(machine.gpus)
    if req.devices is not None:
        by_id = {g.id: g for g in gpus}
        chosen = []
        for name in req.devices:
            if name not in by_id:
                raise UsageError(
                    f"-dev {name}: no such device", hint="devices: " + (", ".join(by_id) or "none (CPU only)")
                )
            chosen.append(by_id[name])
        gpus = chosen
    if req.split_mode == "none" and gpus:
        # one device, -mg's; below 0 none at all; past the last one the load fails (src/llama.cpp:288-300)
        if req.main_gpu >= len(gpus):
            raise UsageError(
                f"llama-server would refuse -mg {req.main_gpu} with -sm none: there "
                + (f"are {len(gpus)} devices (-mg 0 to {len(gpus) - 1})" if len(gpus) > 1 else "is one device (-mg 0)"),
                hint="devices in llama-server's order: " + ", ".join(g.id for g in gpus),
            )
        gpus = [gpus[req.main_gpu]] if req.main_gpu >= 0 else []
    if len(gpus) > MAX_SPLIT_DEVICES:
        if req.devices is not None:
            raise UsageError(
                f"-dev names {len(gpus)} devices; llama.cpp splits a model over at most {MAX_SPLIT_DEVICES}",
                hint="name fewer devices with -dev",
            )
        gpus = gpus[:MAX_SPLIT_DEVICES]  # the plan says so (messages.devices_capped)
    return gpus
