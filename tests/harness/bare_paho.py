"""A bare paho-mqtt 2.2 subscriber, run as a subprocess, for contrast with fxgate.

`python -m tests.harness.bare_paho HOST PORT OUT [--die-at-pubrel]` subscribes to `contrast/#` at
QoS 2 with a persistent session and appends every delivered payload to OUT. With
--die-at-pubrel it SIGKILLs itself when the broker's PUBREL arrives: the broker already has paho's
PUBREC, and paho holds the message only in memory until PUBREL (DESIGN §4).
"""

import os
import signal
import sys

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties


class DiesAtPubrel(mqtt.Client):
    def _handle_pubrel(self):
        os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    host, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    cls = DiesAtPubrel if "--die-at-pubrel" in sys.argv else mqtt.Client
    client = cls(CallbackAPIVersion.VERSION2, "bare-paho", protocol=MQTTProtocolVersion.MQTTv5)

    def on_message(_client, _userdata, message):
        with open(out, "ab") as f:
            f.write(message.payload + b"\n")
        print(f"delivered {message.payload.decode()}", flush=True)

    client.on_message = on_message
    client.on_subscribe = lambda *_a: print("subscribed", flush=True)
    properties = Properties(PacketTypes.CONNECT)
    properties.SessionExpiryInterval = 3600
    client.connect(host, port, clean_start=False, properties=properties)
    client.subscribe("contrast/#", qos=2)
    client.loop_forever()


if __name__ == "__main__":
    main()
