"""Not written yet (issue 5)."""

BENCHMARKS: tuple = ()
