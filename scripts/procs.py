"""The processes a script starts (scripts/soak.py, bench/bench.py), kept so that all of them stop
however the script ends, and the tail of their logs for error messages. Standard library only."""

import json
import os
import subprocess


class Procs:
    """Every process a run starts. Their pids also go to WORKDIR/pids, which the shell wrapper
    (scripts/soak.sh, bench/run.sh) reads to stop them if the Python program was killed outright."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.children = []
        self.pidfile = os.path.join(workdir, "pids")

    def spawn(self, name, argv, env=None, cwd=None, pipes=False):
        """Start argv, logging to NAME.log (appended to, so a restarted process keeps its earlier
        lines); with pipes, its stdin and stdout are pipes to us and only stderr is logged."""
        log = open(os.path.join(self.workdir, f"{name}.log"), "ab")
        if pipes:
            p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.PIPE,
                                 env=env, cwd=cwd, text=True)
        else:
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, env=env, cwd=cwd)
        log.close()
        self.children.append((name, p))
        with open(self.pidfile, "a") as f:
            f.write(f"{p.pid}\n")
        return p

    def stop_all(self, timeout=15):
        """SIGTERM each process, newest first, and wait for it (SIGKILL after `timeout` s). Newest
        first: a Redis node restarted mid-run stops before the cluster that removes its dir."""
        for _, p in reversed(self.children):
            stop(p, timeout)
        self.children = []
        # All reaped: the wrapper's backstop must not signal these (maybe reused) pids.
        open(self.pidfile, "w").close()


def stop(p, timeout):
    """SIGTERM `p` if it still runs, and reap it (SIGKILL after `timeout` s)."""
    if p.poll() is None:
        p.terminate()
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def log_tail(workdir, name, lines=3):
    """The last error NAME.log holds as a toolgate JSON line, else its last `lines` lines."""
    try:
        with open(os.path.join(workdir, f"{name}.log"), errors="replace") as f:
            tail = f.readlines()[-50:]
    except OSError:
        return ""
    for line in reversed(tail):
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") == "ERROR":
            return f"{entry.get('message', '')}: {entry.get('error', '')}".strip(": ")
    return " | ".join(line.strip() for line in tail[-lines:])
