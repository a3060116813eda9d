"""llamafit's speculative options (--spec, --prefer, --draft) joined with the drafter flags of the extra args."""

from __future__ import annotations

from dataclasses import dataclass

from llamafit.errors import UsageError
from llamafit.memory.placement import FFN_EXPS_REGEX, Override, n_cpu_moe_overrides, override_entries
from llamafit.server.args import ServerArgs
from llamafit.server.values import int_value, kv_type_value
from llamafit.speculative.kinds import DEFAULT_N_MAX, SPEC_TYPES


@dataclass(frozen=True)
class SpecOptions:
    """Speculative settings from llamafit's options and the user's extra args."""

    mode: str = "auto"  # auto | off | one of SPEC_TYPES
    prefer: str = "balanced"  # balanced | context | speed (llamafit.fit.choice)
    draft: str | None = None  # --draft
    user_types: tuple[str, ...] = ()  # --spec-type / --spec-default in the extra args (explicit)
    user_draft: str | None = None  # -md in the extra args (last wins)
    user_draft_hf: str | None = None  # -hfd in the extra args
    n_max: int = DEFAULT_N_MAX
    ngl: int = -1  # -ngld
    devices: tuple[str, ...] | None = None  # -devd (() = none)
    overrides: tuple[Override, ...] = ()  # -otd / -cmoed / -ncmoed
    type_k: str = "f16"  # -ctkd
    type_v: str = "f16"  # -ctvd
    ngram_mod_n_max: int = 64
    backend_sampling: bool = True  # --[no-]spec-draft-backend-sampling (common.h:335: on)

    @property
    def explicit(self) -> bool:
        return bool(self.user_types or self.user_draft or self.user_draft_hf or self.draft) or self.mode not in (
            "auto",
            "off",
        )


def spec_options(
    args: ServerArgs, *, mode: str = "auto", prefer: str = "balanced", draft: str | None = None
) -> SpecOptions:
    if mode not in ("auto", "off", *SPEC_TYPES[1:]):
        raise UsageError(f"--spec {mode!r} is not a speculative type", hint="auto, off, " + ", ".join(SPEC_TYPES[1:]))
    if prefer not in ("balanced", "context", "speed"):
        raise UsageError(f"--prefer {prefer!r}: expected balanced, context or speed")
    types: list[str] = []
    for o in args.items:
        if o.key == "--spec-type":
            for t in (o.value or "").split(","):
                if t not in SPEC_TYPES:
                    raise UsageError(f"--spec-type: unknown speculative type {t!r}", hint=", ".join(SPEC_TYPES))
                types.append(t)
        elif o.key == "--spec-default":
            types.append("ngram-mod")
    # a "none" in one value makes that value {none}, but cannot remove earlier types (docs/server-cli.md §3.1)
    kw: dict[str, object] = {}
    if (occ := args.last("--spec-draft-model")) is not None:
        kw["user_draft"] = occ.value
    if (occ := args.last("--spec-draft-hf")) is not None:
        kw["user_draft_hf"] = occ.value
    if (occ := args.last("--spec-draft-n-max")) is not None:
        kw["n_max"] = int_value(occ.value, occ.tokens[0], 0)
    if (occ := args.last("--spec-draft-ngl")) is not None:
        v = (occ.value or "").strip().lower()
        kw["ngl"] = -1 if v in ("auto", "all") else int_value(occ.value, occ.tokens[0], -2)
    if (occ := args.last("--spec-draft-device")) is not None:
        names = [d.strip().upper() for d in (occ.value or "").split(",") if d.strip()]
        kw["devices"] = () if names == ["NONE"] else tuple(names)
    ov: list[Override] = []
    for o in args.items:
        if o.key == "--spec-draft-override-tensor":
            ov += override_entries(o.value, "-otd")  # the checks -ot gets
        elif o.key == "--spec-draft-cpu-moe":
            ov.append(Override(FFN_EXPS_REGEX, "CPU"))
        elif o.key == "--spec-draft-n-cpu-moe":
            ov += n_cpu_moe_overrides(int_value(o.value, o.tokens[0], 0))
    kw["overrides"] = tuple(ov)
    if (occ := args.last("--spec-draft-type-k")) is not None:
        kw["type_k"] = kv_type_value(occ.value, occ.tokens[0])
    if (occ := args.last("--spec-draft-type-v")) is not None:
        kw["type_v"] = kv_type_value(occ.value, occ.tokens[0])
    if (on := args.flag("--spec-draft-backend-sampling")) is not None:
        kw["backend_sampling"] = on
    if (occ := args.last("--spec-ngram-mod-n-max")) is not None:
        kw["ngram_mod_n_max"] = int_value(occ.value, occ.tokens[0], 0)
    return SpecOptions(mode=mode, prefer=prefer, draft=draft, user_types=tuple(types), **kw)  # type: ignore[arg-type]
