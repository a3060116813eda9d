#!/usr/bin/env python3
"""Generate llamafit/server_options.py from llama.cpp's common/arg.cpp.

Usage: python tools/gen_server_options.py path/to/llama.cpp/common/arg.cpp > llamafit/server_options.py

Each ``add_opt(common_arg(...))`` becomes one row: its aliases, negated aliases, arity (from the
handler's signature), env name, and the examples (tools) that accept it. What accumulates on repeat
is not visible in a signature, so it comes from the table in shared/reference/llama-server-cli.md §1.3
(ACCUMULATE below). Run it again when moving to a new llama.cpp build and commit the result.
"""

from __future__ import annotations

import re
import sys

ACCUMULATE = {
    "--override-tensor",
    "--cpu-moe",
    "--n-cpu-moe",
    "--n-cpu-ffn",
    "--spec-draft-override-tensor",
    "--spec-draft-cpu-moe",
    "--spec-draft-n-cpu-moe",
    "--spec-type",
    "--spec-default",
    "--lora",
    "--lora-scaled",
    "--control-vector",
    "--control-vector-scaled",
    "--alias",
    "--tags",
    "--rpc",
    "--override-kv",
    "--reverse-prompt",
    "--api-key",
    "--image",
}


def blocks(src: str):
    i = 0
    key = "add_opt(common_arg("
    while True:
        i = src.find(key, i)
        if i < 0:
            return
        j = i + len("add_opt(")
        depth = 0
        k = j
        in_str = False
        while k < len(src):
            c = src[k]
            if in_str:
                if c == "\\":
                    k += 2
                    continue
                if c == '"':
                    in_str = False
            elif c == '"':
                in_str = True
            elif c == "(":
                depth += 1
            elif c == ")":
                depth -= 1
                if depth == 0:
                    break
            k += 1
        # include the chained setters up to the closing of add_opt
        end = src.find(");", k)
        yield src[j : end + 1]
        i = end


STR_LIST = re.compile(r'\{\s*((?:"[^"]*"\s*,?\s*)+)\}')


def parse(block: str):
    m = STR_LIST.search(block)
    if not m:
        return None
    args = re.findall(r'"([^"]*)"', m.group(1))
    rest = block[m.end() :]
    neg: list[str] = []
    m2 = re.match(r"\s*,\s*\{\s*((?:\"[^\"]*\"\s*,?\s*)+)\}", rest)
    if m2:
        neg = re.findall(r'"([^"]*)"', m2.group(1))
    sig = re.search(r"\[[^\]]*\]\s*\(([^)]*)\)", re.sub(r"/\*.*?\*/", "", block))
    params = sig.group(1) if sig else ""
    n_params = params.count(",")
    arity = 0 if "bool" in params else n_params
    env = re.search(r'\.set_env\("([^"]+)"\)', block)
    ex = re.search(r"\.set_examples\(\{([^}]*)\}\)", block)
    exc = re.search(r"\.set_excludes\(\{([^}]*)\}\)", block)
    examples = (
        tuple(sorted(x.strip().replace("LLAMA_EXAMPLE_", "").lower() for x in ex.group(1).split(",") if x.strip()))
        if ex
        else ("common",)
    )
    excludes = (
        tuple(sorted(x.strip().replace("LLAMA_EXAMPLE_", "").lower() for x in exc.group(1).split(",") if x.strip()))
        if exc
        else ()
    )
    return args, neg, arity, env.group(1) if env else None, examples, excludes


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as fh:
        src = fh.read()
    rows = []
    seen = set()
    for b in blocks(src):
        p = parse(b)
        if p is None:
            continue
        args, neg, arity, env, examples, excludes = p
        key = next((a for a in args if a.startswith("--")), args[0])
        ident = (key, tuple(args))
        if ident in seen:
            continue
        seen.add(ident)
        acc = key in ACCUMULATE
        rows.append((key, tuple(args), tuple(neg), arity, acc, env, examples, excludes))
    print("# ruff: noqa: E501")
    print('"""llama-server options, generated from llama.cpp b11434 common/arg.cpp by tools/gen_server_options.py.')
    print()
    print("Do not edit by hand: regenerate. Each row: (key, aliases, negated aliases, arity,")
    print("accumulates, env, examples, excludes). Arity counts the values after the flag; a flag")
    print('pair (positive/negated aliases) has arity 0."""')
    print()
    print("from __future__ import annotations")
    print()
    print("Row = tuple[")
    print("    str, tuple[str, ...], tuple[str, ...], int, bool, str | None, tuple[str, ...], tuple[str, ...]")
    print("]")
    print()
    print("ROWS: tuple[Row, ...] = (")
    for r in rows:
        print(f"    {r!r},")
    print(")")


if __name__ == "__main__":
    main()
