"""Starts real worker processes for the pytest suite.

Each test runs a scenario of workers.py in `world_size` processes on
loopback, with a rendezvous port chosen at run time, bounded in time; every
child is reaped (killed with its process group on timeout).
"""
import dataclasses
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time

# The interpreter running pytest, the one with torch and baton: /usr/bin/python3
# under Bazel (Debian's torch), a venv's for a wheel (tools/pybuild/).
PYTHON = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
WORKERS = os.path.join(HERE, "workers.py")


def _ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
        return low if low > 11000 else 32768
    except (OSError, ValueError, IndexError):
        return 32768


def free_port():
    """A port free now, drawn at random from below the kernel's ephemeral
    range, as testing/ports.h does: a port from that range (bind to 0) can be
    handed to any process's outgoing connection before the worker listens on
    it, and the tests beside this one connect all the time."""
    high = _ephemeral_low()
    for _ in range(1000):
        port = random.randrange(10000, high)
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


@dataclasses.dataclass
class Worker:
    rank: int
    returncode: int
    output: str

    def lines(self, prefix):
        """The values printed as 'prefix value' lines."""
        return [line[len(prefix) + 1:] for line in self.output.splitlines()
                if line.startswith(prefix + " ")]


def env_for(extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [p for p in (os.environ.get("BATON_PYTHONPATH"), env.get("PYTHONPATH")) if p])
    env.pop("BATON_ELASTIC_LAUNCHED", None)
    env["PYTHONUNBUFFERED"] = "1"  # a killed worker still shows what it printed
    env.update(extra or {})
    return env


def run(scenario, world_size, timeout=90, extra_env=None, per_rank_env=None, args=(),
        expected_exit=None, commands=None):
    """Runs the scenario on every rank; returns [Worker] once all exited.
    expected_exit: {rank: (codes,)} of workers meant to fail; commands:
    {rank: argv} for ranks that run another program (a C++ worker)."""
    expected_exit = expected_exit or {}
    port = str(free_port())
    procs = []
    try:
        for rank in range(world_size):
            env = env_for({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                           "RANK": str(rank), "WORLD_SIZE": str(world_size)})
            env.update(extra_env or {})
            env.update((per_rank_env or {}).get(rank, {}))
            argv = (commands or {}).get(rank) or [PYTHON, WORKERS, scenario, *args]
            procs.append(subprocess.Popen(
                argv, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, start_new_session=True))
        deadline = time.monotonic() + timeout
        outputs = [[] for _ in procs]
        changed = threading.Condition()

        def watch(rank, p):
            outputs[rank].append(p.stdout.read())  # until the worker's stdout closes
            p.wait()
            with changed:
                changed.notify_all()

        watchers = [threading.Thread(target=watch, args=(rank, p), daemon=True)
                    for rank, p in enumerate(procs)]
        for w in watchers:
            w.start()
        # A worker that failed leaves the others waiting for it (for their
        # shutdown agreement): they get a short grace, then are killed.
        failed_at = None
        reason = None
        with changed:
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if failed_at is None and any(
                        p.returncode not in (None, 0, *expected_exit.get(rank, ()))
                        for rank, p in enumerate(procs)):
                    failed_at = now
                limit = deadline if failed_at is None else min(deadline, failed_at + 10)
                if now >= limit:
                    reason = (f"ran past {timeout}s" if now >= deadline
                              else "another worker failed")
                    break
                changed.wait(timeout=limit - now)
        killed = [p.poll() is None for p in procs]
        kill_all(procs)
        for w in watchers:
            w.join()
        out = []
        for rank, p in enumerate(procs):
            text = "".join(outputs[rank])
            if killed[rank]:
                text += f"\n[harness] killed: scenario {scenario} {reason}"
            out.append(Worker(rank, p.returncode, text))
        return out
    finally:
        kill_all(procs)


def kill_all(procs):
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def check(workers, expect_rc=None):
    """Asserts every worker exited 0 (or with expect_rc[rank]) and printed OK."""
    for w in workers:
        want = (expect_rc or {}).get(w.rank, 0)
        assert w.returncode == want, f"rank {w.rank} exited {w.returncode}:\n{w.output}"
        if want == 0:
            assert "SCENARIO OK" in w.output, f"rank {w.rank}:\n{w.output}"
