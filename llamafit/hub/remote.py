"""The Hub over the network, through huggingface_hub's public API (its endpoint, token, proxies).

* :meth:`HubClient.listing`: the commit a revision points at, and every file with its size.
* :meth:`HubClient.header`: one GGUF header read with HTTP Range requests through the library's
  session: 64 KiB first, then what the rest of the header needs at least (gguf.reader's estimate
  from the vocabulary's and the tensor table's counts), 64 MiB in all, each response read no further
  than asked even if a server ignores Range.
  Parsed prefixes are cached by (endpoint, repo, commit, path, size) in the user cache directory,
  so a second plan makes no header request.
* :meth:`HubClient.download`: ``hf_hub_download`` into the shared cache (resumable, atomic).

The token (``HF_TOKEN`` or the one ``hf auth login`` stored) is the library's business: llamafit
never reads, prints or logs it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from llamafit import store
from llamafit.errors import AccessError, BadModelFileError, LlamafitError, ModelNotFoundError, NetworkError
from llamafit.gguf.extents import remembered
from llamafit.gguf.reader import GGUFHeader, read_header
from llamafit.hub.cache import COMMIT_ID, repo_folder
from llamafit.hub.select import HubFile, is_safe_repo_path

FIRST_RANGE = 64 << 10  # a small header in one request; the counts it holds size the next ones
MAX_REMOTE_HEADER = 64 << 20  # the largest real headers (262k-token vocabularies) are under 16 MiB
TIMEOUT = 20.0  # seconds per request (LLAMAFIT_HUB_TIMEOUT changes it)
T = TypeVar("T")


def hub_timeout() -> float:
    """Seconds one Hub request may take: $LLAMAFIT_HUB_TIMEOUT, else TIMEOUT."""
    raw = os.environ.get("LLAMAFIT_HUB_TIMEOUT", "")
    try:
        v = float(raw)
    except ValueError:
        return TIMEOUT
    return v if 0 < v < 3600 else TIMEOUT


def bounded(fn: Callable[[], T], seconds: float, what: str) -> T:
    """``fn()`` with a deadline, for library calls that take no timeout (huggingface_hub's paginated
    tree listing runs on a client without one): past it, a NetworkError; the worker is left to the
    daemon thread it runs on."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller's thread as it is
            box["error"] = e

    t = threading.Thread(target=work, name=what, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise NetworkError(
            f"{what} got no answer within {seconds:.0f} s",
            hint="the Hub (HF_ENDPOINT) may be stalled: try again, raise LLAMAFIT_HUB_TIMEOUT, or plan from the "
            "cache with --offline",
        )
    if "error" in box:
        raise box["error"]
    return cast(T, box["value"])


def redacted(url: str) -> str:
    """``url`` as it may be shown: ``user:password@`` (HF_ENDPOINT may carry them) becomes ``***@``."""
    return _USERINFO.sub(r"\1***@", url)


_USERINFO = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@]*@")


_UNLIKE_HUB = "the endpoint (HF_ENDPOINT / MODEL_ENDPOINT) is not behaving like the Hub; refusing its listing"


def checked_commit(repo: str, endpoint: str, commit: str) -> str:
    """A listing is untrusted text: its commit and every path become parts of a cache path (and of
    ``-m``), so they are held to what huggingface_hub accepts (``REGEX_COMMIT_HASH``; a pointer path
    inside ``snapshots/``, ``file_download.py:_get_pointer_path``) before anything is planned."""
    if not COMMIT_ID.match(commit):
        raise ModelNotFoundError(
            f"{redacted(endpoint)} answered a commit for {repo} that is not a commit id: {commit[:60]!r}",
            hint=_UNLIKE_HUB,
        )
    return commit


def checked_files(repo: str, endpoint: str, files: list[HubFile]) -> None:
    """Every listed path stays inside the repo (``checked_commit``)."""
    where = redacted(endpoint)
    for f in files:
        if not is_safe_repo_path(f.path):
            raise ModelNotFoundError(
                f"{where} listed a file of {repo} whose path would leave the repo: {f.path[:200]!r}",
                hint=_UNLIKE_HUB,
            )


def endpoint_from_env(env: dict[str, str] | None = None) -> str:
    """llama.cpp's choice (common/common.cpp:1520-1533): MODEL_ENDPOINT, else HF_ENDPOINT, else the Hub."""
    e = os.environ if env is None else env
    return (e.get("MODEL_ENDPOINT") or e.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


@contextmanager
def translated(repo: str, what: str, endpoint: str = "") -> Iterator[None]:
    """huggingface_hub's and the transport's exceptions, as llamafit errors with what to do next."""
    from huggingface_hub import errors as hf

    endpoint = redacted(endpoint)
    try:
        yield
    except LlamafitError:
        raise
    except hf.GatedRepoError:
        raise AccessError(
            f"{repo} is a gated repo: its files need an accepted licence and a token",
            hint="accept the terms on the repo's Hub page, then set HF_TOKEN to a read token (or run `hf auth login`)",
        ) from None
    except hf.RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"no repo {repo} on the Hub (or it is private)",
            hint="check the owner/name; for a private repo set HF_TOKEN",
        ) from None
    except hf.RevisionNotFoundError:
        raise ModelNotFoundError(f"{repo} has no such revision", hint="check --revision") from None
    except hf.EntryNotFoundError:
        raise ModelNotFoundError(f"{repo}: {what} is not in the repo") from None
    except hf.OfflineModeIsEnabled:
        raise NetworkError(
            f"{what} needs the network, and offline mode is on (HF_HUB_OFFLINE)",
            hint="download the files first, or unset HF_HUB_OFFLINE",
        ) from None
    except hf.HfHubHTTPError as e:
        status = e.response.status_code if getattr(e, "response", None) is not None else "?"
        if status in (401, 403):
            raise AccessError(f"the Hub refused {what} for {repo} (HTTP {status})", hint="set HF_TOKEN") from None
        raise NetworkError(f"the Hub answered HTTP {status} to {what} for {repo}", hint="try again later") from None
    except json.JSONDecodeError:  # a JSON body that is not one: a proxy's or a portal's page, not the Hub's API
        raise NetworkError(
            f"{endpoint or 'the Hub'} did not answer {what} for {repo} like the Hub (not its JSON API)",
            hint="check HF_ENDPOINT / MODEL_ENDPOINT and proxies, or plan from the cache with --offline",
        ) from None
    except Exception as e:
        mod = type(e).__module__
        if mod.startswith(("httpx", "httpcore", "requests", "urllib3", "ssl", "socket")) or isinstance(e, OSError):
            kind = "timed out" if "timeout" in type(e).__name__.lower() else "failed"
            raise NetworkError(
                f"{what} for {repo} at {endpoint or 'the Hub'} {kind}: {type(e).__name__}",
                hint="check the network (HF_ENDPOINT, proxies), or plan from the cache with --offline",
            ) from None
        raise


class RemoteSource:
    """A ByteSource over one Hub file: what the parser asks for, one Range request per read, kept
    (contiguous from byte 0) so the header prefix can be cached."""

    def __init__(self, fetch: Callable[[int, int], bytes], name: str, size: int) -> None:
        self.fetch = fetch
        self.name = name
        self.size = size
        self.buf = bytearray()

    def read(self, offset: int, n: int) -> bytes:
        end = min(offset + n, self.size)
        if end > MAX_REMOTE_HEADER:
            raise BadModelFileError(
                f"{self.name}: the GGUF header runs past {MAX_REMOTE_HEADER >> 20} MiB; refusing to read further",
                hint="this does not look like a model file llama.cpp would load",
            )
        if len(self.buf) < end:
            chunk = self.fetch(len(self.buf), end - len(self.buf))
            self.buf += chunk
        return bytes(self.buf[offset:end])


class PrefixSource:
    """A cached header prefix standing in for the whole file."""

    def __init__(self, prefix: bytes, name: str, size: int) -> None:
        self.prefix, self.name, self.size = prefix, name, size

    def read(self, offset: int, n: int) -> bytes:
        # fewer bytes than asked past the prefix; the parser only fails if it truly needs them
        return self.prefix[offset : offset + n]


@dataclass(frozen=True)
class Listing:
    repo: str
    commit: str
    files: tuple[HubFile, ...]
    gated: bool = False


class HubClient:
    def __init__(self, endpoint: str | None = None, cache_dir: Path | None = None) -> None:
        self.endpoint = endpoint or endpoint_from_env()
        self.cache_dir = cache_dir
        self.header_bytes = 0

    def _api(self) -> Any:
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint)

    def listing(self, repo: str, revision: str | None = None) -> Listing:
        """The commit ``revision`` (default: the default branch) points at, and its files with sizes."""
        api = self._api()
        timeout = hub_timeout()
        where = redacted(self.endpoint)
        with translated(repo, "listing the repo", self.endpoint):
            # the library's timeout is per read: a server that drips its answer is cut by the deadline
            info = bounded(
                lambda: api.model_info(repo, revision=revision, timeout=timeout), timeout, f"{repo}'s info at {where}"
            )
            commit = checked_commit(repo, self.endpoint, str(info.sha))

            def tree() -> list[HubFile]:
                files = []
                for entry in api.list_repo_tree(repo, recursive=True, revision=commit):
                    if type(entry).__name__ != "RepoFile":
                        continue
                    lfs = getattr(entry, "lfs", None)
                    oid = getattr(lfs, "sha256", None) if lfs is not None else getattr(entry, "blob_id", None)
                    files.append(HubFile(str(entry.path), int(entry.size), str(oid) if oid else None))
                return files

            files = bounded(tree, 3 * timeout, f"listing the files of {repo} at {where}")
        checked_files(repo, self.endpoint, files)
        return Listing(repo, commit, tuple(files), bool(getattr(info, "gated", False)))

    # -- headers -----------------------------------------------------------------------------------

    def _key(self, repo: str, commit: str, f: HubFile) -> str:
        raw = f"{self.endpoint}|{repo}|{commit}|{f.path}|{f.size}|{f.oid or ''}"
        return hashlib.sha256(raw.encode()).hexdigest()[:40]

    def _cached_prefix(self, key: str) -> bytes | None:
        if self.cache_dir is None:
            return None
        # a cache entry is input: not a FIFO's wait, not more than a header can be
        return store.read_bytes(self.cache_dir / "hub-headers" / key, MAX_REMOTE_HEADER)

    def _store_prefix(self, key: str, data: bytes) -> None:
        if self.cache_dir is None:
            return
        with contextlib.suppress(OSError):
            store.write_bytes(self.cache_dir / "hub-headers" / key, data)  # never a half-written entry

    def _fetch(self, repo: str, commit: str, path: str) -> Callable[[int, int], bytes]:
        from huggingface_hub import get_session, hf_hub_url, hf_raise_for_status
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]

        url = hf_hub_url(repo, path, revision=commit, endpoint=self.endpoint)

        def fetch(offset: int, n: int) -> bytes:
            timeout = hub_timeout()  # for the whole request: a drip of bytes keeps each read alive
            return bounded(lambda: ranged(offset, n, timeout), timeout, f"reading the header of {repo}/{path}")

        def ranged(offset: int, n: int, timeout: float) -> bytes:
            headers = build_hf_headers()
            headers["Range"] = f"bytes={offset}-{offset + n - 1}"
            headers["Accept-Encoding"] = "identity"
            with (
                translated(repo, f"reading the header of {path}", self.endpoint),
                get_session().stream("GET", url, headers=headers, timeout=timeout, follow_redirects=True) as r,
            ):
                if r.status_code >= 400:
                    r.read()
                    hf_raise_for_status(r)
                if r.status_code == 200 and offset > 0:
                    raise NetworkError(f"the server of {repo} ignores Range requests; cannot read the header alone")
                out = bytearray()
                for chunk in r.iter_bytes():
                    out += chunk
                    if len(out) >= n:
                        break  # a server that ignored Range does not get to send the whole file
            self.header_bytes += min(len(out), n)
            return bytes(out[:n])

        return fetch

    def header(self, repo: str, commit: str, f: HubFile) -> GGUFHeader:
        """The GGUF header of one Hub file, from the cache or from the network."""
        key = self._key(repo, commit, f)
        name = f"{repo}/{f.path}"
        prefix = self._cached_prefix(key)
        if prefix is not None:
            try:
                return remembered(PrefixSource(prefix, name, f.size), f"hub:{key}", self.cache_dir)
            except BadModelFileError:
                pass  # a stale or short entry: read it again
        src = RemoteSource(self._fetch(repo, commit, f.path), name, f.size)
        h = read_header(src, first_read=FIRST_RANGE)
        self._store_prefix(key, bytes(src.buf))
        return h

    # -- downloads ---------------------------------------------------------------------------------

    def download(self, repo: str, commit: str, f: HubFile, hub_dir: Path) -> str:
        from huggingface_hub import hf_hub_download

        if f.oid:
            clean_stale_downloads(hub_dir, repo, f.oid)
        with translated(repo, f"downloading {f.path}", self.endpoint):
            return str(hf_hub_download(repo, f.path, revision=commit, cache_dir=str(hub_dir), endpoint=self.endpoint))


def clean_stale_downloads(hub_dir: Path, repo: str, etag: str) -> list[Path]:
    """Remove what an interrupted download of one blob left (``<etag>.<id>.incomplete``: huggingface_hub
    writes to a file of its own per process and cannot resume another's), but only while no process
    holds that blob's download lock (``.locks/<repo folder>/<etag>.lock``, the lock it takes)."""
    import fcntl

    folder = repo_folder(hub_dir, repo)
    blobs = folder / "blobs"
    stale = [p for p in blobs.glob(f"{etag}*.incomplete")] if blobs.is_dir() else []
    if not stale:
        return []
    lock = hub_dir / ".locks" / folder.name / f"{etag}.lock"
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        return []
    removed = []
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return []  # a download of this blob is running now: its file is not stale
    try:
        for p in stale:
            with contextlib.suppress(OSError):
                p.unlink()
                removed.append(p)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    return removed


def write_ref(hub_dir: Path, repo: str, branch: str, commit: str) -> None:
    """Point ``refs/<branch>`` at the commit, as a download by llama.cpp or huggingface_hub would, so
    llama.cpp's offline mode and ours find the snapshot."""
    refs = repo_folder(hub_dir, repo) / "refs"
    if not is_safe_repo_path(branch) or not COMMIT_ID.match(commit):
        return  # a revision such as ../x names no ref of this repo: nothing is written outside it
    try:
        refs.mkdir(parents=True, exist_ok=True)
        tmp = refs / f".{branch.replace('/', '_')}.{os.getpid()}"
        tmp.write_text(commit)
        target = refs / branch
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, target)
    except OSError:
        pass
