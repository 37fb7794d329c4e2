"""Several OS processes for the multi-process tests: a free loopback port for their coordinator,
and a run that starts them together, waits for all of them and keeps each one's log."""
from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_processes(commands: list[list[str]], *, cwd: str, env: dict, log_dir, timeout: float,
                  while_running: Callable[[list[subprocess.Popen]], None] | None = None
                  ) -> tuple[list[int], list[str]]:
    """Start every command at once (process i logs to log_dir/proc<i>.log), wait for all, kill
    any still running after `timeout` s -> (exit codes, the last 2000 characters of each log).
    while_running(processes): called once they have started (e.g. to signal one mid-run)."""
    paths = [os.path.join(log_dir, f"proc{i}.log") for i in range(len(commands))]
    logs = [open(p, "w") for p in paths]
    procs = [subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
             for cmd, log in zip(commands, logs)]
    try:
        if while_running is not None:
            while_running(procs)
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        for log in logs:
            log.close()
    tails = []
    for p in paths:
        with open(p) as f:
            tails.append(f.read()[-2000:])
    return codes, tails


def report(codes: list[int], tails: list[str]) -> str:
    """Each process's exit code and log tail, laid out for an assertion message (a plain string:
    pytest shortens a list's repr to its ends, which hides all but the first process's start)."""
    return "\n".join(f"--- process {i}: exit {code}\n{tail}"
                      for i, (code, tail) in enumerate(zip(codes, tails)))
