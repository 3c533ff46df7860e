import re
from dataclasses import dataclass

import pytest

from actors.config.identity import (
    Identity,
    IdentityError,
    build_client_id,
    random_suffix,
    resolve_environment_id,
    resolve_identity,
    sanitize_hostname,
    shared_subscription,
)


@dataclass(frozen=True)
class Source:
    environment_id: str | None = None
    client_id: str = "fxgate"
    instance_id: str | None = None
    append_unique_id: bool = False
    shared_subscription_group: str = "fxgate"
    subscribe_topics: tuple[str, ...] = ("zebra/fx/+/reads",)
    management_topics: tuple[str, ...] = ()


# --- environment id ---------------------------------------------------------------------------


def test_configured_environment_id_wins_over_the_variable():
    result = resolve_environment_id(
        "plant-7", {"MQTT_ENVIRONMENT_ID": "plant-9"}, "production", "gw"
    )
    assert result == ("plant-7", "config")


def test_environment_id_comes_from_the_variable_when_not_configured():
    result = resolve_environment_id(None, {"MQTT_ENVIRONMENT_ID": "plant-9"}, "production", "gw")
    assert result == ("plant-9", "MQTT_ENVIRONMENT_ID")


def test_an_empty_variable_counts_as_unset():
    result = resolve_environment_id(None, {"MQTT_ENVIRONMENT_ID": ""}, "development", "gw")
    assert result == ("local-gw", "development-default")


def test_development_default_is_local_plus_the_sanitised_hostname():
    result = resolve_environment_id(None, {}, "development", "-Build_Box.Corp..LAN#1-")
    assert result == ("local-build-box-corp-lan-1", "development-default")


def test_development_default_of_a_very_long_hostname_still_obeys_the_id_rule():
    environment_id, _ = resolve_environment_id(None, {}, "development", "a" * 56 + ".x" * 20)
    assert re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", environment_id)
    assert not environment_id.endswith("-")


def test_hostname_with_nothing_usable_falls_back_to_localhost():
    assert sanitize_hostname("___") == "localhost"


def test_production_without_environment_id_is_an_error_naming_the_key():
    with pytest.raises(IdentityError) as caught:
        resolve_environment_id(None, {}, "production", "gw")
    assert caught.value.key == "source.environment_id"
    assert str(caught.value) == (
        "source.environment_id: required in production mode "
        "(set it in the file or MQTT_ENVIRONMENT_ID)"
    )


@pytest.mark.parametrize("bad", ["Plant-7", "plant/7", "plant+7", "plant#", "-plant", "", "a" * 64])
def test_invalid_configured_environment_id_names_the_key_and_the_rule(bad):
    with pytest.raises(IdentityError) as caught:
        resolve_environment_id(bad, {}, "development", "gw")
    assert str(caught.value).startswith(f"source.environment_id: {bad!r} is not a valid")
    assert "a-z, 0-9 and '-'" in str(caught.value)


def test_invalid_environment_id_from_the_variable_names_the_variable():
    with pytest.raises(IdentityError) as caught:
        resolve_environment_id(None, {"MQTT_ENVIRONMENT_ID": "plant/7"}, "production", "gw")
    assert caught.value.key == "MQTT_ENVIRONMENT_ID"
    assert str(caught.value).startswith("MQTT_ENVIRONMENT_ID: 'plant/7' is not a valid")


def test_identity_error_is_a_value_error():
    assert issubclass(IdentityError, ValueError)


def test_an_unknown_mode_is_rejected_rather_than_guessed():
    with pytest.raises(ValueError, match="unknown mode 'staging'"):
        resolve_environment_id(None, {}, "staging", "gw")


# --- client id --------------------------------------------------------------------------------


def test_client_id_joins_client_environment_and_instance():
    assert build_client_id("fxgate", "plant-7", "gw-01", False) == "fxgate-plant-7-gw-01"


def test_client_id_without_unique_suffix_never_calls_the_suffix_source():
    def unique() -> str:
        raise AssertionError("suffix requested although append_unique_id is false")

    assert build_client_id("fxgate", "plant-7", "gw-01", False, unique) == "fxgate-plant-7-gw-01"


def test_client_id_with_unique_suffix_appends_it():
    client_id = build_client_id("fxgate", "plant-7", "gw-01", True, unique=lambda: "0badcafe")
    assert client_id == "fxgate-plant-7-gw-01-0badcafe"


def test_default_unique_suffix_is_eight_fresh_hex_characters():
    first, second = random_suffix(), random_suffix()
    assert re.fullmatch(r"[0-9a-f]{8}", first)
    assert first != second


def test_instance_defaults_to_the_sanitised_hostname():
    identity = resolve_identity(Source(environment_id="plant-7"), "production", {}, "GW_01.Local")
    assert identity.client_id == "fxgate-plant-7-gw-01-local"


def test_configured_instance_id_is_used_instead_of_the_hostname():
    source = Source(environment_id="plant-7", instance_id="edge-3")
    identity = resolve_identity(source, "production", {}, "GW_01.Local")
    assert identity.client_id == "fxgate-plant-7-edge-3"


# --- subscriptions ----------------------------------------------------------------------------


def test_shared_subscription_scopes_the_group_by_environment():
    topic = shared_subscription("zebra/fx/+/reads", "fxgate", "plant-7")
    assert topic == "$share/fxgate-plant-7/zebra/fx/+/reads"


def test_empty_group_gives_a_plain_subscription():
    assert shared_subscription("zebra/fx/+/reads", "", "plant-7") == "zebra/fx/+/reads"


def test_resolve_identity_puts_every_topic_in_the_environment_group():
    source = Source(subscribe_topics=("a/+/reads", "b/#"), append_unique_id=True)
    identity = resolve_identity(
        source, "development", {"MQTT_ENVIRONMENT_ID": "lab"}, "gw", unique=lambda: "12345678"
    )
    assert identity == Identity(
        environment_id="lab",
        environment_source="MQTT_ENVIRONMENT_ID",
        client_id="fxgate-lab-gw-12345678",
        subscriptions=("$share/fxgate-lab/a/+/reads", "$share/fxgate-lab/b/#"),
    )


def test_management_topics_are_subscribed_too_in_the_same_group():
    source = Source(subscribe_topics=("zebra/fx/+/reads",), management_topics=("zebra/fx/+/mgmt",))
    identity = resolve_identity(source, "development", {"MQTT_ENVIRONMENT_ID": "lab"}, "gw")
    assert identity.subscriptions == (
        "$share/fxgate-lab/zebra/fx/+/reads",
        "$share/fxgate-lab/zebra/fx/+/mgmt",
    )
