"""Reading a py-spy profile back: where the gateway's Python threads spent their samples.

`py-spy record --format raw --threads` writes collapsed stacks, one line per distinct stack:

    thread (31538): InboundLedger (urn:uuid:...);_bootstrap (threading.py:1002);...;leaf (f.py:9) 42

With `--gil` only samples taken while the thread held the GIL are kept, so the totals say how much
of the profiled time each thread held it, and the leaf frames say doing what.

With `--subprocesses` each stack starts with the processes it runs in, outermost first:

    process 315:"python -m actors.app.cli run";process 319:"python -m actors.forward_process";...

A thread of a child process is named after that child ("forward process: OutboundLedger"); each
process has a GIL of its own, so the shares are of all the samples taken in every process.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_THREAD = re.compile(r"^thread \((?P<tid>[^)]*)\)(?::\s*(?P<name>.*))?$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<where>[^()]*)\)$")
# One process frame: its command line may hold ";", so it ends where the next frame begins.
_PROCESS = re.compile(r'process \d+:"(?P<cmdline>.*?)";(?=process \d+:"|thread \()')
# The daemon's Python children, by what their command line runs.
_CHILDREN = {
    "actors.forward_process": "forward process",
}


def _process_label(cmdline: str) -> str:
    for module, label in _CHILDREN.items():
        if module in cmdline:
            return label
    words = cmdline.split()
    return words[-1] if words else "child"


def _thread_role(name: str | None) -> str:
    if not name:
        return "unnamed"
    if name.startswith("paho-mqtt-client-"):
        return "paho-network"
    return re.sub(r"( \(urn:uuid:[0-9a-f-]+\)|-\d+)$", "", name)


def _short(frame: str) -> str:
    """'send_ack (actors/mqtt/client.py:103)' -> 'send_ack (mqtt_client.py)'"""
    match = _FRAME.match(frame)
    if not match:
        return frame
    where = match.group("where").rsplit(":", 1)[0]
    return f"{match.group('func')} ({Path(where).name})"


def summarize_raw(path: Path, rate: int, top: int = 15) -> dict:
    """Samples per thread, the hottest leaf frames, and the hottest frames per thread."""
    per_thread: Counter[str] = Counter()
    leaves: Counter[str] = Counter()
    inclusive: dict[str, Counter[str]] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        match = _LINE.match(line.strip())
        if not match:
            continue
        count = int(match.group("count"))
        stack = match.group("stack")
        cmdlines = []
        while process := _PROCESS.match(stack):
            cmdlines.append(process["cmdline"])
            stack = stack[process.end() :]
        child = _process_label(cmdlines[-1]) if len(cmdlines) > 1 else None
        frames = stack.split(";")
        role = "unknown"
        thread = _THREAD.match(frames[0]) if frames else None
        if thread:
            role = _thread_role(thread.group("name"))
            frames = frames[1:]
        if child is not None:
            role = f"{child}: {role}"
        total += count
        per_thread[role] += count
        if frames:
            leaves[f"{role}: {_short(frames[-1])}"] += count
        seen = set()
        for frame in frames:
            short = _short(frame)
            if short not in seen:
                seen.add(short)
                inclusive.setdefault(role, Counter())[short] += count

    def share(n: int) -> float:
        return round(n / total, 3) if total else 0.0

    return {
        "samples": total,
        "sampled_seconds": round(total / rate, 2),
        "per_thread": {role: share(n) for role, n in per_thread.most_common()},
        "top_leaf_frames": [[frame, share(n)] for frame, n in leaves.most_common(top)],
        "top_inclusive_frames_per_thread": {
            role: [
                [frame, share(n)]
                for frame, n in counter.most_common(top + 6)
                # The thread's own bootstrap frames are in every stack: they say nothing.
                if not frame.startswith(("_bootstrap", "Thread.", "run (threading", "_actor_loop"))
            ][:10]
            for role, counter in inclusive.items()
            if per_thread[role] >= 0.02 * total
        },
    }
