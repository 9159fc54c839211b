"""Unit tests of wait.py: `python3 -m unittest discover -s scripts` (run by `make lint`)."""

import contextlib
import io
import os
import subprocess
import sys
import time
import unittest

from fake_http import FakeHttp
from wait import counted, process_gone, wait_http, wait_metric

EXPOSITION = """\
# HELP toolgate_config_reloads_total Config reload attempts.
# TYPE toolgate_config_reloads_total counter
toolgate_config_reloads_total{result="error"} 0
toolgate_config_reloads_total{result="ok"} 2
toolgate_invocations_total{tool="search",status="READY"} 1
up 1
"""


class WaitHttp(unittest.TestCase):
    def setUp(self):
        self.server = FakeHttp()
        self.addCleanup(self.server.close)

    def test_a_200_ends_the_wait(self):
        self.server.answer("/readyz", 503, 503, 200)
        self.assertIsNone(wait_http(self.server.url("/readyz"), 10))
        self.assertEqual(len(self.server.requests), 3)

    def test_no_200_in_time_says_the_last_answer(self):
        self.server.answer("/readyz", (503, "draining"))
        started = time.monotonic()
        why = wait_http(self.server.url("/readyz"), 0.5, what="toolgate")
        self.assertLess(time.monotonic() - started, 3)
        self.assertEqual(why, f"toolgate did not answer 200 at {self.server.url('/readyz')} "
                              "within 0.5s (last: HTTP 503)")

    def test_nothing_listening(self):
        port = self.server.port
        self.server.close()
        why = wait_http(f"http://127.0.0.1:{port}/readyz", 0.3)
        self.assertTrue(why.startswith("the server did not answer 200"), why)
        self.assertIn("refused", why.lower())

    def test_a_started_process_that_exits_ends_the_wait(self):
        proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
        proc.wait()
        started = time.monotonic()
        url = self.server.url("/never")
        why = wait_http(url, 30, proc, "fake_tool")
        self.assertLess(time.monotonic() - started, 5)
        self.assertEqual(why, f"fake_tool exited with 3 before answering 200 at {url}")

    def test_a_pid_that_is_gone_ends_the_wait(self):
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        url = self.server.url("/never")
        self.assertEqual(wait_http(url, 30, proc.pid),
                         f"process {proc.pid} exited before answering 200 at {url}")

    def test_a_running_process_is_waited_for(self):
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        self.server.answer("/healthz", 200)
        self.assertIsNone(wait_http(self.server.url("/healthz"), 10, proc))
        self.assertIsNone(wait_http(self.server.url("/healthz"), 10, proc.pid))


class ProcessGone(unittest.TestCase):
    def test_running_reaped_and_zombie(self):
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        deadline = time.monotonic() + 10
        while not process_gone(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.01)  # exited but not reaped yet: a zombie counts as gone
        self.assertTrue(process_gone(proc.pid))
        proc.wait()
        self.assertTrue(process_gone(proc.pid))
        self.assertFalse(process_gone(os.getpid()))


class Metric(unittest.TestCase):
    def test_counted(self):
        self.assertTrue(counted(EXPOSITION, 'toolgate_config_reloads_total{result="ok"}'))
        self.assertTrue(counted(EXPOSITION, "toolgate_config_reloads_total"))
        self.assertTrue(counted(EXPOSITION, 'toolgate_invocations_total{tool="search"}'))
        self.assertTrue(counted(EXPOSITION, "up"))
        # Present but 0; a label value that differs; a name that is only a prefix.
        self.assertFalse(counted(EXPOSITION, 'toolgate_config_reloads_total{result="error"}'))
        self.assertFalse(counted(EXPOSITION, 'toolgate_invocations_total{tool="lookup"}'))
        self.assertFalse(counted(EXPOSITION, "toolgate_config_reloads"))
        self.assertFalse(counted("", "up"))

    def test_wait_metric_polls_until_counted(self):
        with FakeHttp() as server:
            server.answer("/metrics", (200, "up 0\n"), (200, EXPOSITION))
            self.assertTrue(wait_metric(server.url("/metrics"), "up", 10))
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                self.assertFalse(wait_metric(server.url("/metrics"), 'toolgate_config_reloads_total'
                                             '{result="error"}', 0.3))
            self.assertIn("not counted", err.getvalue())


if __name__ == "__main__":
    unittest.main()
