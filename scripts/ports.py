#!/usr/bin/env python3
"""Free loopback TCP ports for the scripts: the one port helper they all use.

    python3 scripts/ports.py N      prints N distinct free ports on 127.0.0.1, space-separated

From Python: `from ports import free_ports` (with scripts/ on sys.path). Each port is taken by
binding port 0, so the kernel picks it; all N sockets are held until every port is chosen, so the
N ports differ. They are released before returning: a process started right after binds them.
The Rust side needs none of this, it binds port 0 itself.
"""

import socket
import sys


def free_ports(n):
    """n distinct free TCP ports on 127.0.0.1."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port():
    """One free TCP port on 127.0.0.1."""
    return free_ports(1)[0]


def main(argv):
    if len(argv) != 2 or not argv[1].isdigit() or int(argv[1]) < 1:
        print("usage: ports.py N", file=sys.stderr)
        return 64
    print(" ".join(map(str, free_ports(int(argv[1])))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
