"""Writing results: `<name>.json` (everything), `<name>.png` (every sample) and the table of the
documentation's benchmarks page.

The table is rebuilt from every `kind: fxgate-bench` JSON file in the results directory, so a run
of `--only ingest-qos1` refreshes its row and keeps the others (each row says when it ran).
"""

from __future__ import annotations

import importlib
import json
import textwrap
from pathlib import Path

import matplotlib
import matplotlib.ticker

from bench.machine import PRODUCT_PATHS

matplotlib.use("Agg")
import matplotlib.pyplot as plt

# Table order: by name prefix, then by name.
ORDER = (
    "ingest",
    "forward",
    "batched",
    "latency",
    "recovery",
    "memory",
    "outage",
    "durability",
    "loss",
    "group",
)
TABLE_FILE = "README-table.md"


def write_result(results_dir: Path, result: dict) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{result['name']}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, sort_keys=False, default=str) + "\n")
    tmp.replace(path)
    return path


def _module(result: dict):
    """The module that wrote a result of its own shape (latency, memory, ...), or None for the
    baseline-vs-fxgate shape of `bench.benchmarks`."""
    name = result.get("module")
    return importlib.import_module(name) if name else None


def plot_result(results_dir: Path, result: dict) -> Path:
    module = _module(result)
    if module is not None and hasattr(module, "plot"):
        return module.plot(results_dir, result)
    return _plot_samples(results_dir, result)


def _plot_samples(results_dir: Path, result: dict) -> Path:
    """Every sample in run order: drift or one odd round shows at a glance. Against an absolute
    target, baseline and fxgate get a panel each (their scales differ by an order of magnitude)."""
    path = results_dir / f"{result['name']}.png"
    target = result.get("target") or {}
    split = target.get("kind") == "fxgate_at_least"
    fig, axes = plt.subplots(1, 2 if split else 1, figsize=(9 if split else 7.5, 4.6), dpi=110)
    axes = list(axes) if split else [axes]
    styles = {"baseline": ("tab:blue", "o"), "fxgate": ("tab:orange", "s")}
    width = 48 if split else 100
    for index, role in enumerate(("baseline", "fxgate")):
        ax = axes[index if split else 0]
        samples = [s for s in result["raw"] if s["role"] == role]
        if not samples:
            continue
        color, marker = styles[role]
        label = result[role]["label"]
        used = set(result.get("rounds_used") or [s["round"] for s in samples])
        kept = [s for s in samples if s["round"] in used]
        left = [s for s in samples if s["round"] not in used]
        ax.plot(
            [s["order"] for s in kept],
            [s["value"] for s in kept],
            marker,
            color=color,
            label=textwrap.fill(f"{label} (median {result[role]['median']:,.0f})", width),
        )
        if left:
            ax.plot(
                [s["order"] for s in left],
                [s["value"] for s in left],
                marker,
                markerfacecolor="none",
                color=color,
                label=f"{role}: disturbed round, not in the median",
            )
        ax.axhline(result[role]["median"], color=color, linewidth=0.8, linestyle="--")
        if role == "fxgate" and split:
            ax.axhline(
                target["value"],
                color="tab:red",
                linewidth=0.8,
                linestyle=":",
                label=f"target {target['value']:,.0f}",
            )
    for ax in axes:
        tops = [y for line in ax.get_lines() for y in line.get_ydata()]
        ax.set_ylim(0, 1.15 * max(tops) if tops else None)
        ax.yaxis.set_major_formatter(matplotlib.ticker.StrMethodFormatter("{x:,.0f}"))
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.set_xlabel("sample, in run order")
        ax.set_ylabel(result["unit"])
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18), frameon=False)
    ratio = result.get("ratio")
    fig.suptitle(
        f"{result['title']}"
        + (f"\nratio of medians {ratio:.2f}; baseline and fxgate alternate" if ratio else ""),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _num(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return f"{value:,.0f} {unit}"


def _target(result: dict) -> str:
    target = result.get("target") or {}
    kind = target.get("kind")
    if kind == "ratio_at_least":
        return f"≥ {target['value']}\u00d7"
    if kind == "fxgate_at_least":
        return f"≥ {target['value']:,.0f} {result['unit']}"
    return "report only"


def _met(result: dict) -> str:
    met = result.get("met")
    return "—" if met is None else ("yes" if met else "**no**")


def _rows(result: dict) -> list[list[str]]:
    module = _module(result)
    if module is not None:
        return module.rows(result)
    name, unit = result["name"], result["unit"]
    setup = result["setup"]
    n = len(result["fxgate"]["samples"])
    ratio = result.get("ratio")
    ratio_text = "—" if ratio is None else f"{ratio:.2f}\u00d7"
    rows = []
    if name.startswith("ingest"):
        what = (
            f"ingest ceiling, QoS {setup['qos']}: {setup['messages_per_sample']:,} queued "
            f"single-read messages (~{setup['payload_bytes_mean']:.0f} B), ack after commit"
        )
    elif name.startswith("durability"):
        what = (
            f"durability cost, QoS {setup['qos']}: fxgate ingest, "
            "`power` (synchronous=FULL) vs `process` (WAL, NORMAL)"
        )
    else:
        what = (
            f"batched payloads: {setup['reads_per_message']} tag events/message, "
            f"{setup['reads_per_sample']:,} queued reads, QoS 1, sustained into the `reads` "
            "table (first PUBLISH → next-to-last batch committed; default config)"
        )
    base_label = {
        "ingest": "bare paho",
        "durability": "process",
        "batched": "bare paho + json.loads, no table",
    }[name.split("-")[0]]
    fx_label = "power" if name.startswith("durability") else "fxgate"
    rows.append(
        [
            f"`{name}`",
            what,
            f"{_num(result['baseline']['median'], unit)} ({base_label})",
            f"{_num(result['fxgate']['median'], unit)} ({fx_label})",
            ratio_text,
            _target(result),
            _met(result),
            f"{n}+{len(result['baseline']['samples'])}",
        ]
    )
    table = result.get("time_to_table")
    if table and table.get("seconds_median") is not None:
        rows.append(
            [
                f"`{name}` → table",
                f"same runs: first PUBLISH → all {setup['messages_per_sample']:,} rows in the "
                "Delta `reads` table (default batching)",
                "—",
                f"{table['seconds_median']:.2f} s ({table['rows_per_second_median']:,.0f} rows/s)",
                "—",
                "report only",
                "—",
                f"{n}",
            ]
        )
    end_to_end = result.get("end_to_end")
    if end_to_end and end_to_end.get("reads_per_second_median") is not None:
        rows.append(
            [
                f"`{name}` end-to-end",
                f"same runs: all {setup['reads_per_sample']:,} reads / (last row in the table - "
                "first PUBLISH), last batch's 2 s wait included",
                "—",
                f"{end_to_end['reads_per_second_median']:,.0f} {unit} "
                f"({end_to_end['seconds_median']:.2f} s)",
                "—",
                "report only",
                "—",
                f"{n}",
            ]
        )
    return rows


TABLE_START = "<!-- bench-table:start -->"
TABLE_END = "<!-- bench-table:end -->"


def update_page(page: Path, table: Path) -> bool:
    """Put the table between the page's markers; False if the page has none."""
    text = page.read_text()
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        return False
    body = table.read_text().rstrip("\n")
    page.write_text(text[: start + len(TABLE_START)] + "\n" + body + "\n" + text[end:])
    return True


def write_table(results_dir: Path) -> Path:
    results = {}
    for path in sorted(results_dir.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and doc.get("kind") == "fxgate-bench":
            results[doc["name"]] = doc

    def rank(name: str) -> tuple[int, str]:
        prefix = name.split("-", maxsplit=1)[0]
        return (ORDER.index(prefix) if prefix in ORDER else len(ORDER), name)

    names = sorted(results, key=rank)
    header = [
        "benchmark",
        "what",
        "baseline (median)",
        "fxgate (median)",
        "ratio",
        "target",
        "met?",
        "samples (fxgate+baseline)",
    ]
    lines = [
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
    ]
    for name in names:
        for row in _rows(results[name]):
            lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |")

    runs: dict[tuple[str, str], list[str]] = {}
    machines: dict[str, dict] = {}
    for name in names:
        doc = results[name]
        runs.setdefault((doc["command"], doc["generated"][:10]), []).append(name)
        machines[json.dumps(doc["machine"], sort_keys=True)] = doc["machine"]
    notes = [
        "",
        "Medians of alternating rounds (baseline, fxgate, baseline, fxgate, …) in one run;"
        " "
        "ratio = fxgate median / baseline median. Raw samples, CPU per thread, what bounds "
        "each figure and py-spy summaries: `bench/results/<benchmark>.json`; every sample "
        "in run order: `bench/results/<benchmark>.png`; flame graphs where a target is "
        "missed: `bench/results/<benchmark>-profile.svg`.",
        "",
    ]
    for (command, day), which in runs.items():
        notes.append(f"- `{command}` ({day}): {', '.join(which)}")
    commits: dict[str, list[str]] = {}
    for name in names:
        code = results[name].get("code") or {}
        before = (code.get("before") or {}).get("product_commit")
        after = (code.get("after") or {}).get("product_commit")
        workers = code.get("gateway_workers_started_at") or []
        label = before if before == after else f"{before} → {after} (changed during the run)"
        if any(w != before for w in workers):
            label += f"; gateway worker(s) started at {', '.join(workers)}"
        changed = (code.get("before") or {}).get("changed_files")
        if changed:
            label += f", with uncommitted changes to {', '.join(changed)}"
        commits.setdefault(label, []).append(name)
    for label, which in commits.items():
        notes.append(
            f"- code under test (newest commit touching {', '.join(PRODUCT_PATHS)}): {label}: "
            f"{', '.join(which)}"
        )
    for machine in machines.values():
        ram = machine.get("ram_bytes")
        notes.append(
            f"- machine: {machine.get('nproc')} vCPU {machine.get('cpu_model')}, "
            f"{ram / 2**30:.1f} GiB RAM, {machine.get('work_dir_filesystem')}; "
            f"Python {machine.get('python')}, paho-mqtt {machine.get('paho_mqtt')}, "
            f"mosquitto {machine.get('mosquitto')}, pyspark {machine.get('pyspark')}, "
            f"{machine.get('java')}"
        )
    others = [
        (s.get("machine_load") or {}).get("other_cores")
        for name in names
        for s in results[name].get("raw", [])
    ]
    others = [o for o in others if o is not None]
    if others:
        notes.append(
            f"- other processes on the machine used at most {max(others):.2f} cores during any "
            "sample (each sample's `machine_load` in the JSON; before each sample the bench "
            "waits, up to a limit, for them to drop under 0.3 cores)"
        )
    for name in names:
        doc = results[name]
        disturbed = doc.get("rounds_disturbed") or []
        if disturbed:
            used = doc.get("rounds_used") or []
            dropped = [r for r in disturbed if r not in used]
            notes.append(
                f"- `{name}`: round(s) {', '.join(map(str, disturbed))} ran while other "
                "processes used 0.3 cores or more; "
                + (
                    f"medians from the undisturbed rounds {', '.join(map(str, used))}"
                    if dropped
                    else "too few undisturbed rounds, so the medians include them: treat the "
                    "absolute figures with care"
                )
            )
    for name in names:
        bound = results[name].get("bound")
        if bound and results[name].get("met") is False:
            notes.append(f"- what bounds `{name}`: {bound}")
        elif bound and results[name].get("met") is None:
            notes.append(f"- `{name}`: {bound}")
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / TABLE_FILE
    path.write_text("\n".join(lines + notes) + "\n")
    return path
