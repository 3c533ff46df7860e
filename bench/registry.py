"""Every benchmark `make bench` knows, in run order.

`bench.benchmarks` holds the baseline-vs-fxgate drains (ingest, durability, batched); each other
module owns one kind of benchmark, its result shape and its table rows (`rows(result)`, and
`plot(results_dir, result)` where the default sample plot does not fit).
"""

from __future__ import annotations

import importlib

from bench import benchmarks

MODULES = (
    "bench.forward",
    "bench.latency",
    "bench.recovery",
    "bench.memory",
    "bench.outage",
    "bench.loss",
    "bench.compaction",
    "bench.delta_log",
    "bench.group",
    "bench.object_store",
    "bench.start",
    "bench.parse_where",
    "bench.windows",
    "bench.footprint",
)


def _collect() -> tuple:
    found = list(benchmarks.BENCHMARKS)
    for name in MODULES:
        found.extend(importlib.import_module(name).BENCHMARKS)
    return tuple(found)


BENCHMARKS = _collect()
