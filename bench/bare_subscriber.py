"""The baseline: a bare paho-mqtt 2.2 subscriber with manual acks, draining its queued session.

    python -m bench.bare_subscriber HOST PORT CLIENT_ID --qos Q --messages N [--parse]
                                    [--broker-pid PID] [--receive-maximum W] [--subscribe F]

It resumes the persistent session CLIENT_ID (created and filled beforehand by the bench), acks
every message from `on_message` (QoS 1: PUBACK; QoS 2: PUBCOMP — paho has already sent PUBREC
on arrival and calls `on_message` at PUBREL, DESIGN §4) and prints one JSON line:

    {"messages": N, "reads": R, "seconds": S, "cpu_seconds": C, "broker_cpu_seconds": B, ...}

`seconds` runs from the first PUBLISH paho decodes to the N-th final ack handed to paho: the
same two points the gateway worker measures, so connect time is outside both. With --parse each
payload is decoded as JSON to count its reads (batched FX9600 arrays): the least a consumer of
reads must do. Nothing else: no storage, no forwarding. paho's defaults are kept: no Receive
Maximum is sent, so the broker's own cap (mosquitto's `max_inflight_messages`) governs, unless
--receive-maximum asks for a window of W, as fxgate's `source.receive_maximum` does.

With --subscribe FILTER it takes live traffic instead (bench.footprint's bare-paho variant): it
subscribes to FILTER at QoS Q on every connect, whether or not a session was there, and stops at
the N-th message.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time

import paho.mqtt.client as mqtt
import psutil
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


class CpuClock:
    """CPU seconds so far of this process and of the broker (when its pid was given)."""

    def __init__(self, broker_pid: int | None) -> None:
        self.broker = psutil.Process(broker_pid) if broker_pid else None

    def __call__(self) -> tuple[float, float | None]:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        broker = None
        if self.broker is not None:
            times = self.broker.cpu_times()
            broker = times.user + times.system
        return usage.ru_utime + usage.ru_stime, broker


class TimedClient(mqtt.Client):
    """paho, unchanged, except that it notes when the first PUBLISH came off the wire."""

    def __init__(self, *args, cpu: CpuClock, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.cpu = cpu
        self.first_publish: float | None = None
        self.first_cpu: tuple[float, float | None] | None = None

    def _handle_publish(self):
        # Only the first PUBLISH is timed; then paho's own method shadows this one, so the
        # other messages pay nothing for the probe.
        self._handle_publish = super()._handle_publish
        self.first_publish = time.monotonic()
        self.first_cpu = self.cpu()
        return super()._handle_publish()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("client_id")
    parser.add_argument("--qos", type=int, required=True)
    parser.add_argument("--messages", type=int, required=True)
    parser.add_argument("--parse", action="store_true")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--broker-pid", type=int, default=None)
    parser.add_argument("--receive-maximum", type=int, default=None)
    parser.add_argument("--subscribe", default=None)
    args = parser.parse_args()
    cpu = CpuClock(args.broker_pid)

    client = TimedClient(
        CallbackAPIVersion.VERSION2,
        args.client_id,
        protocol=MQTTProtocolVersion.MQTTv5,
        manual_ack=True,
        cpu=cpu,
    )
    state = {"messages": 0, "reads": 0, "done": None, "done_cpu": None, "session_present": None}
    finished = threading.Event()

    def on_connect(c, _userdata, flags, reason_code, _properties):
        state["session_present"] = bool(flags.session_present)
        if args.subscribe is not None and not reason_code.is_failure:
            c.subscribe(args.subscribe, qos=args.qos)
        elif reason_code.is_failure or not flags.session_present:
            # No queued session to drain: the measurement would be meaningless.
            finished.set()

    def on_message(c, _userdata, message):
        if args.parse:
            doc = json.loads(message.payload)
            state["reads"] += len(doc) if isinstance(doc, list) else 1
        else:
            state["reads"] += 1
        c.ack(message.mid, message.qos)
        state["messages"] += 1
        if state["messages"] == args.messages:
            state["done"] = time.monotonic()
            state["done_cpu"] = cpu()
            finished.set()

    client.on_connect = on_connect
    client.on_message = on_message
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    if args.receive_maximum is not None:
        properties.ReceiveMaximum = args.receive_maximum
    client.connect(args.host, args.port, keepalive=60, clean_start=False, properties=properties)
    client.loop_start()
    ok = finished.wait(args.timeout) and state["done"] is not None
    client.disconnect()
    client.loop_stop()
    result = {
        "ok": ok,
        "session_present": state["session_present"],
        "messages": state["messages"],
        "reads": state["reads"],
        "pid": os.getpid(),
    }
    if ok:
        seconds = state["done"] - client.first_publish
        result["seconds"] = seconds
        result["cpu_seconds"] = round(state["done_cpu"][0] - client.first_cpu[0], 3)
        result["cores"] = round(result["cpu_seconds"] / seconds, 3)
        if cpu.broker is not None:
            result["broker_cpu_seconds"] = round(state["done_cpu"][1] - client.first_cpu[1], 3)
            result["broker_cores"] = round(result["broker_cpu_seconds"] / seconds, 3)
    print(json.dumps(result), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
