"""Unit tests of bench.py's parsing: `python3 -m unittest discover -s bench` (run by `make lint`)."""

import unittest

import bench

# The head of `perf sched timehist` and six rows: two CPUs, 2 ms of trace.
TIMEHIST = """\
           time    cpu  task name                       wait time  sch delay   run time
                        [tid/pid]                          (msec)     (msec)     (msec)
--------------- ------  ------------------------------  ---------  ---------  ---------
   100.000000 [0000]  <idle>                              0.000      0.000      0.500
   100.000500 [0000]  toolgate-worker[11/10]              0.400      0.300      0.200
   100.000700 [0001]  redis-server[20]                    1.500      1.200      0.100
   100.001000 [0001]  <idle>                              0.000      0.000      0.300
   100.001500 [0000]  wrk[30/29]                          0.100      0.050      0.400
   100.002000 [0001]  tokio-rt-worker[41/40]              0.900      0.260      0.500
"""


class TimehistFigures(unittest.TestCase):
    def test_counts_runs_busy_time_and_waits(self):
        # 2 ms at 1000 calls a second: 2 calls.
        f = bench.timehist_figures(TIMEHIST, 1000, 2)
        self.assertAlmostEqual(f["seconds"], 0.002)
        # Four runs that are not idle: 1.2 ms of 4 ms of CPU.
        self.assertAlmostEqual(f["runs_per_call"], 2.0)
        self.assertAlmostEqual(f["cpus_busy"], 0.3)
        # Waits of 0.3, 1.2 and 0.26 ms pass 0.25 ms; only 1.2 passes 1 ms. Idle rows never count.
        self.assertAlmostEqual(f["waits_over_ms_per_call"]["0.25"], 1.5)
        self.assertAlmostEqual(f["waits_over_ms_per_call"]["1.0"], 0.5)

    def test_no_rows_is_a_failure(self):
        with self.assertRaises(bench.Failure):
            bench.timehist_figures("perf: no samples\n", 1000, 2)


if __name__ == "__main__":
    unittest.main()
