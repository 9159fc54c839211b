#!/usr/bin/env python3
"""Exit 0 when the pod (JSON on stdin, as `kubectl get pod -o json` prints it) has the toolgate
sidecar as injected by the webhook: the first init container, restartable (a native sidecar),
serving /etc/toolgate/toolgate.yaml, with the toolgate.dev/injected annotation and no toolgate
among the plain containers. Used by deploy/kind/e2e.sh."""

import json
import sys


def injected(pod):
    spec = pod["spec"]
    first = (spec.get("initContainers") or [{}])[0]
    argv = (first.get("command") or []) + (first.get("args") or [])
    return (
        first.get("name") == "toolgate"
        and first.get("restartPolicy") == "Always"
        and "serve" in argv
        and "/etc/toolgate/toolgate.yaml" in argv
        and pod["metadata"].get("annotations", {}).get("toolgate.dev/injected") == "true"
        and not any(c["name"] == "toolgate" for c in spec["containers"])
    )


if __name__ == "__main__":
    sys.exit(0 if injected(json.load(sys.stdin)) else 1)
