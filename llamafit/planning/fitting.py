"""The fitting stage: the memory fit of a resolved model onto a machine (``llamafit.fit``), with past launches'
corrections, its compute held to the binary's own no-alloc measurement where the plan is not sure of it
(``llamafit.planning.bound``), and the composing of the exact argv with only flags the binary accepts."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from llamafit.devices.machine import Machine
from llamafit.devices.rates import Rates
from llamafit.errors import DoesNotFitError
from llamafit.fit import Inputs, make_plan
from llamafit.fit.plan import Decision, Plan
from llamafit.hub.resolve import Hub
from llamafit.memory.calibration import Corrections, corrections, measured_mmproj_compute
from llamafit.memory.footprint import LoadSettings
from llamafit.options import Options
from llamafit.planning import bound
from llamafit.planning.resolve import Resolved
from llamafit.server.args import ServerArgs, compose
from llamafit.server.binary import ServerBinary
from llamafit.server.capabilities import Capabilities
from llamafit.server.compat import supported


def compose_argv(plan: Plan, srv: ServerBinary | None, caps: Capabilities, user: ServerArgs) -> list[str]:
    """The server's argv: the plan's flags the binary accepts, then the user's (last wins)."""
    return compose(srv.path if srv else "llama-server", supported(plan.planned, caps)[0], user)


def fit(
    res: Resolved,
    mach: Machine,
    srv: ServerBinary | None,
    caps: Capabilities,
    o: Options,
    *,
    hub: Hub | None = None,
    rates: Mapping[str, Rates] | None = None,
) -> tuple[Plan, list[str]]:
    """The plan and its argv (``rates``: the cards' speeds, where the fit chooses between splits); held to the
    binary's no-alloc measurement when it has reasons to be (``bound.reasons``) and the binary is here."""
    user = res.asked.user

    def plan_with(scale: Mapping[str, float]) -> Plan:
        """The plan, its compute buffers scaled to the binary's no-alloc measurement."""

        def calib(s: LoadSettings, devices: tuple[str, ...]) -> Corrections:
            c = corrections(res.model, s, devices) if o.calibrate else Corrections()
            return replace(c, measured_scale=dict(scale)) if scale else c

        try:
            inputs = Inputs(
                caps,
                calib if o.calibrate or scale else None,
                mmproj=res.projector,
                mmproj_measured=measured_mmproj_compute if o.calibrate else None,
                drafter_files=hub,
                rates=rates,
                adapters=res.adapters,
            )
            return make_plan(res.model, mach, res.asked.req, res.asked.spec, inputs)
        except DoesNotFitError as e:
            if e.plan is None:
                raise
            raise e.but(argv=compose_argv(e.plan, srv, caps, user)) from e

    def replan(scale: Mapping[str, float]) -> tuple[Plan, list[str]]:
        p = plan_with(scale)
        return p, compose_argv(p, srv, caps, user)

    plan, argv = replan({})
    if srv is not None and (why := bound.reasons(plan)):
        plan, argv, held = bound.bounded(plan, argv, replan, srv, why)
        plan = replace(plan, memory_bound=held, decisions=(*plan.decisions, Decision("memory.bound", held.message)))
    return plan, argv
