#!/usr/bin/env python3
"""Waiting helpers for the scripts (standard library only): the one place a script waits for a
server to answer.

    wait.py http URL [--pid PID] [--timeout S]
        poll URL until it answers 200; fail early once process PID has exited
    wait.py metric URL 'name{label="value",...}' [--timeout S]
        poll a Prometheus text exposition at URL until that sample (all labels matching) is >= 1

Exit status 0 when the condition held, 1 when it did not within the timeout.

From Python: `from wait import wait_http` (with scripts/ on sys.path).
"""

import argparse
import re
import sys
import time
import urllib.error
import urllib.request


def process_gone(pid):
    """True once PID has exited (or is a zombie waiting to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def exited(proc):
    """None while `proc` runs, else how it ended: " with CODE" for a process this program started
    (a Popen), "" for one it knows by pid only."""
    if isinstance(proc, int):
        return "" if process_gone(proc) else None
    return None if proc.poll() is None else f" with {proc.returncode}"


def wait_http(url, timeout, proc=None, what=None):
    """Polls URL until it answers 200, for at most `timeout` seconds. Returns None once it has,
    else why not, as one sentence. `proc` is the process meant to answer, a Popen or the pid of a
    process started elsewhere: once it has exited the wait ends at once. `what` names it in the
    sentence (default: "process PID", or "the server" without a process)."""
    if what is None:
        what = "the server" if proc is None else f"process {getattr(proc, 'pid', proc)}"
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc is not None and (code := exited(proc)) is not None:
            return f"{what} exited{code} before answering 200 at {url}"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return None
                last = f"HTTP {resp.status}"
        except urllib.error.HTTPError as err:
            last = f"HTTP {err.code}"
        except (OSError, ValueError) as err:
            last = str(err)
        time.sleep(0.1)
    return f"{what} did not answer 200 at {url} within {timeout:g}s (last: {last})"


LABELS = re.compile(r'(\w+)="([^"]*)"')
SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})?\s+(\S+)")


def counted(text, sample):
    """True when the exposition `text` has `sample` (`name{label="value",...}`, all the labels
    given matching) at 1 or more."""
    name, _, labels = sample.partition("{")
    want = dict(LABELS.findall(labels))
    for line in text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) == name and float(m.group(3)) >= 1:
            have = dict(LABELS.findall(m.group(2) or ""))
            if all(have.get(k) == v for k, v in want.items()):
                return True
    return False


def wait_metric(url, sample, timeout):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                text = resp.read().decode()
        except OSError:
            text = ""
        if counted(text, sample):
            return True
        time.sleep(0.2)
    print(f"wait: {sample} not counted at {url} within {timeout:g}s", file=sys.stderr)
    return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    h = sub.add_parser("http")
    h.add_argument("url")
    h.add_argument("--pid", type=int)
    h.add_argument("--timeout", type=float, default=30)
    m = sub.add_parser("metric")
    m.add_argument("url")
    m.add_argument("sample")
    m.add_argument("--timeout", type=float, default=10)
    args = ap.parse_args()
    if args.cmd == "http":
        why = wait_http(args.url, args.timeout, args.pid)
        if why:
            print(f"wait: {why}", file=sys.stderr)
        ok = why is None
    else:
        ok = wait_metric(args.url, args.sample, args.timeout)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
