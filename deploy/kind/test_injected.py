"""Unit tests of injected.py: `python3 -m unittest discover -s deploy/kind` (run by `make lint`)."""

import copy
import json
import os
import subprocess
import sys
import unittest

from injected import injected

POD = {
    "metadata": {"name": "agent",
                 "annotations": {"toolgate.dev/inject": "true", "toolgate.dev/injected": "true"}},
    "spec": {
        "initContainers": [{"name": "toolgate", "restartPolicy": "Always", "image": "toolgate:e2e",
                            "args": ["serve", "--config", "/etc/toolgate/toolgate.yaml"]},
                           {"name": "setup", "command": ["true"]}],
        "containers": [{"name": "agent", "command": ["python3", "/scenario/scenario.py"]}],
    },
}


class Injected(unittest.TestCase):
    def test_the_injected_pod(self):
        self.assertTrue(injected(POD))
        pod = copy.deepcopy(POD)
        first = pod["spec"]["initContainers"][0]
        first["command"], first["args"] = ["/toolgate", "serve"], ["--config", "/etc/toolgate/toolgate.yaml"]
        self.assertTrue(injected(pod))  # the argv may be split between command and args

    def test_what_is_not(self):
        def first(pod):
            return pod["spec"]["initContainers"][0]

        for breaks, why in (
                (lambda p: p["spec"]["initContainers"].reverse(), "not the first init container"),
                (lambda p: first(p).pop("restartPolicy"), "not a native sidecar"),
                (lambda p: first(p).update(args=["check", "--config", "/etc/toolgate/toolgate.yaml"]),
                 "not serving"),
                (lambda p: first(p).update(args=["serve", "--config", "/tmp/toolgate.yaml"]),
                 "another config"),
                (lambda p: p["metadata"]["annotations"].pop("toolgate.dev/injected"), "no annotation"),
                (lambda p: p["metadata"].pop("annotations"), "no annotations at all"),
                (lambda p: p["spec"]["containers"].append({"name": "toolgate"}), "also a plain container"),
                (lambda p: p["spec"].pop("initContainers"), "no init containers")):
            with self.subTest(why):
                pod = copy.deepcopy(POD)
                breaks(pod)
                self.assertFalse(injected(pod))

    def test_the_exit_status(self):
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "injected.py")
        for pod, code in ((POD, 0), (dict(POD, metadata={"name": "agent"}), 1)):
            out = subprocess.run([sys.executable, script], input=json.dumps(pod), text=True)
            self.assertEqual(out.returncode, code)


if __name__ == "__main__":
    unittest.main()
