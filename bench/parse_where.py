"""Where and how a batch is parsed: natively in the writer's thread, by the Python parser alone,
or by Spark (issues 16 and 36).

The same batches (20,000 reads each, of single-read messages and of 50-event FX9600 arrays, from
the simulator) are parsed and written to the `reads` table three ways, in alternating rounds, by
one process holding one local[2] Spark session:
- `thread`: `spark.prepare.prepare_batch` in the calling thread, the tag data parsed in C++ by
  pyarrow's JSON reader (spark.zebra_arrow), as the daemon's writer does, then the TableWriter;
- `python`: the same batch built by the Python parser alone (`build_batch(..., native=False)`:
  the writer before issue 36, and the judge of what the native path hands back);
- `spark`: the raw records handed to Spark as Arrow columns, parsed by `mapInArrow` in Spark's
  own Python workers with the same parser, and written from there. This is issue 16's first
  design, measured at its most favourable: only the `reads` rows come out of the job (dead
  letters, reader events and the readers' counters would need more jobs or a collect).
Per way: reads/s into the table, and the calling process's CPU per 1,000 messages (what the
daemon's interpreter would carry; Spark's Python workers are other processes). Issue 16's parse
worker (a child process parsing beside the daemon) is gone: with the native parse, one
interpreter did the batches with less CPU than two (`footprint` benchmark). The `spark` way
needs pandas (pyspark's Arrow UDFs import it): the bench extra pins it.
"""

from __future__ import annotations

import os
import resource
import statistics
import sys
import time

from bench.benchmarks import Benchmark, Context

NAME = "parse-where"
WAYS = ("thread", "python", "spark")
BATCH_READS = 20_000
BATCHES = {False: 12, True: 4}
ROUNDS = {False: 3, True: 1}
SHAPES = (1, 50)


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _batches(events: int, count: int) -> list[list]:
    from actors.devtools.simulate import TagEventGenerator
    from persistence.records import LedgerRecord

    generator = TagEventGenerator("fx9600-01", wall=lambda: 1.7e9)
    per = BATCH_READS // events
    return [
        [
            LedgerRecord(
                seq=b * per + i,
                message_key=f"{b * per + i:032x}",
                topic="zebra/fx/fx9600-01/reads",
                payload=generator.next_payload(events),
                qos=1,
                received_time=1.7e9 + b,
                pack_id=b,
            )
            for i in range(per)
        ]
        for b in range(count)
    ]


def _spark_parse(spark, tables_dir: str, batch_id: int, records: list) -> None:
    import pyarrow as pa
    from pyspark.sql import functions as F

    from spark.schema import READS_SCHEMA

    raw = pa.table(
        {
            "seq": pa.array([r.seq for r in records], pa.int64()),
            "message_key": [r.message_key for r in records],
            "topic": [r.topic for r in records],
            "payload": pa.array([r.payload for r in records], pa.binary()),
            "qos": pa.array([r.qos for r in records], pa.int8()),
            "received_time": [r.received_time for r in records],
            "pack_id": pa.array([r.pack_id for r in records], pa.int64()),
        }
    )

    def parse(batches):  # runs in Spark's Python workers: pickled by value, imports its own
        from persistence.records import LedgerRecord
        from spark.schema import build_batch

        for batch in batches:
            got = [LedgerRecord(**row) for row in batch.to_pylist()]
            yield from build_batch(got, batch_id).reads.to_batches()

    schema = spark.createDataFrame(READS_SCHEMA.empty_table()).schema
    (
        spark.createDataFrame(raw)
        .mapInArrow(parse, schema)
        .drop("batch_id")
        .withColumn("batch_id", F.lit(batch_id).cast("long"))
        .write.format("delta")
        .mode("append")
        .option("txnAppId", "fxgate-ledger-bench")
        .option("txnVersion", batch_id)
        .partitionBy("date")
        .save(f"{tables_dir}/reads")
    )


def parse_where(ctx: Context) -> dict:
    from spark.prepare import BuildOptions, prepare_batch
    from spark.schema import build_batch
    from spark.session import build_session, stop_session
    from spark.tables import READS, TableWriter

    # Spark's Python workers run this interpreter (they import pyarrow and the spark package).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    directory = ctx.next_dir(NAME)
    session = build_session("local[2]", directory / "spark")
    samples: dict[str, dict[str, list[dict]]] = {}
    try:
        tables_dir = directory / "tables"
        writer = TableWriter(session, tables_dir, "fxgate-ledger-bench")
        batch_id = 0

        def write_all(way: str, batches: list[list]) -> None:
            for records in batches:
                write(way, records)

        def write(way: str, records: list) -> None:
            nonlocal batch_id
            batch_id += 1
            if way == "spark":
                _spark_parse(session, str(tables_dir), batch_id, records)
                return
            if way == "thread":
                reads = prepare_batch(records, batch_id, BuildOptions(), {}, {}).tables.reads
            else:
                reads = build_batch(records, batch_id, native=False).reads
            writer.write_batch(batch_id, {READS: reads})

        for events in SHAPES:
            batches = _batches(events, BATCHES[ctx.settings.quick])
            shape = samples[f"{events}"] = {way: [] for way in WAYS}
            for way in WAYS:  # warm each way once: JVM code paths, Spark's Python workers
                write_all(way, batches[:1])
            for number in range(ROUNDS[ctx.settings.quick]):
                for way in WAYS if number % 2 == 0 else WAYS[::-1]:
                    cpu, started = _cpu(), time.perf_counter()
                    write_all(way, batches)
                    seconds, cpu = time.perf_counter() - started, _cpu() - cpu
                    messages = sum(len(r) for r in batches)
                    sample = {
                        "reads_per_second": round(len(batches) * BATCH_READS / seconds),
                        "cpu_ms_per_1000_messages": round(1e6 * cpu / messages, 2),
                        "seconds": round(seconds, 3),
                    }
                    shape[way].append(sample)
                    print(
                        f"   {events} event(s)/message, {way}: {sample['reads_per_second']:,} "
                        f"reads/s, calling process {sample['cpu_ms_per_1000_messages']} ms CPU "
                        "per 1,000 messages",
                        flush=True,
                    )
    finally:
        stop_session(session)
    medians = {
        events: {
            way: {
                key: statistics.median(s[key] for s in runs)
                for key in ("reads_per_second", "cpu_ms_per_1000_messages")
            }
            for way, runs in ways.items()
        }
        for events, ways in samples.items()
    }
    batched = medians["50"]
    return {
        "kind": "fxgate-bench",
        "module": "bench.parse_where",
        "name": NAME,
        "title": "where a batch is parsed: natively in the writer's thread, in Python, or by Spark",
        "unit": "reads/s",
        "setup": {
            "batch_reads": BATCH_READS,
            "batches_per_round": BATCHES[ctx.settings.quick],
            "rounds": ROUNDS[ctx.settings.quick],
            "session": "local[2], 512m driver, one process",
        },
        "samples": samples,
        "medians": medians,
        "headline": (
            "50 events/message: "
            + ", ".join(
                f"{way} {batched[way]['reads_per_second']:,.0f} reads/s "
                f"({batched[way]['cpu_ms_per_1000_messages']:.1f} ms CPU/1,000 msgs)"
                for way in WAYS
            )
        ),
    }


def rows(result: dict) -> list[list[str]]:
    table = []
    for events, ways in result["medians"].items():
        thread = ways["thread"]
        for way in WAYS[1:]:
            mine = ways[way]
            table.append(
                [
                    f"`{NAME}` {events}/msg {way}",
                    f"the same {result['setup']['batch_reads']:,}-read batches of "
                    f"{events} event(s)/message into `reads`, parsed "
                    + {
                        "python": "by the Python parser alone (the writer before issue 36)",
                        "spark": "by Spark (`mapInArrow`, reads only: its most favourable case)",
                    }[way]
                    + "; baseline: parsed natively in the calling thread (the writer). In "
                    "brackets: the calling "
                    "process's CPU per 1,000 messages",
                    f"{thread['reads_per_second']:,.0f} reads/s "
                    f"({thread['cpu_ms_per_1000_messages']:.1f} ms)",
                    f"{mine['reads_per_second']:,.0f} reads/s "
                    f"({mine['cpu_ms_per_1000_messages']:.1f} ms)",
                    f"{mine['reads_per_second'] / thread['reads_per_second']:.2f}\u00d7",
                    "report only",
                    "—",
                    f"{len(result['samples'][events][way])}+"
                    f"{len(result['samples'][events]['thread'])}",
                ]
            )
    return table


def plot(results_dir, result: dict):
    import matplotlib.pyplot as plt

    path = results_dir / f"{NAME}.png"
    fig, axes = plt.subplots(1, 2, figsize=(9, 4.2), dpi=110)
    for ax, key, label in (
        (axes[0], "reads_per_second", "reads/s into the table"),
        (axes[1], "cpu_ms_per_1000_messages", "calling process CPU, ms per 1,000 messages"),
    ):
        for offset, events in enumerate(result["medians"]):
            values = [result["medians"][events][way][key] for way in WAYS]
            positions = [i * 3 + offset for i in range(len(WAYS))]
            ax.bar(positions, values, label=f"{events} event(s)/message")
        ax.set_xticks([i * 3 + 0.5 for i in range(len(WAYS))], WAYS)
        ax.set_title(label, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0].legend(fontsize=8)
    fig.suptitle(result["headline"], fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


BENCHMARKS: tuple[Benchmark, ...] = (Benchmark(NAME, parse_where, True),)
