"""Weight sync to served engines: the trainer's weights in one file, loaded by every engine.

A router is a load balancer: a weight update sent through it would reach one engine. So the
trainer writes its weights to one safetensors file, finds the engines behind the router
(`/list_workers`), and has each load the file through vLLM's dev-mode `/collective_rpc`
(labkit.engines.served_sync is the engine side), then reset its prefix cache.

The file (labkit.engines.weights_file writes it) lives in a folder of its own per sync, in
/dev/shm when it has room: a file in memory costs no disk writes, and a disk's page cache
may throttle a gigabyte written every step. `describe_folder` says which it got (a
container's /dev/shm is often 64 MB), so a run's log shows it. The folder is removed in a
`finally`; one left by a trainer that was killed mid-sync (SIGKILL, out of memory) carries
that trainer's PID in its name, and the next sync removes it once the PID is gone
(`remove_stale_sync_folders`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from labkit.engines.served_sync import LOAD_WEIGHTS_METHOD
from labkit.errors import LabkitError
from labkit.serving.client import RouterUnavailable
from labkit.serving.cluster import WORKER_EXTENSION

# A sync folder is `labkit-weights-<pid>-<random>`; the PID says whose it is.
SYNC_FOLDER_PREFIX = "labkit-weights-"
# A folder of a dead PID is removed only when older than this: longer than a sync may take
# (sync_timeout_s), so a trainer whose PID this process cannot see (another PID namespace
# sharing /dev/shm) keeps the folder it is syncing from.
STALE_SYNC_AGE_S = 600.0
# /dev/shm is used only when it keeps this much free beside the file: it is the machine's
# memory, shared with everything else that runs there.
SHM_SPARE_BYTES = 2**30
MOUNTS = "/proc/mounts"  # Linux's table of mounts: which filesystem holds a folder


# ---------------------------------------------------------------------- weight sync
class WeightSyncFailed(LabkitError, RuntimeError):
    """An engine did not load the new weights: the next rollout would sample from old ones."""


async def sync_weights(base_url: str, path: str, engine_urls: Sequence[str] | None = None,
                       timeout_s: float = 600.0) -> dict[str, list]:
    """Have every engine load the weights file `path`, then reset its prefix cache (its
    entries hold keys and values of the old weights). Returns {engine url: worker results}.

    The engines are `engine_urls`, else the router's /list_workers; a URL without that
    endpoint (vLLM itself, `labkit serve --router none`) is taken as the one engine.
    """
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        urls = list(engine_urls or await list_engines(session, base_url))

        async def load(url: str) -> list:
            body = {"method": LOAD_WEIGHTS_METHOD, "kwargs": {"path": path}}
            answer = await _post_engine(session, url, "/collective_rpc", body)
            await _post_engine(session, url, "/reset_prefix_cache", None)
            return (json.loads(answer) if answer else {}).get("results", [])

        results = await asyncio.gather(*(load(u) for u in urls))
    return dict(zip(urls, results))


async def list_engines(session: aiohttp.ClientSession, base_url: str) -> list[str]:
    """The engine URLs behind a router (its /list_workers), or [base_url] if it is an engine."""
    base = base_url.rstrip("/")
    try:
        async with session.get(base + "/list_workers", timeout=aiohttp.ClientTimeout(total=10)) as r:
            status, body = r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise RouterUnavailable(
            f"the router at {base} does not answer {base}/list_workers ({type(e).__name__}: {e}); "
            f"start the engines and the router with `labkit serve`, or pass the URL it printed"
        ) from e
    if status == 404:
        return [base]
    try:
        urls = json.loads(body)["urls"]
    except (ValueError, KeyError, TypeError):
        urls = None
    if status != 200 or not urls:
        raise WeightSyncFailed(f"{base}/list_workers answered HTTP {status} ({body[:200]!r}): "
                               f"found no engines to send the new weights to")
    return [str(u).rstrip("/") for u in urls]


async def _post_engine(session: aiohttp.ClientSession, url: str, path: str,
                       body: dict | None) -> str:
    """POST to one engine; WeightSyncFailed naming the engine and the fix unless 200."""
    try:
        async with session.post(url + path, json=body) as r:
            status, text = r.status, await r.text()
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
        raise WeightSyncFailed(f"engine {url} did not answer {path} during the weight sync "
                               f"({type(e).__name__}: {e}); see its log in labkit serve's "
                               f"--log-dir") from e
    if status == 404:
        raise WeightSyncFailed(
            f"engine {url} has no {path}: it runs without VLLM_SERVER_DEV_MODE=1, so it cannot "
            f"take new weights. Start the engines with `labkit serve`, which sets it and "
            f"--worker-extension-cls {WORKER_EXTENSION}")
    if status != 200:
        hint = ""
        if LOAD_WEIGHTS_METHOD in text:
            hint = ("; the engine lacks labkit's worker method: start it with "
                    f"--worker-extension-cls {WORKER_EXTENSION} (labkit serve does)")
        raise WeightSyncFailed(f"engine {url}{path} answered HTTP {status} during the weight "
                               f"sync: {text[:300]}{hint}")
    return text


def fast_tmp(need_bytes: int) -> str | None:
    """/dev/shm (memory, Linux) when it has room for `need_bytes` and SHM_SPARE_BYTES more,
    else None (the default temp folder): a weights file per step costs no disk writes there."""
    free = shm_free_bytes()
    return "/dev/shm" if free is not None and free > need_bytes + SHM_SPARE_BYTES else None


def shm_free_bytes() -> int | None:
    """Free bytes in /dev/shm, or None where there is none."""
    try:
        return shutil.disk_usage("/dev/shm").free
    except OSError:
        return None


def describe_folder(path: str | Path) -> dict:
    """Where `path` lives: {"root", "kind": memory | disk | unknown, "fstype"}, from the
    mount that holds it (MOUNTS; tmpfs and ramfs are memory, unknown without the table)."""
    real = os.path.realpath(path)
    best, fstype = "", None
    try:
        with open(MOUNTS, encoding="utf-8", errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) < 3:
                    continue
                mount = parts[1].replace("\\040", " ")
                inside = real == mount or real.startswith(mount.rstrip("/") + "/")
                if inside and len(mount) >= len(best):  # the last of equal mounts is the one on top
                    best, fstype = mount, parts[2]
    except OSError:
        pass
    kind = "unknown" if fstype is None else "memory" if fstype in ("tmpfs", "ramfs") else "disk"
    return {"root": str(path), "kind": kind, "fstype": fstype}


def sync_folder_line(root: str | Path, need_bytes: int, chosen: bool) -> str:
    """One line for the run's output: where the weights file goes, and why there.

    `chosen`: the folder is labkit's pick (/dev/shm, else the temp folder), not the caller's
    `weights_dir`; on disk it then says how much /dev/shm lacked."""
    d = describe_folder(root)
    size = (f"{need_bytes / 2**30:.2f} GiB" if need_bytes >= 2**30 else f"{need_bytes / 2**20:.1f} MiB") + " a sync"
    where = d["kind"] + (f", {d['fstype']}" if d["fstype"] else "")
    line = f"weight sync through {d['root']} ({where}), {size}"
    if chosen and d["kind"] != "memory":
        free = shm_free_bytes()
        if free is None:
            line += "; this machine has no /dev/shm"
        else:
            line += (f"; /dev/shm has {free / 2**30:.2f} GiB free, needs "
                     f"{(need_bytes + SHM_SPARE_BYTES) / 2**30:.2f} (the file and 1 GiB to spare): "
                     f"a container given more (docker run --shm-size) syncs through memory")
    return line


# ---------------------------------------------------------------------- sync folders
def make_sync_folder(root: str | None = None) -> Path:
    """A new, empty folder `labkit-weights-<pid>-<random>` in `root` (default: the temp folder)."""
    return Path(tempfile.mkdtemp(prefix=f"{SYNC_FOLDER_PREFIX}{os.getpid()}-", dir=root))


def remove_stale_sync_folders(roots: Sequence[str] | None = None,
                              max_age_s: float = STALE_SYNC_AGE_S) -> list[Path]:
    """Remove the sync folders in `roots` (default /dev/shm and the temp folder) that a trainer
    killed mid-sync left: this user's, named with a PID that is gone, older than `max_age_s`.
    Returns the folders removed. Folders of live PIDs and names without a PID are left alone."""
    pattern = re.compile(re.escape(SYNC_FOLDER_PREFIX) + r"(\d+)-.+")
    roots = ["/dev/shm", tempfile.gettempdir()] if roots is None else roots
    removed, now = [], time.time()
    for root in dict.fromkeys(Path(r).resolve() for r in roots):
        try:
            entries = sorted(root.iterdir())
        except OSError:  # no /dev/shm here, or not readable
            continue
        for d in entries:
            m = pattern.fullmatch(d.name)
            if not m or _pid_alive(int(m[1])):
                continue
            try:
                st = d.lstat()  # a symlink is not a folder here
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or now - st.st_mtime < max_age_s:
                continue
            shutil.rmtree(d, ignore_errors=True)
            if not d.exists():
                removed.append(d)
    return removed


def _pid_alive(pid: int) -> bool:
    """True unless surely no process `pid` exists (another user's process counts as alive)."""
    if pid <= 0:
        return True  # 0 names this process group: never guess
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # not ours to signal, or no PID at all: leave it
        return True
    return True
