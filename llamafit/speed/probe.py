"""The bounded speed probe: what each device does per second, measured with the llama-bench of the build
that will serve, on the synthetic models of ``llamafit.speed.probe_models``, and cached.

Per device (every layer on it: ``-dev none -ngl 0`` for the host, ``-dev NAME -ngl 99`` for an offload
device), with the thread count the server will use:

1. ``tiny-1`` and ``tiny-9`` generating: the per-node overhead (8 layers' difference over their compute
   nodes) and what is left of one evaluation: the host's own time (graph build, scheduling), or for an
   offload device its graph split's (a synchronisation, an RPC round trip); for an offload device, tiny-9
   again with 8 of its layers' attention outputs on the host (``VISITS``): what each further visit to the
   device within an evaluation costs, which is not its first (on loopback RPC 0.13-0.43 ms a visit against
   1.3-2.8 ms for the first, whose inputs, graph and output cross each time);
2. per weight type the model streams, ``stream-<type>`` generating: bytes/s from memory;
3. the model's twin generating (the cache-resident mat-vec rate: the compute ceiling) and prompting (the
   batched matmul rate at the model's shapes);
4. the attention twin generating and prompting at depth 0 and ``depth``: the cache's bytes/s in
   generation, attention FLOP/s in a ubatch (the difference between the depths is attention alone);
5. for a GPU, the twin prompting with its FFN weights in host memory (op offload copies them for every
   ubatch): its link to host memory.

Every rate is derived from these timings and the probe models' known bytes, FLOPs and nodes by the same
accounting the speed model uses (``llamafit.speed.work``), so the model reproduces each probe. Sizes adapt
to the device: a device too slow to stream ``STREAM_BYTES`` in a second is not asked to (it is
compute-bound, and the twin's rate is its rate), and its prompts and depths are shortened to fit the
time a run is given. Timings are cached per llama-bench binary (path, size, mtime), device, thread count
and model shape; a cached entry is input like any other and is validated when read.
"""

from __future__ import annotations

import contextlib
import os
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from llamafit.devices.rates import Rates
from llamafit.gguf.model import load_model
from llamafit.memory.graph.replay import nodes_per_layer
from llamafit.speed import probe_models as pm
from llamafit.speed.attention_run import DEPTH_PLAN, Had, Sizing, attention_run
from llamafit.speed.bench import BenchError, BenchResult, run_bench
from llamafit.speed.busy import MAX_SPREAD

CALL_TIMEOUT = 180.0  # one llama-bench run
RUN_BUDGET = 10.0  # seconds a timed test should take at most, for choosing prompt lengths and depths
FIXED_NODES = 4  # compute nodes outside the layers, as llamafit.speed.work counts them (input rows, output)
# tiny-9's attention outputs of layers 1-8 on the host: each a split there and one back to the device, as the
# scheduler cuts a graph at every change of backend (ggml-backend.cpp:1437-1500); ";"-free, as -ot lists take ";"
VISITS = 8
VISIT_OVERRIDE = r"blk\.[1-8]\.attn_output=CPU"
VISITS_FIRST = 0.25  # of a plan's measuring time left, what timing a device's visits before its twin may take
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Target:
    """One device to probe: llama.cpp's name for it (``CPU`` for the host) and how llama-bench selects it."""

    device: str
    key: str  # identity for the cache: the device and what it is
    args: tuple[str, ...]  # llama-bench flags that put every layer there
    gpu: bool = False  # op offload reaches it (a CUDA/Vulkan-like device): its link is probed
    remote: bool = False  # behind ggml-rpc-server: a run is never cut short (a client killed mid-transfer
    # crashes the server, which is the user's), and its repetitions' spread is the network's, not a load's


def host_key() -> str:
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                name = line.split(":", 1)[1].strip()
                break
    return f"CPU:{name}:{os.cpu_count()}"


def host_target() -> Target:
    return Target("CPU", host_key(), ("-dev", "none", "-ngl", "0"))


def device_target(device: str, description: str, total: int, *, gpu: bool, rpc: Sequence[str] = ()) -> Target:
    rpc_args = ("-rpc", ",".join(rpc)) if rpc else ()
    return Target(
        device,
        f"{device}:{description}:{total}:{','.join(rpc)}",
        (*rpc_args, "-dev", device, "-ngl", "99"),
        gpu,
        remote=bool(rpc),
    )


@dataclass(frozen=True)
class Timings:
    """The probe's measurements on one device, in seconds: per token for generation, per prompt for prompting."""

    tiny1: float
    tiny9: float
    stream: Mapping[str, float]  # type -> per token of ``stream-<type>``
    twin_tg: float | None = None  # per token of the model's twin
    twin_pp: float | None = None  # per prompt of ``prompt`` tokens
    prompt: int = 0
    attn_tg0: float | None = None
    attn_tgd: float | None = None
    attn_pp0: float | None = None
    attn_ppd: float | None = None
    depth: int = 0
    offload: float | None = None  # the twin prompting with its FFN in host memory
    unvisited: float | None = None  # tiny-9 per token, in the run that times ``visited``
    visited: float | None = None  # tiny-9 per token with VISITS round trips to the host inside its graph


def _overheads(t: Timings, host: Rates | None, node_layer: float) -> tuple[float, float, float]:
    """(seconds per node, the host's own time per evaluation, this device's split)."""
    node = max(0.0, (t.tiny9 - t.tiny1) / (8 * node_layer))
    # both runs are one evaluation's fixed costs and their layers' nodes, so each bounds the fixed costs; they
    # agree unless tiny-9 ran faster than tiny-1 (the node cost clamped to 0: tiny-1 was held up, as loopback
    # RPC's round trips scatter 2x), and then the faster run is the one to believe
    one = t.tiny1 - (node_layer + FIXED_NODES) * node
    rest = max(0.0, min(one, t.tiny9 - (9 * node_layer + FIXED_NODES) * node))
    if host is None:
        return node, rest, 0.0
    return node, host.token, max(0.0, rest - host.token)


def _visit(t: Timings, host: Rates | None) -> float | None:
    """Seconds a further visit to this device costs within an evaluation: tiny-9's extra time a round trip to the
    host, less the host's part (the attention output's matmul: a node, its f16 bytes where the host streamed)."""
    if host is None or t.visited is None or t.unvisited is None:
        return None
    wo = pm.TINY9.n_head * pm.TINY9.head_v * pm.TINY9.n_embd * 2
    host_part = host.node + (wo / rate if (rate := host.read_rate("f16")) > 0 else 0.0)
    return max(0.0, (t.visited - t.unvisited) / VISITS - host_part)


def derive(
    t: Timings,
    *,
    host: Rates | None,
    node_layer: float,
    twin: pm.Twin | None,
    attn: pm.Twin | None,
    cache: int = 0,
    remote: bool = False,
) -> Rates:
    """Rates of one device from its probe timings; ``host``: the host's (None when this is the host); ``remote``:
    behind ggml-rpc-server, where each tensor read back is a round trip (ggml-rpc.cpp:743-750 waits for the
    data; a write, 720-741, does not), as the visit timed with one."""
    node, token, split = _overheads(t, host, node_layer)
    visit = _visit(t, host)
    overhead = token + split

    def left(total: float, tw: pm.Twin) -> float:
        return max(total - overhead - (tw.n_layer * (node_layer + tw.extra_nodes) + FIXED_NODES) * node, total * 0.05)

    stream = {ty: pm.streamed_bytes(pm.stream(ty)) / left(sec, pm.stream(ty)) for ty, sec in t.stream.items()}
    if twin is not None and t.twin_tg:
        rate = pm.streamed_bytes(twin) / left(t.twin_tg, twin)
        stream.update({ty: rate for _, ty in twin.types})  # the model's own layers, as big as they are
    attention = attention_batch = vector = None
    if attn is not None and t.attn_tgd is not None and t.attn_tg0 is not None and t.depth:
        kv = (attn.head_k + attn.head_v) * attn.n_head_kv * 2.0 * attn.n_layer  # f16 K and V rows per cell
        # a difference within the runs' noise (a slow device whose overheads dwarf attention at this depth)
        # measures nothing: the rate stays unknown and the model falls back to bytes and matmul FLOPs
        if (dt := t.attn_tgd - t.attn_tg0) > 0.05 * t.attn_tg0:
            attention = kv * t.depth / dt
            # the same run in FLOPs: each query head's dot product and multiply-add over a cached cell's K and V
            vector = 2.0 * attn.n_head * (attn.head_k + attn.head_v) * attn.n_layer * t.depth / dt
        if (
            t.attn_ppd is not None
            and t.attn_pp0 is not None
            and t.prompt
            and (dp := t.attn_ppd - t.attn_pp0) > (0.05 * t.attn_pp0)
        ):
            flops = 2.0 * attn.n_head * (attn.head_k + attn.head_v) * t.prompt * t.depth * attn.n_layer
            attention_batch = flops / dp
    matmul = None
    if twin is not None and t.twin_pp and t.prompt:
        own = 2.0 * twin.n_head * (twin.head_k + twin.head_v) * t.prompt * (t.prompt + 1) / 2 * twin.n_layer
        att = own / attention_batch if attention_batch else 0.0
        matmul = pm.matmul_flops(twin, t.prompt) / max(left(t.twin_pp, twin) - att, t.twin_pp * 0.05)
    link = None
    if twin is not None and t.offload is not None and t.twin_pp and t.prompt:
        link = pm.ffn_copied(twin, t.prompt) / max(t.offload - t.twin_pp, 1e-6)
    first = next(iter(stream.values()), 0.0)
    return Rates(
        read=first,
        read_by_type=tuple(stream.items()),
        matmul=matmul,
        attention=attention,
        attention_batch=attention_batch,
        vector=vector,
        node=node,
        split=split,
        visit=visit,
        readback=visit if remote and visit is not None else 0.0,
        token=token,
        link=link,
        source="measured",
        label="measured",
    )


@dataclass(frozen=True)
class Runner:
    """llama-bench as the server will run the model: the binary, its environment, the server's threads (``-t``)
    and the flags that change speed the way the server's do (``llamafit.speed.bench.rate_flags``)."""

    bench: str
    env: Mapping[str, str]
    threads: int | None = None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Subject:
    """What of a model the probe measures: its weight types streamed, the twin of its layers, the twin of its
    attention, the ubatch its prompts run in; ``directory``: where the twins are written."""

    types: tuple[str, ...]
    twin: pm.Twin | None
    attn: pm.Twin | None
    prompt: int
    directory: Path
    # the deepest cache its attention run may be timed at: DEPTH_PLAN within a plan's own time; with more (tune),
    # the plan's context, as a host's cost a cached cell changes with the depth
    depth: int = DEPTH_PLAN


def measure(
    runner: Runner,
    target: Target,
    subject: Subject,
    *,
    have: Timings | None = None,
    progress: Progress | None = None,
    deadline: float | None = None,
    spreads: list[float] | None = None,
) -> Timings:
    """Run what ``have`` lacks of the probe on one device, each run within ``CALL_TIMEOUT`` and before
    ``deadline`` (``time.monotonic()``). ProbeError when llama-bench cannot or the deadline came first, with
    what was measured before. ``spreads`` hears how far each run's repetitions disagreed
    (``BenchResult.spread``)."""
    done: list[Timings] = []

    def step(t: Timings) -> Timings:
        done[:] = [t]
        return t

    try:
        run = _Run(runner, target, deadline, spreads if spreads is not None else [])
        return _measure(run, subject, have, progress, step)
    except BenchError as e:
        raise ProbeError(str(e), done[0] if done else have, isinstance(e, _OutOfTime)) from None


class ProbeError(BenchError):
    """The probe stopped: llama-bench failed or ran past its own ``CALL_TIMEOUT``, or (``out_of_time``) the
    deadline its caller gave came first; ``partial``: what was measured before, worth keeping."""

    def __init__(self, message: str, partial: Timings | None, out_of_time: bool = False) -> None:
        super().__init__(message)
        self.partial = partial
        self.out_of_time = out_of_time


class _OutOfTime(BenchError):
    """A run stopped by the caller's deadline, not by anything wrong with llama-bench."""


@dataclass(frozen=True)
class _Run:
    """llama-bench on one device, each run within ``CALL_TIMEOUT`` and before ``deadline``."""

    runner: Runner
    target: Target
    deadline: float | None
    spreads: list[float]  # each result's repetitions' spread, for the caller to judge the runs by

    def __call__(self, args: list[str], reps: int = 1) -> list[BenchResult]:
        # one timed repetition after llama-bench's warm-up for the long tests, two for the short ones
        threads = self.runner.threads
        common = [*self.target.args, *self.runner.flags, *(["-t", str(threads)] if threads else [])]
        argv = [*args, *common, "-r", str(reps)]
        started = time.monotonic()
        results = self._bench(argv)
        if self.target.remote:
            return results
        took = time.monotonic() - started
        # repetitions that disagree were held up by something else for a moment (or for good): one run
        # again, where the time allows, tells which; the steadier of the two is kept and judged (a second run
        # that fails, or reports fewer tests, leaves the first to be judged)
        if _worst(results) > MAX_SPREAD and (self.deadline is None or self.deadline - time.monotonic() > 2 * took):
            with contextlib.suppress(BenchError):
                if _tests(again := self._bench(argv)) == _tests(results):
                    results = min(results, again, key=_worst)
        self.spreads.extend(r.spread for r in results)
        return results

    def _bench(self, argv: list[str]) -> list[BenchResult]:
        left = CALL_TIMEOUT if self.deadline is None else min(CALL_TIMEOUT, self.deadline - time.monotonic())
        if left <= 0:
            raise _OutOfTime("the time given to measuring ran out")
        if self.target.remote:
            left = CALL_TIMEOUT  # started, a run over RPC finishes: cut short, it would crash the RPC server
        started = time.monotonic()
        try:
            return run_bench(self.runner.bench, argv, dict(self.runner.env), left)
        except BenchError as e:
            if left < CALL_TIMEOUT and time.monotonic() - started >= left - 0.5:  # stopped at the deadline
                raise _OutOfTime(str(e)) from None
            raise


def _worst(results: Sequence[BenchResult]) -> float:
    return max((r.spread for r in results), default=0.0)


def _tests(results: Sequence[BenchResult]) -> set[tuple[str, int, int, int, int]]:
    return {(r.model, r.n_prompt, r.n_gen, r.n_depth, r.n_ubatch) for r in results}


def _measure(
    run: _Run, subject: Subject, have: Timings | None, progress: Progress | None, step: Callable[[Timings], Timings]
) -> Timings:
    types, twin, attn, prompt, directory = subject.types, subject.twin, subject.attn, subject.prompt, subject.directory
    say = progress or (lambda _m: None)
    target = run.target

    if have is not None and have.tiny1 and have.tiny9:
        t1, t9 = have.tiny1, have.tiny9
    else:
        say(f"{target.device}: overheads")
        tiny = [pm.ensure(pm.TINY, directory), pm.ensure(pm.TINY9, directory)]
        res = run(["-m", ",".join(map(str, tiny)), "-p", "0", "-n", "64"], reps=5)
        t1, t9 = (_one(res, str(p), gen=True) for p in tiny)
    tw_tg, tw_pp, n_prompt, off = (have.twin_tg, have.twin_pp, have.prompt, have.offload) if have else (None,) * 4
    base = have if have is not None else Timings(t1, t9, {})
    base = step(replace(base, tiny1=t1, tiny9=t9))
    if _visits_first(run, base):
        base = step(_visits(run, base, directory, say))
    if twin is not None and tw_tg is None:
        say(f"{target.device}: the model's layers")
        path = str(pm.ensure(twin, directory))
        # three repetitions: their median drops one held up (of two, the mean counts it: this machine's first plan
        # of an MoE once timed its twin 41 % slow), and their spread is judged (``_Run``)
        tw_tg = _one(run(["-m", path, "-p", "0", "-n", "8"], reps=3), path, gen=True)
        # the plan's ubatch, unless the device would take longer than a run may (a batched token takes at
        # most a quarter of a generated one's time on every backend measured: lavapipe's is the slowest);
        # never below 128 tokens (a slow device's matmuls get faster with the batch) unless even that is long
        fits = int(4 * RUN_BUDGET / max(tw_tg, 1e-6)) // 32 * 32
        n_prompt = max(min(128, prompt) if 128 * tw_tg / 4 <= 3 * RUN_BUDGET else 32, min(prompt, fits))
        if run.deadline is not None:
            # and within half of what the plan has left, warmed up and timed (a host at one thread prompts the
            # whole twin at 512 tokens in longer than a plan has; at 128 its rate is the same within a few %)
            left = run.deadline - time.monotonic()
            n_prompt = max(32, min(n_prompt, int(left / 2 / (2 * max(tw_tg, 1e-6) / 4)) // 32 * 32))
        tw_pp = _one(run(["-m", path, "-p", str(n_prompt), "-n", "0", "-ub", str(n_prompt)]), path, gen=False)
    n_prompt = n_prompt or prompt
    base = step(replace(base, twin_tg=tw_tg, twin_pp=tw_pp, prompt=n_prompt))
    stream = dict(have.stream) if have else {}
    rate = pm.streamed_bytes(twin) / tw_tg if twin is not None and tw_tg else None
    for ty in types:
        if ty in stream or (twin is not None and ty in dict(twin.types).values()):
            continue  # the twin streams the model's layer types itself
        big = pm.stream(ty)
        if rate and pm.streamed_bytes(big) / rate > 1.5:
            continue  # too slow to stream it in a run: compute-bound, the twin's rate is the device's
        say(f"{target.device}: streaming {ty} weights")
        path = str(pm.ensure(big, directory))
        stream[ty] = _one(run(["-m", path, "-p", "0", "-n", "8"]), path, gen=True)
        base = step(replace(base, stream=dict(stream)))
    a: tuple[float | None, ...] = (None,) * 4
    depth = have.depth if have else 0
    if have is not None:
        a = (have.attn_tg0, have.attn_tgd, have.attn_pp0, have.attn_ppd)
    time_left = None if run.deadline is None else run.deadline - time.monotonic()
    had = Had.of(have) if have is not None else Had()
    if attn is not None and (
        todo := attention_run(Sizing(attn, twin, tw_tg, tw_pp, n_prompt, subject.depth), time_left, had)
    ):
        depth, prompted = todo
        say(f"{target.device}: attention")
        path = str(pm.ensure(attn, directory))
        prompts = ["-p", str(n_prompt), "-ub", str(n_prompt)] if prompted else ["-p", "0"]
        res = run(["-m", path, *prompts, "-n", "16", "-d", f"0,{depth}"])
        got = {(r.n_depth, r.n_gen > 0): r.per_token if r.n_gen else r.seconds for r in res}
        a = (got.get((0, True)), got.get((depth, True)), got.get((0, False)), got.get((depth, False)))
        base = step(replace(base, attn_tg0=a[0], attn_tgd=a[1], attn_pp0=a[2], attn_ppd=a[3], depth=depth))
    if target.gpu and twin is not None and off is None and tw_pp:
        say(f"{target.device}: link to host memory")
        path = str(pm.ensure(twin, directory))
        res = run(["-m", path, "-p", str(n_prompt), "-n", "0", "-ub", str(n_prompt), "-ot", r"blk\..*\.ffn_.*=CPU"])
        off = _one(res, path, gen=False)
    out = Timings(
        t1, t9, stream, tw_tg, tw_pp, n_prompt, a[0], a[1], a[2], a[3], depth, off, base.unvisited, base.visited
    )
    if target.device != "CPU" and out.visited is None:  # last: a plan out of time prices each visit as a first
        out = _visits(run, step(out), directory, say)
    return out


def _visits(run: _Run, t: Timings, directory: Path, say: Progress) -> Timings:
    """``t`` with tiny-9's generation timed with and without VISITS round trips to the host inside its graph."""
    say(f"{run.target.device}: visits within a token")
    path = str(pm.ensure(pm.TINY9, directory))
    # both in one run (an empty -ot group is no override, llama-bench.cpp:958-965): they share its drift
    res = run(["-m", path, "-p", "0", "-n", "64", "-ot", f",{VISIT_OVERRIDE}"], reps=5)
    plain = _one([r for r in res if r.overrides == "none"], path, gen=True)
    visited = _one([r for r in res if r.overrides != "none"], path, gen=True)
    return replace(t, unvisited=plain, visited=visited)


def _visits_first(run: _Run, t: Timings) -> bool:
    """Whether a device's visits are timed right after its overheads: where their run (two graphs, a warm-up and
    five repetitions of 64 tokens of tiny-9) takes at most VISITS_FIRST of what a plan has left. Else they come
    last, as a slow device's (lavapipe's: 20 s) would leave no time for its twin; where a plan's time ends first,
    every visit is priced as a token's first, which for a split placement (experts on the host) is the larger part
    of its time on a fast link."""
    if run.target.device == "CPU" or t.visited is not None or run.deadline is None:
        return False
    return 2 * 6 * 64 * t.tiny9 <= VISITS_FIRST * (run.deadline - time.monotonic())


def _one(results: Sequence[BenchResult], model: str, *, gen: bool) -> float:
    for r in results:
        if r.model == model and (r.n_gen > 0) == gen:
            return r.per_token if gen else r.seconds
    raise BenchError(f"llama-bench reported no {'generation' if gen else 'prompt'} test for {Path(model).name}")


def probe_node_layer(directory: Path) -> float:
    """Compute nodes per layer of the probe models' graph (a Llama layer)."""
    return nodes_per_layer(load_model(str(pm.ensure(pm.TINY9, directory)))) or 19.0
