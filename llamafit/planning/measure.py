"""The measuring stage: the devices' rates a plan reads, measured where llama-bench can reach them and nothing
is cached (within the plan's measuring time), else their backend's priors (``llamafit.speed.rate_source``).

It runs twice around the fit, and the fit only reads what it gave: ``before_fit`` gives the cards the fit may
choose a split between as they are known (measured before and cached, else their priors: a plan is not held
up measuring before it knows it fits), ``after_fit`` measures what the plan puts work on, so a plan that does
not fit measures nothing and a device the plan does not use is never measured. A first plan's choice between
splits reads the cards' priors; every later plan's, their measurement."""

from __future__ import annotations

import os
from collections.abc import Callable

from llamafit.devices.machine import Machine
from llamafit.devices.rates import parse_rate
from llamafit.fit.faster import split_devices
from llamafit.fit.plan import Plan
from llamafit.fit.speed import used_devices
from llamafit.memory.placement import CPU
from llamafit.options import Options
from llamafit.planning.discover import launch_env
from llamafit.planning.resolve import Resolved
from llamafit.server.binary import ServerBinary
from llamafit.speed.bench import rate_flags
from llamafit.speed.rate_source import MEASURE_BUDGET, Measured, Measuring, RateSource, ServedAs


def rate_source(
    mach: Machine,
    res: Resolved,
    srv: ServerBinary | None,
    o: Options,
    progress: Callable[[str], None] | None = None,
    budget: float = MEASURE_BUDGET,
) -> RateSource:
    """What measures the devices for this model as the server will run it: its thread count, repacking, flash
    attention and cache types; ``budget``: the seconds it may spend measuring (0: cached measurements only)."""
    user = res.asked.user
    bw = parse_rate(o.host_bandwidth, "--host-bandwidth") if o.host_bandwidth else None
    served = ServedAs(
        srv.path if srv else None,
        launch_env(srv).env if srv else dict(os.environ),
        res.asked.req.threads,
        tuple(rate_flags(user)),
        max(32, min(res.asked.req.n_ubatch, 2048)),  # the ubatch the server runs prompts in
        bw,
        o.host_cores,
    )
    here = not (o.gpu or o.host_ram)  # described hardware is not measured here
    return RateSource(mach, res.model, served, Measuring(here, budget, o.calibrate), progress=progress)


def before_fit(source: RateSource, mach: Machine, res: Resolved) -> Measured:
    """The rates the fit reads: every device it may place work on (the cards and the host) as cached, else their
    priors or what is assumed of them (``llamafit.speed.rate_source``): the choice between placements weighs them."""
    return source.measured([*split_devices(mach, res.asked.req), *(g.id for g in mach.gpus), CPU], measure=False)


def after_fit(source: RateSource, plan: Plan) -> Measured:
    """The rates the plan's speed reads: every device it puts work on (an RPC server not measured: what is assumed of
    it, which the choice did not weigh)."""
    return source.measured(used_devices(plan), depth=plan.footprint.context.n_ctx_seq, priced=True)
