import re
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from actors.config import SECTIONS, Config, ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
HOST = "gw-01"
NEEDS_ENVIRONMENT_ID = (
    "source.environment_id: required in production mode (set it in the file or MQTT_ENVIRONMENT_ID)"
)


def load(path: Path | None = None, environ: dict[str, str] | None = None) -> Config:
    return load_config(path, environ={} if environ is None else environ, hostname=HOST)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "fxgate.toml"
    path.write_text(text)
    return path


def errors_of(path: Path | None = None, environ: dict[str, str] | None = None) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        load(path, environ)
    assert str(caught.value) == "\n".join(caught.value.errors)
    return caught.value.errors


# --- defaults and the shipped files -----------------------------------------------------------


def test_defaults_load_without_a_file():
    config = load()
    assert (config.source.host, config.source.port, config.source.qos) == ("127.0.0.1", 1883, 2)
    assert config.source.clean_session is False
    assert config.source.session_expiry_interval_seconds == 3600
    assert (
        config.source.reconnect_min_delay_seconds,
        config.source.reconnect_max_delay_seconds,
        config.source.reconnect_jitter,
    ) == (1.0, 120.0, 0.25)
    assert (config.packs.max_messages, config.packs.processing_timeout_seconds) == (200, 20.0)
    assert (config.packs.ack_strategy, config.packs.retries) == ("RETRY_ALL", 3)
    assert config.gateway.mode == "development"
    assert config.identity.environment_id == "local-gw-01"
    assert config.identity.environment_source == "development-default"
    assert config.identity.client_id == "fxgate-local-gw-01-gw-01"
    # Plain by default: mosquitto forgets shared subscriptions on restart (test_mosquitto_facts).
    assert config.identity.subscriptions == ("zebra/fx/+/reads",)


def test_gateway_toml_loads_and_equals_the_defaults():
    assert load(CONFIGS / "gateway.toml") == load()


def test_gateway_toml_spells_out_every_key_so_it_cannot_drift():
    text = (CONFIGS / "gateway.toml").read_text()
    written = tomllib.loads(text)
    for section, model in SECTIONS.items():
        for key, field in model.model_fields.items():
            if field.is_required() or field.get_default(call_default_factory=True) is not None:
                assert key in written[section], f"{section}.{key} missing from gateway.toml"
            else:
                assert re.search(rf"^# {key} = ", text, re.MULTILINE), (
                    f"{section}.{key} undocumented"
                )


def test_production_example_loads_when_its_password_variable_is_set():
    config = load(CONFIGS / "production.example.toml", {"FXGATE_MQTT_PASSWORD": "pw"})
    assert config.gateway.mode == "production"
    assert config.identity.environment_source == "config"
    assert config.source.password({"FXGATE_MQTT_PASSWORD": "pw"}) == "pw"


def test_production_example_takes_environment_id_from_the_variable_when_the_file_has_none(
    tmp_path,
):
    text = (CONFIGS / "production.example.toml").read_text()
    path = write(tmp_path, re.sub(r"(?m)^environment_id = .*$", "", text))
    config = load(path, {"MQTT_ENVIRONMENT_ID": "plant-9", "FXGATE_MQTT_PASSWORD": "pw"})
    assert config.identity.environment_id == "plant-9"
    assert config.identity.environment_source == "MQTT_ENVIRONMENT_ID"


def test_production_example_without_its_password_variable_names_password_env():
    (error,) = errors_of(CONFIGS / "production.example.toml")
    assert error.startswith("source.password_env: environment variable FXGATE_MQTT_PASSWORD")


# --- errors in a file -------------------------------------------------------------------------


def test_bad_type_names_the_key():
    assert errors_of(environ={"FXGATE__SOURCE__PORT": "abc"}) == (
        "source.port: expected an integer, got 'abc' (from FXGATE__SOURCE__PORT)",
    )


def test_bad_type_in_a_file_names_the_key(tmp_path):
    path = write(tmp_path, '[source]\nport = "abc"\n')
    assert errors_of(path) == ("source.port: expected an integer, got 'abc'",)


def test_a_boolean_is_not_taken_for_an_integer(tmp_path):
    path = write(tmp_path, "[source]\nport = true\n")
    assert errors_of(path) == ("source.port: expected an integer, got true",)


def test_out_of_range_value_names_the_key_and_the_bound(tmp_path):
    path = write(tmp_path, "[source]\nport = 0\n")
    assert errors_of(path) == ("source.port: must be at least 1, got 0",)


def test_unknown_key_suggests_the_closest_name(tmp_path):
    path = write(tmp_path, "[source]\nprot = 1884\n")
    assert errors_of(path) == ("source.prot: unknown key (did you mean 'port'?)",)


def test_unknown_section_suggests_the_closest_name(tmp_path):
    path = write(tmp_path, "[sorce]\nport = 1884\n")
    assert errors_of(path) == ("sorce: unknown section (did you mean 'source'?)",)


def test_a_key_above_every_section_points_to_its_section(tmp_path):
    path = write(tmp_path, "port = 1884\n")
    assert errors_of(path) == (
        "port: unknown section (keys belong in a section: did you mean source.port?)",
    )


def test_a_section_that_is_not_a_table_is_named(tmp_path):
    path = write(tmp_path, "source = 5\n")
    assert errors_of(path) == ("source: expected a table, got 5",)


def test_two_errors_in_one_file_are_both_reported(tmp_path):
    path = write(tmp_path, '[source]\nport = "abc"\nqos = 3\n[packs]\nack_strategy = "RETRY"\n')
    assert errors_of(path) == (
        "source.port: expected an integer, got 'abc'",
        "source.qos: must be at most 2, got 3",
        "packs.ack_strategy: expected 'RETRY_ALL' or 'SKIP_ALL', got 'RETRY'",
    )


def test_errors_from_the_file_and_from_overrides_are_reported_together(tmp_path):
    path = write(tmp_path, "[ledger]\nsize = 1\n")
    errors = errors_of(path, {"FXGATE__SOURCE__QOS": "5", "FXGATE__SOURCE__HOSTT": "x"})
    assert errors == (
        "source.hostt: unknown key (did you mean 'host'?) (from FXGATE__SOURCE__HOSTT)",
        "source.qos: must be at most 2, got 5 (from FXGATE__SOURCE__QOS)",
        "ledger.size: unknown key",
    )


def test_identity_error_is_reported_alongside_errors_in_other_sections(tmp_path):
    path = write(tmp_path, '[gateway]\nmode = "production"\n[packs]\nretries = -1\n')
    assert errors_of(path) == (
        "packs.retries: must be at least 0, got -1",
        NEEDS_ENVIRONMENT_ID,
    )


def test_bad_toml_syntax_names_the_file_and_the_line(tmp_path):
    path = write(tmp_path, "[source]\nport = 1884\nhost = \n")
    (error,) = errors_of(path)
    assert error.startswith(f"{path}: invalid TOML")
    assert "line 3" in error


def test_missing_file_names_the_path(tmp_path):
    path = tmp_path / "nowhere.toml"
    assert errors_of(path) == (f"{path}: config file not found",)


def test_invalid_topic_filters_are_rejected_with_the_rule(tmp_path):
    path = write(tmp_path, '[source]\nsubscribe_topics = ["a/#/b", "a/b+", "$share/g/a"]\n')
    errors = errors_of(path)
    assert (
        errors[0]
        == "source.subscribe_topics[0]: 'a/#/b': '#' must be a whole level and the last one"
    )
    assert errors[1] == "source.subscribe_topics[1]: 'a/b+': '+' must be a whole level"
    assert errors[2].startswith("source.subscribe_topics[2]: '$share/g/a': give the plain filter")


def test_an_empty_topic_list_is_rejected(tmp_path):
    path = write(tmp_path, "[source]\nsubscribe_topics = []\n")
    assert errors_of(path) == ("source.subscribe_topics: must not be empty",)


def test_reconnect_max_delay_below_min_is_an_error(tmp_path):
    path = write(
        tmp_path, "[source]\nreconnect_min_delay_seconds = 5.0\nreconnect_max_delay_seconds = 2\n"
    )
    (error,) = errors_of(path)
    assert error.startswith("source.reconnect_max_delay_seconds: must be >= reconnect_min_delay")


def test_an_integer_is_accepted_where_a_number_is_expected(tmp_path):
    path = write(tmp_path, "[packs]\nlinger_seconds = 2\n")
    assert load(path).packs.linger_seconds == 2.0


def test_log_level_is_case_insensitive_and_stored_upper_case(tmp_path):
    path = write(tmp_path, '[gateway]\nlog_level = "debug"\n')
    assert load(path).gateway.log_level == "DEBUG"


# --- environment overrides --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "read"),
    [
        ("FXGATE__SOURCE__PORT", "1884", lambda c: c.source.port == 1884),
        ("FXGATE__SOURCE__CLEAN_SESSION", "true", lambda c: c.source.clean_session is True),
        ("FXGATE__PACKS__LINGER_SECONDS", "0.5", lambda c: c.packs.linger_seconds == 0.5),
        (
            "FXGATE__SOURCE__SUBSCRIBE_TOPICS",
            '["a/+", "b/#"]',
            lambda c: c.source.subscribe_topics == ("a/+", "b/#"),
        ),
        ("FXGATE__SOURCE__HOST", "broker.local", lambda c: c.source.host == "broker.local"),
    ],
)
def test_env_override_sets_a_typed_value(variable, value, read):
    assert read(load(environ={variable: value}))


def test_env_override_wins_over_the_file(tmp_path):
    path = write(tmp_path, "[source]\nport = 1999\n")
    assert load(path, {"FXGATE__SOURCE__PORT": "1884"}).source.port == 1884


def test_env_override_section_and_key_are_case_insensitive():
    assert load(environ={"fxgate__Source__Port": "1884"}).source.port == 1884


def test_env_override_of_a_string_key_keeps_text_that_looks_like_a_number():
    config = load(environ={"FXGATE__SOURCE__CLIENT_ID": "123"})
    assert config.source.client_id == "123"
    assert config.identity.client_id == "123-local-gw-01-gw-01"


def test_env_override_with_an_empty_value_gives_plain_subscriptions():
    config = load(environ={"FXGATE__SOURCE__SHARED_SUBSCRIPTION_GROUP": ""})
    assert config.identity.subscriptions == ("zebra/fx/+/reads",)


def test_env_override_sets_one_spark_conf_entry_next_to_those_of_the_file(tmp_path):
    path = write(tmp_path, '[spark.conf]\n"spark.ui.enabled" = false\n')
    environ = {
        "FXGATE__SPARK__CONF__spark.sql.shuffle.partitions": "4",
        "FXGATE__SPARK__CONF__spark.local.dir": "/srv/tmp",
    }
    assert load(path, environ).spark.conf == {
        "spark.ui.enabled": False,
        "spark.sql.shuffle.partitions": 4,
        "spark.local.dir": "/srv/tmp",
    }


def test_unknown_env_override_key_is_an_error_naming_the_variable():
    assert errors_of(environ={"FXGATE__SOURCE__PROT": "1884"}) == (
        "source.prot: unknown key (did you mean 'port'?) (from FXGATE__SOURCE__PROT)",
    )


def test_unknown_env_override_section_is_an_error_naming_the_variable():
    assert errors_of(environ={"FXGATE__SPORK__MASTER": "local"}) == (
        "spork: unknown section (did you mean 'spark'?) (from FXGATE__SPORK__MASTER)",
    )


def test_env_override_without_a_key_is_an_error():
    assert errors_of(environ={"FXGATE__SOURCE": "x"}) == (
        "FXGATE__SOURCE: expected FXGATE__<SECTION>__<KEY>",
    )


def test_bad_spark_conf_entry_from_the_environment_names_entry_and_variable():
    assert errors_of(environ={"FXGATE__SPARK__CONF__spark.x": "[1]"}) == (
        (
            'spark.conf."spark.x": expected a string, number or boolean, got [1] '
            "(from FXGATE__SPARK__CONF__spark.x)"
        ),
    )


def test_variables_without_the_double_underscore_prefix_are_ignored():
    assert load(environ={"FXGATE_CONFIG": "/etc/x.toml", "FXGATEX__A__B": "1"}) == load()


# --- production rules, secrets ----------------------------------------------------------------


def test_production_without_environment_id_names_the_key(tmp_path):
    path = write(tmp_path, '[gateway]\nmode = "production"\n')
    assert errors_of(path) == (NEEDS_ENVIRONMENT_ID,)


def test_invalid_environment_id_in_the_file_is_a_config_error(tmp_path):
    path = write(tmp_path, '[source]\nenvironment_id = "Plant/7"\n')
    (error,) = errors_of(path)
    assert error.startswith("source.environment_id: 'Plant/7' is not a valid environment id")


def test_invalid_environment_id_from_an_override_names_the_variable():
    (error,) = errors_of(environ={"FXGATE__SOURCE__ENVIRONMENT_ID": "plant 7"})
    assert error.startswith("source.environment_id: 'plant 7' is not a valid environment id")
    assert error.endswith("(from FXGATE__SOURCE__ENVIRONMENT_ID)")


def test_production_refuses_a_unique_client_id_suffix(tmp_path):
    path = write(tmp_path, '[gateway]\nmode = "production"\n[source]\nappend_unique_id = true\n')
    (error,) = errors_of(path, {"MQTT_ENVIRONMENT_ID": "plant-7"})
    assert error.startswith("source.append_unique_id: must be false in production mode")


def test_password_is_read_from_the_named_variable_when_asked(tmp_path):
    path = write(tmp_path, '[source]\nusername = "fx"\npassword_env = "MQTT_PW"\n')
    config = load(path, {"MQTT_PW": "at-load"})
    assert config.source.password({"MQTT_PW": "at-connect"}) == "at-connect"


def test_unset_password_variable_gives_none_in_development(tmp_path):
    path = write(tmp_path, '[source]\nusername = "fx"\npassword_env = "MQTT_PW"\n')
    assert load(path).source.password({}) is None


def test_password_never_appears_in_repr_str_or_summary(tmp_path):
    secret = "s3cret-Value-42"
    path = write(tmp_path, '[source]\nusername = "fx"\npassword_env = "MQTT_PW"\n')
    config = load(path, {"MQTT_PW": secret})
    assert config.source.password({"MQTT_PW": secret}) == secret
    assert secret not in repr(config)
    assert secret not in str(config)
    assert all(secret not in line for line in config.summary_lines())


def test_a_password_written_into_password_env_is_not_echoed(tmp_path):
    path = write(tmp_path, '[source]\npassword_env = "hunter 2!"\n')
    (error,) = errors_of(path)
    assert error.startswith("source.password_env: must be the NAME of an environment variable")
    assert "hunter" not in error


def test_secret_looking_spark_conf_values_are_masked_in_repr(tmp_path):
    path = write(tmp_path, '[spark.conf]\n"spark.hadoop.fs.s3a.secret.key" = "AKIA-secret"\n')
    config = load(path)
    assert config.spark.conf["spark.hadoop.fs.s3a.secret.key"] == "AKIA-secret"
    assert "AKIA-secret" not in repr(config)
    assert all("AKIA-secret" not in line for line in config.summary_lines())


# --- the model --------------------------------------------------------------------------------


def test_config_is_frozen():
    config = load()
    with pytest.raises(ValidationError):
        config.source.port = 1884  # type: ignore[misc]


def test_relative_data_dir_resolves_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = load()
    assert config.gateway.data_path == tmp_path / "data"
    assert config.ledger_path == tmp_path / "data" / "ledger.sqlite"
    assert config.tables_path == tmp_path / "data" / "tables"


def test_explicit_tables_dir_is_used_as_given(tmp_path):
    path = write(tmp_path, f'[spark]\ntables_dir = "{tmp_path / "t"}"\n')
    assert load(path).tables_path == tmp_path / "t"


def test_summary_lines_show_what_an_operator_checks_at_start(tmp_path):
    path = write(
        tmp_path,
        f'[gateway]\ndata_dir = "{tmp_path}"\n'
        '[source]\nhost = "10.0.0.5"\nshared_subscription_group = "fxgate"\n',
    )
    summary = "\n".join(load(path).summary_lines())
    for fact in [
        "10.0.0.5:1883",
        "fxgate-local-gw-01-gw-01",
        "local-gw-01 (from development-default)",
        "$share/fxgate-local-gw-01/zebra/fx/+/reads",
        f"data dir {tmp_path}",
        "durability process",
        "spark master local[2]",
    ]:
        assert fact in summary
