"""Which reads go upstream, and under which topic: the `[[routes]]` of the configuration.

Pure functions over immutable values, no I/O: the pack and buffer actors call `route_for` and
`render_target` for every message, and the config loader uses the same checks to report a bad
route with its key. Topic matching follows MQTT 5 §4.7; the placeholders of a target are
`{topic}` (the whole source topic), `{reader}` (`spark.zebra.reader_id_from_topic`) and
`{environment}` (the gateway's environment id).
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from dataclasses import dataclass

from spark.topics import check_topic_filter, reader_id_from_topic, topic_matches

PLACEHOLDERS = ("topic", "reader", "environment")
DEFAULT_TARGET = "{topic}"


def check_topic_template(template: str, placeholders: tuple[str, ...], what: str) -> str:
    """A topic-name template with only these `{placeholders}` (`{{` and `}}` stand for literal
    braces); `what` names it in errors. Returns `template`; raises ValueError."""
    if not template:
        raise ValueError(f"a {what} must not be empty")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError:
        raise ValueError(
            f"{template!r}: unbalanced '{{' or '}}' (write '{{{{' or '}}}}' for a literal brace)"
        ) from None
    for literal, name, spec, conversion in parts:
        # Wildcards are for filters: a PUBLISH topic name holding one is a protocol error
        # (MQTT 5 §4.7.0), and the broker would drop the connection.
        if "+" in literal or "#" in literal or "\x00" in literal:
            raise ValueError(f"{template!r}: a topic name may not contain '+', '#' or NUL")
        if name is None:
            continue
        if name not in placeholders:
            shown = f"{{{name}}}" if name else "{}"
            named = [f"{{{p}}}" for p in placeholders]
            allowed = ", ".join(named[:-1]) + " or " + named[-1]
            raise ValueError(f"{template!r}: unknown placeholder {shown}; use {allowed}")
        if spec or conversion:
            raise ValueError(f"{template!r}: write {{{name}}} without a format spec or '!'")
    if template.startswith("$"):
        # Brokers reserve '$' topics for themselves (MQTT 5 §4.7.2); mosquitto refuses them.
        raise ValueError(f"{template!r}: a {what} may not start with '$'")
    return template


def check_target(template: str) -> str:
    """A route's target: `{topic}`, `{reader}` or `{environment}` in it."""
    return check_topic_template(template, PLACEHOLDERS, "target topic")


@dataclass(frozen=True)
class Route:
    """One `[[routes]]` entry. `index` is its position in the file, to name it in messages."""

    index: int
    source: str
    target: str = DEFAULT_TARGET
    qos: int = 1
    persist: bool = True

    def __post_init__(self) -> None:
        check_topic_filter(self.source)
        check_target(self.target)
        if self.qos not in (0, 1, 2):
            raise ValueError(f"routes[{self.index}].qos must be 0, 1 or 2, got {self.qos!r}")

    @property
    def effective_qos(self) -> int:
        """The QoS used upstream, whatever QoS a read arrived with (DESIGN §7.3: min(publish,
        subscription) is the source broker's rule, for our subscription). HiveMQ Edge's rule: a
        route that does not persist cannot promise redelivery across a restart, so it must not
        ask the broker for QoS 1/2."""
        return self.qos if self.persist else 0


def route_for(routes: Sequence[Route], topic: str) -> Route | None:
    """The first route, in config order, whose source matches `topic`; None: not forwarded."""
    for route in routes:
        if topic_matches(route.source, topic):
            return route
    return None


def render_target(route: Route, topic: str, environment_id: str) -> str:
    """The upstream topic for a message that arrived on `topic`."""
    return route.target.format(
        topic=topic, reader=reader_id_from_topic(topic), environment=environment_id
    )


class RouteCache:
    """`route_for` and `render_target`, remembered per topic: a gateway sees the same few topics
    (one or two per reader) for every message, and matching each against every route was a
    hot frame of the ledger and the outbound ledger (py-spy, forwarding while draining). Past
    MAX_TOPICS topics it forgets them all and starts again. One per thread."""

    MAX_TOPICS = 4096

    def __init__(self, routes: Sequence[Route], environment_id: str) -> None:
        self._routes = tuple(routes)
        self._environment_id = environment_id
        self._known: dict[str, tuple[Route, str] | None] = {}

    def __call__(self, topic: str) -> tuple[Route, str] | None:
        """The route `topic` takes and the upstream topic it renders; None: not forwarded."""
        try:
            return self._known[topic]
        except KeyError:
            pass
        route = route_for(self._routes, topic)
        found = (
            None if route is None else (route, render_target(route, topic, self._environment_id))
        )
        if len(self._known) >= self.MAX_TOPICS:
            self._known.clear()
        self._known[topic] = found
        return found


# -- the life-cycle events' topic ([lifecycle] topic) -----------------------------------------

LIFECYCLE_PLACEHOLDERS = ("environment", "client")
DEFAULT_LIFECYCLE_TOPIC = "fxgate/{environment}/{client}/lifecycle"


def check_lifecycle_topic(template: str) -> str:
    """The `[lifecycle] topic` template: `{environment}` and a `{client}` that is a whole level
    (so that `lifecycle_filter` can match every client with '+')."""
    check_topic_template(template, LIFECYCLE_PLACEHOLDERS, "topic")
    if "{client}" not in template.split("/"):
        raise ValueError(f"{template!r}: {{client}} must be a whole topic level of its own")
    return template


def lifecycle_topic(template: str, environment_id: str, client_id: str) -> str:
    """The topic a life-cycle event about `client_id` is published on."""
    return template.format(environment=environment_id, client=client_id)


def lifecycle_filter(template: str, environment_id: str) -> str:
    """The filter matching this gateway's life-cycle topics, for every client."""
    return check_topic_filter(template.format(environment=environment_id, client="+"))


def lifecycle_route(template: str, environment_id: str) -> Route:
    """The implicit route that forwards life-cycle events upstream on their own topic, at QoS 1
    and persisted: they are durable through the outbound ledger like reads. Index -1: it is
    not one of the file's `[[routes]]`, and it goes first so that a catch-all route cannot
    send events elsewhere."""
    return Route(-1, lifecycle_filter(template, environment_id), DEFAULT_TARGET, 1, True)
