"""What the server inherits besides its argv: environment variables and llama.cpp's config files.

llama-server applies, before its command line, ``/etc/llama.cpp/config.ini`` then
``${XDG_CONFIG_HOME:-~/.config}/llama.cpp/config.ini`` and every ``LLAMA_ARG_*`` variable
(docs/server-cli.md §1.1). List-valued options *add* to the command line's, so an inherited
``LLAMA_ARG_OVERRIDE_TENSOR`` would move weights the plan placed. The child therefore gets the
environment without them (reported), and config-file keys that would change the plan are reported.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llamafit import store
from llamafit.server.args import OPTIONS, ServerArgs, family_of, lookup

# Options whose value changes what is allocated (beyond the families llamafit plans explicitly).
MEMORY_KEYS = frozenset(
    {
        "--ctx-size",
        "--parallel",
        "--kv-unified",
        "--batch-size",
        "--ubatch-size",
        "--flash-attn",
        "--cache-type-k",
        "--cache-type-v",
        "--gpu-layers",
        "--tensor-split",
        "--split-mode",
        "--main-gpu",
        "--device",
        "--override-tensor",
        "--cpu-moe",
        "--n-cpu-moe",
        "--n-cpu-ffn",
        "--fit",
        "--fit-target",
        "--fit-ctx",
        "--swa-full",
        "--kv-offload",
        "--load-mode",
        "--lazy-mode",
        "--repack",
        "--no-host",
        "--op-offload",
        "--spec-type",
        "--spec-default",
        "--spec-draft-model",
        "--spec-draft-hf",
        "--spec-draft-ngl",
        "--spec-draft-device",
        "--spec-draft-type-k",
        "--spec-draft-type-v",
        "--spec-draft-n-max",
        "--mmproj",
        "--mmproj-offload",
        "--lora",
        "--lora-scaled",
        "--rpc",
        "--ctx-checkpoints",
        "--cache-ram",
        "--kv-unified-per-slot",
        "--model",
        "--hf-repo",
    }
)
SCRUBBED_EXACT = ("MTMD_BACKEND_DEVICE", "AIP_MODE")


@dataclass(frozen=True)
class ChildEnv:
    env: dict[str, str]
    removed: tuple[str, ...]  # variable names (never values: they may hold tokens)


def child_env(environ: Mapping[str, str], extra: Mapping[str, str] | None = None) -> ChildEnv:
    """``environ`` without inherited llama.cpp settings, plus what the plan sets."""
    removed = sorted(k for k in environ if k.startswith("LLAMA_ARG_") or k in SCRUBBED_EXACT)
    env = {k: v for k, v in environ.items() if k not in removed}
    env.update(extra or {})
    return ChildEnv(env, tuple(removed))


def inherited_settings(environ: Mapping[str, str]) -> str | None:
    """Said where no launch follows (``plan``, ``run --dry-run``; a launch says what it leaves out as it starts):
    the ``LLAMA_ARG_*`` variables llama-server would read, which a launch drops (``child_env``) and the plan did
    not read, by name and flag, never value (they may hold tokens)."""
    names = sorted(k for k in environ if k.startswith("LLAMA_ARG_"))
    if not names:
        return None
    by_env = {o.env: o for o in OPTIONS.values() if o.env}
    shown = [f"{k} ({by_env[k].aliases[0]})" if k in by_env else k for k in names]
    return (
        ", ".join(shown) + " in the environment: not read by the plan and not passed to llama-server (llamafit "
        "launches it without them); give what you meant after --"
    )


def config_paths(environ: Mapping[str, str]) -> list[Path]:
    """The config files llama.cpp applies, in order (common/arg.cpp:722-766, common.cpp:1010-1024)."""
    xdg = environ.get("XDG_CONFIG_HOME") or os.path.join(environ.get("HOME", str(Path.home())), ".config")
    return [Path("/etc/llama.cpp/config.ini"), Path(xdg) / "llama.cpp" / "config.ini"]


@dataclass(frozen=True)
class ConfigEntry:
    path: str
    section: str
    key: str
    value: str
    option: str  # the option key it sets


def read_config(path: Path) -> list[ConfigEntry]:
    """The entries of the ``[*]`` and ``[default]`` sections (keys before any header are default)."""
    raw_bytes = store.read_bytes(path, 1 << 20)  # a FIFO or a huge file in its place is not llama.cpp's config
    if raw_bytes is None:
        return []
    text = raw_bytes.decode("utf-8", "replace")
    by_env = {o.env: o for o in OPTIONS.values() if o.env}
    section = "default"
    out: list[ConfigEntry] = []
    for raw in text.splitlines()[:10000]:
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if section not in ("*", "default"):
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        opt = by_env.get(key)
        if opt is None:
            hit = lookup("--" + key) or lookup("-" + key)
            opt = hit[0] if hit else None
        if opt is not None:
            out.append(ConfigEntry(str(path), section, key, value, opt.key))
    return out


def config_findings(environ: Mapping[str, str], argv_args: ServerArgs) -> list[str]:
    """Config-file entries that would change the memory the plan predicted, as warnings."""
    out = []
    for path in config_paths(environ):
        if not path.is_file():
            continue
        for e in read_config(path):
            if e.option not in MEMORY_KEYS:
                continue
            fam = family_of(e.option)
            opt = OPTIONS[e.option]
            overridden = argv_args.has(e.option) or (fam is not None and argv_args.sets_family(fam))
            if overridden and not opt.accumulates:
                continue  # the command line replaces it
            what = "adds to" if opt.accumulates else "sets"
            out.append(
                f"{e.path} [{e.section}] {e.key} = {e.value!r} {what} {e.option} for llama-server, which the plan "
                "did not count; move it to the command line (after --) or remove it"
            )
    return out
