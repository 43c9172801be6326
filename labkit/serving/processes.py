"""Child processes that serve over HTTP: free ports, start in a group, wait for health, stop.

`labkit serve` runs engine servers and a router as children. Each child starts in a new
session, so it leads its own process group and the workers it spawns (vLLM's engine core)
share that group: stopping the group stops them all, and `group_members` checks that
nothing is left. Children also get SIGTERM if the launching process dies (Linux
PR_SET_PDEATHSIG). Ports are checked before anything starts.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


class ServeError(RuntimeError):
    """An engine or the router could not start; the message names the log to read."""


class PortInUse(ServeError):
    """A port that `labkit serve` needs is taken."""


# ---------------------------------------------------------------------- ports
def port_is_free(host: str, port: int) -> bool:
    """True when `port` on `host` can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def check_ports_free(host: str, ports: Sequence[int]) -> None:
    """Raise PortInUse naming the first taken port and how to choose others."""
    for p in ports:
        if not port_is_free(host, p):
            raise PortInUse(
                f"port {p} on {host} is in use (labkit serve needs {ports[0]}..{ports[-1]}); "
                f"stop what holds it (`ss -ltnp | grep {p}`) or pass another --port"
            )


def find_free_base_port(n: int, host: str = "127.0.0.1", start: int = 20000, tries: int = 200) -> int:
    """A base port p such that p..p+n-1 are all free now (for tests and scripts)."""
    import random

    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(tries):
        p = rng.randrange(start, 60000 - n)
        if all(port_is_free(host, p + i) for i in range(n)):
            return p
    raise PortInUse(f"found no {n} free consecutive ports on {host} in {tries} tries")


# ---------------------------------------------------------------------- processes
def _die_with_parent() -> None:  # runs in the child before exec
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) process ids whose process group is `pgid` (Linux /proc; elsewhere
    [pgid] while the group can still be signalled)."""
    if not Path("/proc/self/stat").exists():
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except (ProcessLookupError, PermissionError):
            return []
    alive = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            alive.append(int(d.name))
    return alive


@dataclass
class Proc:
    """A started child: its name, Popen, log file and the URL it serves."""

    name: str
    popen: subprocess.Popen
    log: Path
    url: str

    @property
    def pgid(self) -> int:
        return self.popen.pid  # start_new_session: the child leads its own group

    def tail(self, n: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def spawn(name: str, cmd: list[str], url: str, env: dict, log: Path) -> Proc:
    """Start `cmd` in a new session (its own process group), output to `log` (which starts
    with the command line), with `env` over this process's environment."""
    with open(log, "w") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        popen = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, env={**os.environ, **env},
                                 preexec_fn=_die_with_parent if sys.platform == "linux" else None)
    return Proc(name, popen, log, url)


def stop_groups(procs: Sequence[Proc], grace_s: float = 20.0) -> list[int]:
    """SIGTERM each process's group (in the order given), then SIGKILL what is left after
    `grace_s`; reap the leaders. Returns the pids still alive (empty when all are gone)."""
    groups = [p.pgid for p in procs]
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        live = [g for g in groups if group_members(g)]
        for g in live:
            try:
                os.killpg(g, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and any(group_members(g) for g in live):
            for p in procs:
                p.popen.poll()  # reap the group leaders
            time.sleep(0.1)
    for p in procs:
        try:
            p.popen.wait(timeout=1)
        except subprocess.TimeoutExpired:
            pass
    return [pid for g in groups for pid in group_members(g)]


def wait_healthy(proc: Proc, timeout_s: float) -> None:
    """Poll proc's /health until 200; raise ServeError (with its log's tail) if it dies or times out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise ServeError(f"{proc.name} exited with code {proc.popen.returncode} before it was "
                             f"healthy; its log {proc.log} ends with:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(proc.url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise ServeError(f"{proc.name} did not answer {proc.url}/health within {timeout_s:.0f} s; "
                     f"see {proc.log}:\n{proc.tail()}")
