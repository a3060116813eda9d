"""Extra args: aliases, underscores, arity, accumulation, last-wins, and the user winning by removal."""

from __future__ import annotations

import pytest

from llamafit.errors import UsageError
from llamafit.fit.argv import server_defaults
from llamafit.fit.request import FFN_EXPS_REGEX, build_request
from llamafit.server.args import OPTIONS, Planned, compose, lookup, parse_server_args


def test_every_alias_maps_to_one_option() -> None:
    assert lookup("-c")[0] is lookup("--ctx-size")[0]  # type: ignore[index]
    assert lookup("--ctx_size")[0].key == "--ctx-size"  # type: ignore[index]
    assert lookup("-ngl")[0] is lookup("--n-gpu-layers")[0]  # type: ignore[index]
    assert lookup("-md")[0].key == "--spec-draft-model"  # type: ignore[index]
    # single-dash tokens are not normalised (common/arg.cpp:823-828)
    assert lookup("-no_kvu") is None
    opt, neg = lookup("-nkvo")  # type: ignore[misc]
    assert opt.key == "--kv-offload" and neg


def test_arity_keeps_negative_values_as_values() -> None:
    a = parse_server_args(["-ngl", "-1", "--fit", "off", "--swa-full", "-c", "4096"])
    assert [o.tokens for o in a.items] == [("-ngl", "-1"), ("--fit", "off"), ("--swa-full",), ("-c", "4096")]


def test_missing_value_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="expects 1 value"):
        parse_server_args(["-c"])


def test_flag_equals_value_is_refused_with_the_fix() -> None:
    with pytest.raises(UsageError, match="does not accept") as e:
        parse_server_args(["--ctx-size=4096"])
    assert e.value.hint is not None and "--ctx-size 4096" in e.value.hint


def test_unknown_flags_pass_through_untouched() -> None:
    a = parse_server_args(["--frobnicate", "7", "--shiny", "-c", "2048"])
    assert a.tokens() == ["--frobnicate", "7", "--shiny", "-c", "2048"]
    assert a.items[0].option is None


def test_last_wins_across_aliases() -> None:
    req = build_request(parse_server_args(["-c", "4096", "--ctx_size", "8192"]))
    assert req.ctx == 8192
    req = build_request(parse_server_args(["-kvu", "-np", "2", "--no-kv-unified"]))
    assert req.kv_unified is False and req.n_seq == 2


def test_overrides_accumulate_in_order() -> None:
    req = build_request(parse_server_args(["-ot", "a=CPU,b=CUDA1", "--cpu-moe", "-ncmoe", "2", "-ot", "c=CPU"]))
    assert req.overrides is not None
    pats = [o.pattern for o in req.overrides]
    assert pats == ["a", "b", FFN_EXPS_REGEX, rf"blk\.0{FFN_EXPS_REGEX}", rf"blk\.1{FFN_EXPS_REGEX}", "c"]
    assert [o.buft for o in req.overrides][:2] == ["CPU", "CUDA1"]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["-c", "8k"], "integer"),
        (["-fa"], "expects 1 value"),
        (["-fa", "maybe"], "on, off or auto"),
        (["-fa", "ON"], "on, off or auto"),  # llama-server compares exactly: "ON" would stop it
        (["--fit", " on"], "on, off"),
        (["--pooling", "avg"], "none, mean, cls, last or rank"),
        (["--pooling", "MEAN"], "none, mean, cls, last or rank"),
        (["-ctk", "q3_K"], "unsupported cache type"),
        (["-ot", "noequals"], "regex"),
        (["-ot", "(=CPU"], "not a valid regex"),
        (["-ts", "a,b"], "proportions"),
        (["-np", "0"], "refuse -np 0"),
        (["-lm", "turbo"], "auto, none"),
    ],
)
def test_bad_values_are_explained(args: list[str], match: str) -> None:
    with pytest.raises(UsageError, match=match):
        build_request(parse_server_args(args))


def test_a_negative_slot_count_is_the_servers_auto() -> None:
    # llama-server takes any -np below 0 as auto: 4 slots and one unified KV cache, even under --no-kv-unified
    # (tools/server/server.cpp:168-173)
    for args in (["-np", "-1"], ["-np", "-3", "--no-kv-unified"], []):
        s = server_defaults(build_request(parse_server_args(args)))
        assert (s.n_seq, s.kv_unified) == (4, True), args
    assert server_defaults(build_request(parse_server_args(["-np", "2"]))).n_seq == 2


def test_ubatch_zero_is_the_logical_batch() -> None:
    # llama-context.cpp:250; with --embedding the server sets -b to -ub first
    # (tools/server/server.cpp:162-166): both 0 fail
    assert build_request(parse_server_args(["-ub", "0"])).n_ubatch == 2048
    assert build_request(parse_server_args(["-b", "1024", "-ub", "0"])).n_ubatch == 1024
    with pytest.raises(UsageError, match="refuse -ub 0 with --embedding"):
        build_request(parse_server_args(["-ub", "0", "--embedding"]))


def test_the_user_wins_by_removal_not_duplication() -> None:
    planned = [
        Planned("model", ("-m", "m.gguf")),
        Planned("ctx", ("-c", "32768")),
        Planned("ngl", ("-ngl", "all")),
        Planned("overrides", ("--n-cpu-moe", "3")),
        Planned("fit", ("-fit", "off")),
    ]
    user = parse_server_args(["--ctx-size", "8192", "-ot", r"exps=CPU", "--port", "9000"])
    argv = compose("llama-server", planned, user)
    assert argv == [
        "llama-server", "-m", "m.gguf", "-ngl", "all", "-fit", "off",
        "--ctx-size", "8192", "-ot", "exps=CPU", "--port", "9000",
    ]  # fmt: skip


def test_rpc_goes_first_because_devices_are_resolved_at_parse_time() -> None:
    user = parse_server_args(["-dev", "RPC0", "--rpc", "10.0.0.2:50052"])
    argv = compose("llama-server", [Planned("model", ("-m", "m.gguf"))], user)
    assert argv.index("--rpc") < argv.index("-dev")


def test_table_has_every_family_member() -> None:
    from llamafit.server.args import FAMILIES

    for keys in FAMILIES.values():
        for k in keys:
            assert k in OPTIONS, k
