"""The p50 of `tensorwire bench collective`'s Python ranks
(tensorwire._bench_collective): gloo's, mpi4torch's and tensorwire's from
Python. The table divides gloo's p50 by the Go ranks' (gloo p50 / p50) and
takes the Go ranks' from the Python ones (python - go), so both must be the
same percentile: report.Percentile's nearest rank, ceil(n/2), the lower
middle value of an even count (1 KB and 1 MB run 500 and 256 iterations,
16 MB 16)."""

import unittest

from tensorwire._bench_collective import p50


class TestP50(unittest.TestCase):

    def test_nearest_rank_as_go(self):
        for name, times, want in [
            ("one", [7.0], 7.0),
            ("two: the lower", [9.0, 1.0], 1.0),
            ("five unsorted", [5.0, 1.0, 4.0, 2.0, 3.0], 3.0),
            ("ten: the 5th", [float(i) for i in range(10, 0, -1)], 5.0),
            ("sixteen (16 MB's iterations): the 8th", [float(i) for i in range(1, 17)], 8.0),
            ("five hundred (1 KB's): the 250th", [float(i) for i in range(500, 0, -1)], 250.0),
        ]:
            with self.subTest(name):
                before = list(times)
                self.assertEqual(p50(times), want)
                self.assertEqual(times, before, "p50 reordered its input")


if __name__ == "__main__":
    unittest.main()
