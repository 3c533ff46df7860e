"""The private members of paho's Client that fxgate relies on are all there, as expected."""

import paho.mqtt.client as paho

from actors.mqtt import paho_private


def test_the_installed_paho_has_every_private_member_fxgate_relies_on():
    assert paho_private.missing() == []


def test_a_paho_without_one_of_them_is_named():
    class Renamed(paho.Client):
        _handle_pubrec = None  # as if an upgrade had renamed it

        def _packet_queue(self, command, payload, mid, qos, info=None):  # a parameter renamed
            return super()._packet_queue(command, payload, mid, qos, info)

    assert paho_private.missing(Renamed) == [
        "paho Client._handle_pubrec is gone",
        "paho Client._packet_queue takes (command, payload, mid, qos, info), "
        "not ('command', 'packet', 'mid', 'qos')",
    ]


def test_the_clients_use_only_listed_private_members():
    """Every `_name` of paho that our subclasses touch is in the list (or is their own)."""
    import inspect
    import re

    from actors.mqtt import client, upstream

    own = set()
    for module in (client, upstream):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module.__name__:
                own.update(vars(cls))
    used = set()
    for module in (client, upstream):
        used.update(re.findall(r"self\.(_[a-z_]+)", inspect.getsource(module)))
    paho_members = {
        name
        for name in used - own
        if hasattr(paho.Client, name) or name in ("_in_packet", "_sock", "_out_packet")
    }
    assert paho_members <= {
        *paho_private.METHODS,
        paho_private.IN_PACKET,
        paho_private.SOCK,
        paho_private.OUT_PACKET,
    }, paho_members
