"""Unit tests of ports.py: `python3 -m unittest discover -s scripts` (run by `make lint`)."""

import contextlib
import io
import socket
import unittest

from ports import free_port, free_ports, main


class FreePorts(unittest.TestCase):
    def test_distinct_and_bindable(self):
        ports = free_ports(20)
        self.assertEqual(len(set(ports)), 20)
        socks = []
        try:
            for port in ports:
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", port))  # released before returning: each binds again
        finally:
            for s in socks:
                s.close()
        self.assertTrue(1024 <= free_port() <= 65535)

    def test_main(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            self.assertEqual(main(["ports.py", "3"]), 0)
        self.assertEqual(len(set(map(int, out.getvalue().split()))), 3)
        for argv in (["ports.py"], ["ports.py", "0"], ["ports.py", "x"], ["ports.py", "1", "2"]):
            with self.subTest(argv=argv), contextlib.redirect_stderr(io.StringIO()) as err:
                self.assertEqual(main(argv), 64)
                self.assertIn("usage", err.getvalue())


if __name__ == "__main__":
    unittest.main()
