"""Unit tests of procs.py: `python3 -m unittest discover -s scripts` (run by `make lint`)."""

import json
import os
import sys
import tempfile
import time
import unittest

from procs import Procs, log_tail


class ProcsLifecycle(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.workdir = tmp.name

    def test_spawn_logs_and_stop_all_reaps_newest_first(self):
        procs = Procs(self.workdir)
        self.addCleanup(procs.stop_all)
        said = procs.spawn("talker", [sys.executable, "-c", "print('hello')"])
        said.wait(timeout=30)
        sleepers = [procs.spawn(f"sleeper{i}", [sys.executable, "-c", "import time; time.sleep(60)"])
                    for i in range(2)]
        with open(os.path.join(self.workdir, "pids")) as f:
            self.assertEqual([int(x) for x in f.read().split()],
                             [said.pid] + [p.pid for p in sleepers])
        started = time.monotonic()
        procs.stop_all(timeout=10)
        self.assertLess(time.monotonic() - started, 10)  # SIGTERM was enough
        self.assertTrue(all(p.returncode is not None for p in sleepers))
        self.assertEqual(procs.children, [])
        with open(os.path.join(self.workdir, "pids")) as f:
            self.assertEqual(f.read(), "")  # all reaped: the wrapper must not signal these pids
        with open(os.path.join(self.workdir, "talker.log")) as f:
            self.assertEqual(f.read(), "hello\n")

    def test_a_process_that_ignores_sigterm_is_killed(self):
        procs = Procs(self.workdir)
        code = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                "print('up', flush=True); time.sleep(60)")
        p = procs.spawn("stubborn", [sys.executable, "-c", code], pipes=True)
        self.addCleanup(p.stdin.close)
        self.addCleanup(p.stdout.close)
        self.assertEqual(p.stdout.readline(), "up\n")
        procs.stop_all(timeout=0.5)
        self.assertEqual(p.returncode, -9)

    def test_a_restarted_process_appends_to_its_log(self):
        procs = Procs(self.workdir)
        for word in ("first", "second"):
            procs.spawn("node", [sys.executable, "-c", f"print({word!r})"]).wait(timeout=30)
        procs.stop_all()
        with open(os.path.join(self.workdir, "node.log")) as f:
            self.assertEqual(f.read(), "first\nsecond\n")


class LogTail(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.workdir = tmp.name

    def write(self, name, lines):
        with open(os.path.join(self.workdir, f"{name}.log"), "w") as f:
            f.write("\n".join(lines) + "\n")

    def test_the_last_error_line_wins(self):
        self.write("toolgate", [
            json.dumps({"level": "ERROR", "message": "old", "error": "gone"}),
            json.dumps({"level": "ERROR", "message": "config invalid", "error": "tools[0]: bad"}),
            json.dumps({"level": "INFO", "message": "stopping"}),
            "not json",
        ])
        self.assertEqual(log_tail(self.workdir, "toolgate"), "config invalid: tools[0]: bad")

    def test_an_error_without_a_cause(self):
        self.write("toolgate", [json.dumps({"level": "ERROR", "message": "bind failed"})])
        self.assertEqual(log_tail(self.workdir, "toolgate"), "bind failed")

    def test_no_error_gives_the_last_lines(self):
        self.write("nginx", ["a", "b", "c", "d", json.dumps(["not", "an", "object"])])
        self.assertEqual(log_tail(self.workdir, "nginx"), 'c | d | ["not", "an", "object"]')
        self.assertEqual(log_tail(self.workdir, "nginx", lines=1), '["not", "an", "object"]')

    def test_no_log(self):
        self.assertEqual(log_tail(self.workdir, "missing"), "")


if __name__ == "__main__":
    unittest.main()
