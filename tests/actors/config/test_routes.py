import pytest

from actors.config.routes import Route, RouteCache, check_target, render_target, route_for
from spark.topics import check_topic_filter, topic_matches

# --- topic_matches: MQTT 5 §4.7 -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("topic_filter", "topic", "matches"),
    [
        # exact
        ("zebra/fx/r1/reads", "zebra/fx/r1/reads", True),
        ("zebra/fx/r1/reads", "zebra/fx/r2/reads", False),
        ("zebra/fx/r1/reads", "zebra/fx/r1/reads/x", False),
        ("zebra/fx/r1/reads", "zebra/fx/r1", False),
        ("Zebra/fx", "zebra/fx", False),  # topics are case-sensitive
        # '+' takes exactly one level
        ("zebra/fx/+/reads", "zebra/fx/r1/reads", True),
        ("zebra/fx/+/reads", "zebra/fx/r1/x/reads", False),
        ("zebra/fx/+/reads", "zebra/fx/reads", False),
        ("zebra/+", "zebra/fx/r1", False),
        ("+/+", "a/b", True),
        ("+", "a", True),
        ("+", "a/b", False),
        # '#' takes the rest, and the parent level itself
        ("zebra/#", "zebra/fx/r1/reads", True),
        ("zebra/#", "zebra", True),
        ("zebra/#", "zebrafx", False),
        ("zebra/fx/#", "zebra", False),
        ("#", "zebra/fx/r1/reads", True),
        ("+/fx/#", "zebra/fx", True),
        # '$' topics are not matched by a leading wildcard, only by an explicit '$' level
        ("#", "$SYS/broker/uptime", False),
        ("+/broker/uptime", "$SYS/broker/uptime", False),
        ("$SYS/#", "$SYS/broker/uptime", True),
        ("$SYS/+/uptime", "$SYS/broker/uptime", True),
        ("zebra/+/$x", "zebra/fx/$x", True),  # '$' only matters at the start of a topic
        # empty levels are levels
        ("zebra/+/reads", "zebra//reads", True),
        ("+/reads", "/reads", True),
        ("#", "/reads", True),
        ("zebra/+", "zebra/", True),
        ("zebra/#", "zebra/", True),
        ("zebra/fx", "zebra//fx", False),
        ("/zebra", "zebra", False),
    ],
)
def test_topic_matches_follows_the_mqtt_wildcard_rules(topic_filter, topic, matches):
    assert topic_matches(topic_filter, topic) is matches


# --- route_for ------------------------------------------------------------------------------


def test_first_matching_route_in_config_order_wins():
    routes = (
        Route(0, "zebra/fx/r1/reads", "special/{reader}"),
        Route(1, "zebra/fx/+/reads"),
        Route(2, "zebra/#", "all/{topic}"),
    )
    assert route_for(routes, "zebra/fx/r1/reads") is routes[0]
    assert route_for(routes, "zebra/fx/r2/reads") is routes[1]
    assert route_for(routes, "zebra/fx/r2/status") is routes[2]
    assert route_for(tuple(reversed(routes)), "zebra/fx/r1/reads") is routes[2]


def test_a_topic_no_route_matches_is_not_forwarded():
    assert route_for((Route(0, "zebra/#"),), "other/fx/r1/reads") is None
    assert route_for((), "zebra/fx/r1/reads") is None


# --- render_target --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "rendered"),
    [
        ("{topic}", "zebra/fx/dock-1/reads"),
        ("plants/{environment}/readers/{reader}/reads", "plants/plant-7/readers/dock-1/reads"),
        ("up/{topic}", "up/zebra/fx/dock-1/reads"),
        ("{environment}-{reader}", "plant-7-dock-1"),
        ("fixed/topic", "fixed/topic"),
        ("lit/{{braces}}/{reader}", "lit/{braces}/dock-1"),
    ],
)
def test_render_target_fills_in_the_placeholders(target, rendered):
    route = Route(0, "zebra/#", target)
    assert render_target(route, "zebra/fx/dock-1/reads", "plant-7") == rendered


def test_render_target_takes_the_reader_as_zebra_does_for_short_topics():
    route = Route(0, "#", "r/{reader}")
    assert render_target(route, "dock-1", "plant-7") == "r/dock-1"
    assert render_target(route, "zebra//reads", "plant-7") == "r/zebra//reads"


# --- Route ----------------------------------------------------------------------------------


def test_a_route_has_the_documented_defaults():
    route = Route(3, "zebra/#")
    assert (route.target, route.qos, route.persist) == ("{topic}", 1, True)


@pytest.mark.parametrize(
    ("qos", "persist", "effective"),
    [(0, True, 0), (1, True, 1), (2, True, 2), (0, False, 0), (1, False, 0), (2, False, 0)],
)
def test_effective_qos_is_zero_when_the_route_does_not_persist(qos, persist, effective):
    assert Route(0, "a/#", qos=qos, persist=persist).effective_qos == effective


def test_a_route_refuses_an_invalid_filter_target_or_qos():
    with pytest.raises(ValueError, match="'#' must be a whole level"):
        Route(0, "a/#/b")
    with pytest.raises(ValueError, match="unknown placeholder"):
        Route(0, "a/#", "{site}")
    with pytest.raises(ValueError, match=r"routes\[4\]\.qos must be 0, 1 or 2, got 3"):
        Route(4, "a/#", qos=3)


@pytest.mark.parametrize(
    ("template", "reason"),
    [
        ("{site}/x", "unknown placeholder {site}; use {topic}, {reader} or {environment}"),
        ("{}/x", "unknown placeholder {}"),
        ("{0}", "unknown placeholder {0}"),
        ("{topic!r}", "write {topic} without a format spec or '!'"),
        ("{reader:>8}", "write {reader} without a format spec or '!'"),
        ("up/{topic", "unbalanced '{' or '}'"),
        ("up/topic}", "unbalanced '{' or '}'"),
        ("up/+/{reader}", "a topic name may not contain '+', '#' or NUL"),
        ("up/#", "a topic name may not contain '+', '#' or NUL"),
        ("$SYS/{reader}", "a target topic may not start with '$'"),
        ("", "a target topic must not be empty"),
    ],
)
def test_check_target_says_what_is_wrong(template, reason):
    with pytest.raises(ValueError) as caught:
        check_target(template)
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    ("topic_filter", "reason"),
    [
        ("", "must not be empty"),
        ("a/#/b", "'#' must be a whole level and the last one"),
        ("a/b#", "'#' must be a whole level and the last one"),
        ("a/b+/c", "'+' must be a whole level"),
        ("a/\x00", "is not a valid MQTT topic filter"),
        ("a/" + "x" * 65535, "is not a valid MQTT topic filter"),
    ],
)
def test_check_topic_filter_says_which_rule_is_broken(topic_filter, reason):
    with pytest.raises(ValueError) as caught:
        check_topic_filter(topic_filter)
    assert reason in str(caught.value)


def test_the_route_cache_answers_as_route_for_and_render_target_and_stays_bounded(monkeypatch):
    routes = (
        Route(0, "zebra/fx/+/reads", target="fx/{environment}/{reader}"),
        Route(1, "zebra/fx/#", target="all/{topic}"),
    )
    cache = RouteCache(routes, "plant-7")
    topics = ["zebra/fx/r1/reads", "zebra/fx/r1/events", "other/r1", "zebra/fx/r1/reads"]
    for topic in topics:
        route = route_for(routes, topic)
        expected = None if route is None else (route, render_target(route, topic, "plant-7"))
        assert cache(topic) == expected
    monkeypatch.setattr(RouteCache, "MAX_TOPICS", 3)
    small = RouteCache(routes, "plant-7")
    for n in range(10):
        assert small(f"zebra/fx/r{n}/reads") == (routes[0], f"fx/plant-7/r{n}")
        assert len(small._known) <= 3
