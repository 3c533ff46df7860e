import re
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError

from actors.config.routes import Route
from actors.config.schema import OPTIONAL_SECTIONS, SECTIONS, Config, ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[3] / "configs"
HOST = "gw-01"
NEEDS_ENVIRONMENT_ID = (
    "source.environment_id: required in production mode (set it in the file or MQTT_ENVIRONMENT_ID)"
)
UPSTREAM = '[upstream]\nhost = "cloud.example.com"\n'
ROUTE = '[[routes]]\nsource = "zebra/fx/+/reads"\n'
PRODUCTION_PASSWORDS = {"FXGATE_MQTT_PASSWORD": "pw", "FXGATE_UPSTREAM_PASSWORD": "up"}
# Every commented-out key line and section header of gateway.toml ("# key = value", "# [x]").
COMMENTED_OUT = re.compile(
    r"^# (\[\[?[a-z_.]+\]\]?|[a-z_]+ = (?:[\"\[0-9-]|true\b|false\b).*)$", re.MULTILINE
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
    assert (config.buffer.max_messages, config.buffer.max_bytes) == (10000, 16 * 1024 * 1024)
    assert (config.buffer.high_watermark, config.buffer.low_watermark) == (None, 0.5)
    assert (config.ledger.max_bytes, config.ledger.min_free_bytes) == (4 * 1024**3, 1024**3)
    assert (config.buffer.overflow, config.buffer.persist_qos0) == ("drop_oldest", False)
    assert (config.spark.backlog_high_messages, config.spark.backlog_low_messages) == (
        100000,
        50000,
    )


def test_gateway_toml_loads_and_equals_the_defaults():
    assert load(CONFIGS / "gateway.toml") == load()


def test_gateway_toml_spells_out_every_key_so_it_cannot_drift():
    text = (CONFIGS / "gateway.toml").read_text()
    written = tomllib.loads(text)
    for section, model in SECTIONS.items():
        if section in OPTIONAL_SECTIONS:
            continue  # written commented out: see the next test
        for key, field in model.model_fields.items():
            if field.is_required() or field.get_default(call_default_factory=True) is not None:
                assert key in written[section], f"{section}.{key} missing from gateway.toml"
            else:
                assert re.search(rf"^# {key} = ", text, re.MULTILINE), (
                    f"{section}.{key} undocumented"
                )


def test_gateway_toml_uncommented_enables_forwarding_and_spells_out_every_optional_key(tmp_path):
    text = (CONFIGS / "gateway.toml").read_text()
    uncommented = COMMENTED_OUT.sub(r"\1", text)
    written = tomllib.loads(uncommented)
    for section in OPTIONAL_SECTIONS:
        assert set(written[section]) == set(SECTIONS[section].model_fields), section
    (route,) = written["routes"]
    assert set(route) == {"source", "target", "qos", "persist"}
    # Keys naming files are checked at load and their example paths do not exist here (and
    # password_file excludes password_env); they are tested in tests/actors/test_tls.py and
    # (store_credentials_file) below.
    # high_watermark, parse_worker and parse_helpers are no longer used: written down only to
    # say so (their warnings are tested in test_the_old_*_still_load*_and_warn*).
    uncommented = re.sub(
        r"^(password_file|store_credentials_file|tls_ca_file|tls_cert_file|tls_key_file"
        r"|high_watermark|parse_worker|parse_helpers) = .*$",
        "",
        uncommented,
        flags=re.MULTILINE,
    )
    config = load(write(tmp_path, uncommented))
    assert config.forwarding
    assert config.routes == (Route(0, "zebra/fx/+/reads", "{topic}", 1, True),)
    assert config.warnings() == []
    # The values shown are the defaults, where a key has one.
    for key, field in SECTIONS["upstream"].model_fields.items():
        if not field.is_required() and field.default is not None:
            assert getattr(config.upstream, key) == field.default, f"upstream.{key}"


def test_production_example_loads_when_its_password_variables_are_set():
    config = load(CONFIGS / "production.example.toml", PRODUCTION_PASSWORDS)
    assert config.gateway.mode == "production"
    assert config.identity.environment_source == "config"
    assert config.source.password(PRODUCTION_PASSWORDS) == "pw"
    assert config.upstream is not None
    assert config.upstream.password(PRODUCTION_PASSWORDS) == "up"
    assert config.identity.upstream_client_id == "fxgate-upstream-plant-7-gw-01"
    assert config.warnings() == []


def test_production_example_takes_environment_id_from_the_variable_when_the_file_has_none(
    tmp_path,
):
    text = (CONFIGS / "production.example.toml").read_text()
    path = write(tmp_path, re.sub(r"(?m)^environment_id = .*$", "", text))
    config = load(path, {"MQTT_ENVIRONMENT_ID": "plant-9", **PRODUCTION_PASSWORDS})
    assert config.identity.environment_id == "plant-9"
    assert config.identity.environment_source == "MQTT_ENVIRONMENT_ID"


def test_production_example_without_its_password_variables_names_both_password_envs():
    source_error, upstream_error = errors_of(CONFIGS / "production.example.toml")
    assert source_error.startswith("source.password_env: environment variable FXGATE_MQTT_PASSWORD")
    assert upstream_error.startswith(
        "upstream.password_env: environment variable FXGATE_UPSTREAM_PASSWORD"
    )


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


@pytest.mark.parametrize(
    ("spark", "arrow"),
    [
        ("", True),
        ('master = "local[*]"\n', True),
        ('landing = "spark"\n', False),
        ('master = "spark://10.0.0.9:7077"\n', False),
        ('tables_dir = "hdfs://namenode/fxgate"\n', False),
        ('tables_dir = "file:///var/lib/fxgate/tables"\n', True),
    ],
)
def test_batches_are_written_by_pyarrow_only_with_a_local_master_and_tables_on_this_disk(
    tmp_path, spark, arrow
):
    config = load(write(tmp_path, f"[spark]\n{spark}"))
    assert config.spark.lands_with_arrow is arrow
    assert (
        "batches written by pyarrow" if arrow else "batches written by Spark jobs"
    ) in "\n".join(config.summary_lines())


def test_an_unknown_landing_is_refused_with_its_key_named(tmp_path):
    (error,) = errors_of(write(tmp_path, '[spark]\nlanding = "duckdb"\n'))
    assert "spark.landing" in error


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
        f"tables {tmp_path}/tables shared by the members of group fxgate-local-gw-01",
    ]:
        assert fact in summary
    alone = "\n".join(load().summary_lines())
    assert "this gateway's alone: plain appends" in alone


def test_a_shared_group_lands_through_delta_rs_and_a_spark_landing_is_refused_saying_why():
    """A group's members merge into one table in the daemon (DESIGN §7.12): a landing through
    Spark jobs would append, and the table would hold what a broker gave two members twice."""
    group = {"FXGATE__SOURCE__SHARED_SUBSCRIPTION_GROUP": "fxgate"}
    assert load(environ=group).group_tables == "fxgate-local-gw-01"
    assert load().group_tables is None
    for key, value, why in (
        ("LANDING", "spark", 'landing = "spark"'),
        ("MASTER", "spark://10.0.0.9:7077", "master = 'spark://10.0.0.9:7077'"),
        ("TABLES_DIR", "hdfs://nn:8020/fxgate", "is on a file system only Spark reaches"),
    ):
        with pytest.raises(ConfigError) as refused:
            load(environ={**group, f"FXGATE__SPARK__{key}": value})
        (error,) = refused.value.errors
        assert error.startswith("source.shared_subscription_group = 'fxgate': the members")
        assert why in error
    # An object store every member reaches is the group's place, whatever the master.
    for tables in ("az://fxgate/env-a", "s3://bucket/env-a"):
        config = load(
            environ={
                **group,
                "FXGATE__SPARK__TABLES_DIR": tables,
                "FXGATE__SPARK__MASTER": "spark://10.0.0.9:7077",
            }
        )
        assert config.spark.lands_with_arrow
        assert config.group_tables == "fxgate-local-gw-01"


def test_a_store_credentials_file_is_checked_at_load_and_never_shown(tmp_path):
    secret = "c2VjcmV0LWtleQ=="
    credentials = tmp_path / "store.env"
    credentials.write_text(
        "# the account of env-a\n"
        "AZURE_STORAGE_ACCOUNT_NAME=fxgateprod\n"
        f'export AZURE_STORAGE_ACCOUNT_KEY="{secret}"\n'
    )
    store = {
        "FXGATE__SPARK__TABLES_DIR": "az://fxgate/env-a",
        "FXGATE__SPARK__STORE_CREDENTIALS_FILE": str(credentials),
    }
    assert load(environ=store).spark.store_credentials_file == str(credentials)

    # Not beside a local tables_dir, where nothing would read it.
    (error,) = errors_of(environ={"FXGATE__SPARK__STORE_CREDENTIALS_FILE": str(credentials)})
    assert error.startswith("spark.store_credentials_file: set, but spark.tables_dir is not on")

    # Each line named by its number, never by what it holds: a key pasted on a line of its own
    # (alone, or with words after it) reads as a variable's name.
    credentials.write_text(
        f"AZURE_STORAGE_ACCOUNT_KEY={secret}\nMQTT_PASSWORD={secret}\nAWS_REGION=\n"
        f"{secret}\n{secret} is the key\n"
    )
    (error,) = errors_of(environ=store)
    assert error == (
        f"spark.store_credentials_file: {credentials}: line 2: not a store's variable (the file "
        "holds only variables starting with AZURE_, AZURITE_, AWS_, GOOGLE_); line 3: no value "
        "(write NAME=value); line 4: not a store's variable (the file holds only variables "
        "starting with AZURE_, AZURITE_, AWS_, GOOGLE_); line 5: not a store's variable (the "
        "file holds only variables starting with AZURE_, AZURITE_, AWS_, GOOGLE_)"
    )
    assert secret.rstrip("=") not in error

    credentials.unlink()
    (error,) = errors_of(environ=store)
    assert error.startswith(f"spark.store_credentials_file: {credentials}: ")


def test_production_mode_wants_the_store_credentials_file_private(tmp_path):
    credentials = tmp_path / "store.env"
    credentials.write_text("AWS_ACCESS_KEY_ID=AKIAEXAMPLE\nAWS_SECRET_ACCESS_KEY=x\n")
    credentials.chmod(0o640)
    environ = {
        **PRODUCTION_PASSWORDS,
        "MQTT_ENVIRONMENT_ID": "plant-9",
        "FXGATE__SPARK__TABLES_DIR": "s3://bucket/env-a",
        "FXGATE__SPARK__STORE_CREDENTIALS_FILE": str(credentials),
    }
    errors = errors_of(CONFIGS / "production.example.toml", environ)
    assert f"spark.store_credentials_file: {credentials} is accessible by group or others " in (
        "\n".join(errors)
    )
    credentials.chmod(0o600)
    assert load(CONFIGS / "production.example.toml", environ).gateway.mode == "production"


# --- forwarding: upstream, routes, buffer -----------------------------------------------------


def test_without_an_upstream_section_there_are_no_routes_and_nothing_is_forwarded():
    config = load()
    assert config.upstream is None
    assert config.routes == ()
    assert config.forwarding is False
    assert config.identity.upstream_client_id is None
    assert config.warnings() == []
    assert "upstream none: nothing is forwarded" in config.summary_lines()


def test_upstream_with_routes_loads_the_routes_in_config_order(tmp_path):
    path = write(
        tmp_path,
        UPSTREAM
        + ROUTE
        + 'target = "site/{environment}/{reader}"\nqos = 2\n'
        + '[[routes]]\nsource = "zebra/#"\npersist = true\n',
    )
    config = load(path)
    assert config.forwarding is True
    assert config.routes == (
        Route(0, "zebra/fx/+/reads", "site/{environment}/{reader}", 2, True),
        Route(1, "zebra/#", "{topic}", 1, True),
    )
    upstream = config.upstream
    assert upstream is not None
    assert (upstream.host, upstream.port, upstream.window) == ("cloud.example.com", 1883, 20)
    assert (upstream.clean_session, upstream.session_expiry_interval_seconds) == (False, 3600)
    assert (
        upstream.reconnect_min_delay_seconds,
        upstream.reconnect_max_delay_seconds,
        upstream.reconnect_jitter,
    ) == (1.0, 120.0, 0.25)
    assert config.identity.upstream_client_id == "fxgate-upstream-local-gw-01-gw-01"
    assert upstream.process == "own"
    assert "forward leg in its own process" in "\n".join(config.summary_lines())


def test_the_forward_leg_can_share_the_daemons_process_and_nothing_else(tmp_path):
    shared = load(write(tmp_path, UPSTREAM + 'process = "shared"\n' + ROUTE))
    assert shared.upstream.process == "shared"
    assert "forward leg in the daemon's process" in "\n".join(shared.summary_lines())
    (error,) = errors_of(write(tmp_path, UPSTREAM + 'process = "thread"\n' + ROUTE))
    assert error.startswith("upstream.process:") and "'own'" in error and "'shared'" in error


def test_routes_without_an_upstream_section_are_an_error_naming_routes(tmp_path):
    path = write(tmp_path, ROUTE + ROUTE)
    assert errors_of(path) == (
        "routes: 2 routes but no [upstream] section to forward to (add [upstream] with its "
        "host, or remove the [[routes]] entries)",
    )


def test_an_upstream_section_without_routes_is_an_error_naming_upstream(tmp_path):
    path = write(tmp_path, UPSTREAM)
    assert errors_of(path) == (
        "upstream: no [[routes]] entries, so nothing would be forwarded (add a [[routes]] entry "
        "with its source filter, or remove [upstream])",
    )


def test_an_upstream_section_without_a_host_names_the_key(tmp_path):
    path = write(tmp_path, "[upstream]\nport = 1884\n" + ROUTE)
    assert errors_of(path) == ("upstream.host: required, but not set",)


def test_routes_written_as_a_single_table_are_an_error_naming_the_array_syntax(tmp_path):
    path = write(tmp_path, UPSTREAM + '[routes]\nsource = "a/#"\n')
    assert errors_of(path) == (
        "routes: expected an array of tables ([[routes]] entries), got a table",
    )


def test_an_unknown_placeholder_in_a_target_is_named_with_its_route_index(tmp_path):
    path = write(tmp_path, UPSTREAM + ROUTE + ROUTE + 'target = "{site}/{topic}"\n')
    assert errors_of(path) == (
        "routes[1].target: '{site}/{topic}': unknown placeholder {site}; use {topic}, {reader} "
        "or {environment}",
    )


def test_a_wildcard_in_a_target_is_an_error_naming_the_route(tmp_path):
    path = write(tmp_path, UPSTREAM + ROUTE + 'target = "up/+/{reader}"\n')
    (error,) = errors_of(path)
    assert error.startswith("routes[0].target: 'up/+/{reader}': a topic name may not contain")


def test_a_bad_route_source_filter_names_the_route(tmp_path):
    path = write(tmp_path, UPSTREAM + '[[routes]]\nsource = "zebra/#/reads"\n')
    assert errors_of(path) == (
        "routes[0].source: 'zebra/#/reads': '#' must be a whole level and the last one",
    )


def test_unknown_key_in_a_route_entry_suggests_the_closest_name(tmp_path):
    path = write(tmp_path, UPSTREAM + '[[routes]]\nsourc = "zebra/#"\n')
    assert errors_of(path) == (
        "routes[0].source: required, but not set",
        "routes[0].sourc: unknown key (did you mean 'source'?)",
    )


def test_a_misspelt_routes_header_suggests_routes(tmp_path):
    path = write(tmp_path, UPSTREAM + ROUTE + '[[route]]\nsource = "a/#"\n')
    assert errors_of(path) == ("route: unknown section (did you mean 'routes'?)",)


def test_persist_false_loads_and_warns_that_qos_is_downgraded(tmp_path):
    path = write(
        tmp_path,
        UPSTREAM
        + ROUTE
        + "persist = false\n"
        + '[[routes]]\nsource = "a/#"\nqos = 0\npersist = false\n'
        + '[[routes]]\nsource = "b/#"\nqos = 2\npersist = false\n',
    )
    config = load(path)
    assert [route.effective_qos for route in config.routes] == [0, 0, 0]
    assert [route.qos for route in config.routes] == [1, 0, 2]
    assert config.warnings() == [
        "routes[0]: persist = false downgrades QoS 1 to 0 (messages are not kept across restarts)",
        "routes[2]: persist = false downgrades QoS 2 to 0 (messages are not kept across restarts)",
    ]
    assert "routes[2] b/# -> {topic} at QoS 0 (persist = false, asked 2)" in config.summary_lines()


def test_a_clean_upstream_session_loads_with_a_duplicate_warning(tmp_path):
    path = write(tmp_path, UPSTREAM + "clean_session = true\n" + ROUTE)
    (warning,) = load(path).warnings()
    assert warning.startswith("upstream.clean_session = true:")
    assert "may arrive twice" in warning


def test_a_disabled_upstream_forwards_nothing_but_still_checks_its_routes(tmp_path):
    path = write(tmp_path, UPSTREAM + "enabled = false\n" + ROUTE)
    config = load(path)
    assert config.upstream is not None
    assert (config.forwarding, config.routes, config.identity.upstream_client_id) == (
        False,
        (),
        None,
    )
    assert config.warnings() == [
        "upstream.enabled = false: nothing is forwarded; "
        "the [[routes]] entries are checked but not used"
    ]
    bad = write(tmp_path, UPSTREAM + "enabled = false\n" + ROUTE + 'target = "{x}"\n')
    (error,) = errors_of(bad)
    assert error.startswith("routes[0].target: '{x}': unknown placeholder {x}")


def test_forwarding_into_the_source_broker_onto_a_subscribed_topic_is_a_loop_error(tmp_path):
    path = write(tmp_path, '[upstream]\nhost = "localhost"\n' + ROUTE)
    assert errors_of(path) == (
        "routes[0].target: upstream is the source broker (localhost:1883) and '{topic}' "
        "republishes 'zebra/fx/fxgate-sample/reads' to 'zebra/fx/fxgate-sample/reads', which "
        "source.subscribe_topics receives again (a forwarding loop)",
    )


def test_forwarding_into_the_source_broker_onto_another_topic_loads(tmp_path):
    path = write(tmp_path, '[upstream]\nhost = "127.0.0.1"\n' + ROUTE + 'target = "up/{topic}"\n')
    assert load(path).routes[0].target == "up/{topic}"


def test_forwarding_to_the_same_host_on_another_port_is_not_a_loop(tmp_path):
    path = write(tmp_path, '[upstream]\nhost = "localhost"\nport = 1884\n' + ROUTE)
    assert load(path).forwarding is True


def test_buffer_low_watermark_not_below_high_is_an_error_naming_the_key(tmp_path):
    path = write(tmp_path, "[buffer]\nhigh_watermark = 0.6\nlow_watermark = 0.6\n")
    assert errors_of(path) == ("buffer.low_watermark: must be below high_watermark (0.6), got 0.6",)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("max_messages = 0", "buffer.max_messages: must be at least 1, got 0"),
        ("max_bytes = 1023", "buffer.max_bytes: must be at least 1024, got 1023"),
        ("high_watermark = 1.5", "buffer.high_watermark: must be at most 1.0, got 1.5"),
        ("low_watermark = 0", "buffer.low_watermark: must be greater than 0.0, got 0"),
        (
            'overflow = "drop_all"',
            "buffer.overflow: expected 'drop_oldest' or 'drop_new', got 'drop_all'",
        ),
    ],
)
def test_buffer_values_out_of_range_name_the_key(tmp_path, text, error):
    assert errors_of(write(tmp_path, f"[buffer]\n{text}\n")) == (error,)


def test_spark_backlog_low_not_below_high_is_an_error_naming_the_key(tmp_path):
    path = write(tmp_path, "[spark]\nbacklog_high_messages = 10\nbacklog_low_messages = 20\n")
    assert errors_of(path) == (
        "spark.backlog_low_messages: must be below backlog_high_messages (10), got 20",
    )


def test_compaction_defaults_maintain_the_delta_tables_every_few_minutes():
    compaction = load().compaction
    assert compaction.enabled is True
    assert (compaction.start_delay_seconds, compaction.interval_seconds) == (60.0, 300.0)
    assert (compaction.target_file_mb, compaction.open_file_mb) == (128, 16)
    assert (compaction.vacuum_retention_hours, compaction.checkpoint_interval) == (1, 10)
    assert compaction.log_retention_hours == 1.0


def test_compaction_keys_load_from_the_file_and_the_environment_and_become_table_properties(
    tmp_path,
):
    path = write(
        tmp_path,
        "[compaction]\nstart_delay_seconds = 5\ninterval_seconds = 30\ntarget_file_mb = 64\n"
        "open_file_mb = 8\ncheckpoint_interval = 25\nlog_retention_hours = 1.5\n",
    )
    compaction = load(path, {"FXGATE__COMPACTION__VACUUM_RETENTION_HOURS": "0"}).compaction
    assert (compaction.start_delay_seconds, compaction.interval_seconds) == (5.0, 30.0)
    assert (compaction.target_file_mb, compaction.open_file_mb) == (64, 8)
    assert compaction.vacuum_retention_hours == 0
    # What the daemon sets on the Delta tables it creates: VACUUM's retention is also how long
    # the log keeps a replaced file's tombstone.
    assert compaction.table_properties() == {
        "delta.checkpointInterval": "25",
        "delta.logRetentionDuration": "interval 5400 seconds",
        "delta.deletedFileRetentionDuration": "interval 0 seconds",
        "delta.enableExpiredLogCleanup": "true",
    }


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "start_delay_seconds = -1",
            "compaction.start_delay_seconds: must be at least 0.0, got -1",
        ),
        ("interval_seconds = 0", "compaction.interval_seconds: must be greater than 0.0, got 0"),
        ("target_file_mb = 0", "compaction.target_file_mb: must be at least 1, got 0"),
        ("open_file_mb = 0", "compaction.open_file_mb: must be at least 1, got 0"),
        (
            "vacuum_retention_hours = -1",
            "compaction.vacuum_retention_hours: must be at least 0, got -1",
        ),
        (
            "vacuum_retention_hours = 1.5",
            "compaction.vacuum_retention_hours: expected an integer, got 1.5",
        ),
        ("checkpoint_interval = 0", "compaction.checkpoint_interval: must be at least 1, got 0"),
        (
            "log_retention_hours = 0",
            "compaction.log_retention_hours: must be greater than 0.0, got 0",
        ),
    ],
)
def test_compaction_values_out_of_range_name_the_key(tmp_path, text, error):
    assert errors_of(write(tmp_path, f"[compaction]\n{text}\n")) == (error,)


def test_the_keys_of_the_layout_before_delta_are_refused_by_name(tmp_path):
    """A config written for the swap-and-grace compaction fails at start, naming each key that
    no longer means anything (VACUUM's retention took grace_seconds' place)."""
    path = write(tmp_path, "[compaction]\ngrace_seconds = 3600\ninclude_open = true\n")
    errors = errors_of(path)
    assert len(errors) == 2
    assert errors[0].startswith("compaction.grace_seconds: unknown key")
    assert errors[1].startswith("compaction.include_open: unknown key")


def test_env_override_sets_the_upstream_port(tmp_path):
    path = write(tmp_path, UPSTREAM + "port = 1999\n" + ROUTE)
    config = load(path, {"FXGATE__UPSTREAM__PORT": "8883"})
    assert config.upstream is not None
    assert config.upstream.port == 8883


def test_env_override_of_the_upstream_host_alone_asks_for_routes():
    assert errors_of(environ={"FXGATE__UPSTREAM__HOST": "cloud.example.com"}) == (
        "upstream: no [[routes]] entries, so nothing would be forwarded (add a [[routes]] entry "
        "with its source filter, or remove [upstream])",
    )


def test_env_override_changes_a_route_and_adds_the_next_one(tmp_path):
    path = write(tmp_path, UPSTREAM + ROUTE)
    config = load(
        path,
        {
            "FXGATE__ROUTES__0__QOS": "2",
            "FXGATE__ROUTES__1__SOURCE": "other/#",
            "FXGATE__ROUTES__1__TARGET": "up/{topic}",
        },
    )
    assert config.routes == (
        Route(0, "zebra/fx/+/reads", "{topic}", 2, True),
        Route(1, "other/#", "up/{topic}", 1, True),
    )


def test_env_override_of_a_route_past_the_last_one_is_an_error_naming_the_variable(tmp_path):
    path = write(tmp_path, UPSTREAM + ROUTE)
    (error,) = errors_of(path, {"FXGATE__ROUTES__2__SOURCE": "a/#"})
    assert error.startswith("routes[2]: FXGATE__ROUTES__2__SOURCE sets a key of a route that")
    assert "number new routes from 1 without gaps" in error


def test_bad_route_value_from_the_environment_names_route_key_and_variable(tmp_path):
    path = write(tmp_path, UPSTREAM + ROUTE)
    assert errors_of(path, {"FXGATE__ROUTES__0__QOS": "3", "FXGATE__ROUTES__0__SORCE": "x"}) == (
        "routes[0].sorce: unknown key (did you mean 'source'?) (from FXGATE__ROUTES__0__SORCE)",
        "routes[0].qos: must be at most 2, got 3 (from FXGATE__ROUTES__0__QOS)",
    )


def test_env_override_of_routes_without_an_index_is_an_error():
    assert errors_of(environ={"FXGATE__ROUTES__SOURCE": "a/#"}) == (
        "FXGATE__ROUTES__SOURCE: expected FXGATE__ROUTES__<INDEX>__<KEY>",
    )


def test_upstream_client_id_follows_the_source_rule_with_the_gateway_environment(tmp_path):
    path = write(tmp_path, UPSTREAM + ROUTE)
    config = load(path, {"MQTT_ENVIRONMENT_ID": "plant-9"})
    assert config.identity.upstream_client_id == "fxgate-upstream-plant-9-gw-01"
    own = write(tmp_path, UPSTREAM + 'client_id = "edge"\ninstance_id = "up-1"\n' + ROUTE)
    assert load(own, {"MQTT_ENVIRONMENT_ID": "plant-9"}).identity.upstream_client_id == (
        "edge-plant-9-up-1"
    )


def test_upstream_instance_falls_back_to_the_source_instance_id(tmp_path):
    path = write(tmp_path, '[source]\ninstance_id = "edge-3"\n' + UPSTREAM + ROUTE)
    config = load(path)
    assert config.identity.client_id == "fxgate-local-gw-01-edge-3"
    assert config.identity.upstream_client_id == "fxgate-upstream-local-gw-01-edge-3"


def test_upstream_unique_suffix_is_appended_only_to_the_upstream_client_id(tmp_path):
    path = write(tmp_path, UPSTREAM + "append_unique_id = true\n" + ROUTE)
    config = load(path)
    assert config.identity.client_id == "fxgate-local-gw-01-gw-01"
    upstream_client_id = config.identity.upstream_client_id
    assert upstream_client_id is not None
    assert re.fullmatch(r"fxgate-upstream-local-gw-01-gw-01-[0-9a-f]{8}", upstream_client_id)


def test_production_requires_the_upstream_password_variable_and_a_stable_client_id(tmp_path):
    path = write(
        tmp_path,
        '[gateway]\nmode = "production"\n'
        + UPSTREAM
        + 'username = "fx"\npassword_env = "UP_PW"\nappend_unique_id = true\n'
        + ROUTE,
    )
    errors = errors_of(path, {"MQTT_ENVIRONMENT_ID": "plant-7"})
    assert errors == (
        "upstream.password_env: environment variable UP_PW is not set (required in production "
        "mode)",
        "upstream.append_unique_id: must be false in production mode (a new client id on each "
        "restart abandons the upstream session, and with it the packet ids of QoS 2 messages "
        "in flight)",
    )


def test_production_with_the_upstream_password_variable_set_loads(tmp_path):
    path = write(
        tmp_path,
        '[gateway]\nmode = "production"\n'
        + UPSTREAM
        + 'username = "fx"\npassword_env = "UP_PW"\n'
        + ROUTE,
    )
    config = load(path, {"MQTT_ENVIRONMENT_ID": "plant-7", "UP_PW": "secret"})
    assert config.upstream is not None
    assert config.upstream.password({"UP_PW": "at-connect"}) == "at-connect"


def test_upstream_password_never_appears_in_repr_or_summary(tmp_path):
    secret = "up-s3cret-Value-42"
    path = write(tmp_path, UPSTREAM + 'username = "fx"\npassword_env = "UP_PW"\n' + ROUTE)
    config = load(path, {"UP_PW": secret})
    assert secret not in repr(config)
    summary = "\n".join(config.summary_lines())
    assert secret not in summary
    assert "cloud.example.com:1883 (user 'fx', password from $UP_PW), window 20" in summary


def test_summary_lines_list_the_upstream_its_client_id_and_every_route(tmp_path):
    path = write(
        tmp_path, UPSTREAM + ROUTE + 'target = "up/{reader}"\nqos = 2\n[[routes]]\nsource = "b/#"\n'
    )
    summary = load(path).summary_lines()
    assert "upstream client id fxgate-upstream-local-gw-01-gw-01 (clean_start=false, " in (
        "\n".join(summary)
    )
    assert "routes[0] zebra/fx/+/reads -> up/{reader} at QoS 2" in summary
    assert "routes[1] b/# -> {topic} at QoS 1" in summary
    assert any(line.startswith("tier-2 buffer 10000 messages / 16777216 bytes") for line in summary)


def test_the_old_tier2_high_watermark_still_loads_and_warns_that_it_is_unused(tmp_path):
    config = load(write(tmp_path, "[buffer]\nhigh_watermark = 0.8\n"))
    assert config.buffer.high_watermark == 0.8
    assert any("high_watermark is no longer used" in w for w in config.warnings())
    assert not any("high_watermark" in w for w in load().warnings())


def test_the_old_parse_worker_keys_still_load_and_warn_that_they_are_unused(tmp_path):
    config = load(write(tmp_path, "[spark]\nparse_worker = true\nparse_helpers = 1\n"))
    (warning,) = [w for w in config.warnings() if "parse_" in w]
    assert "spark.parse_worker and spark.parse_helpers no longer used" in warning
    assert "remove the keys" in warning
    (alone,) = load(write(tmp_path, "[spark]\nparse_helpers = 0\n")).warnings()
    assert alone.startswith("spark.parse_helpers no longer used") and "(remove the key)" in alone
    assert not any("parse_" in w for w in load().warnings())


# -- reader health keys -------------------------------------------------------------------------


def test_management_topics_default_to_none_and_the_silent_limit_to_five_minutes():
    config = load()
    assert config.source.management_topics == ()
    assert config.gateway.health_reader_silent_seconds == 300.0


def test_management_topics_are_checked_as_topic_filters_and_named_in_each_error(tmp_path):
    path = write(tmp_path, '[source]\nmanagement_topics = ["a/#/b", "$share/g/a/mgmt", 7]\n')
    errors = errors_of(path)
    assert errors[0] == (
        "source.management_topics[0]: 'a/#/b': '#' must be a whole level and the last one"
    )
    assert errors[1].startswith("source.management_topics[1]: '$share/g/a/mgmt': give the plain")
    assert errors[2].startswith("source.management_topics[2]: ")
    assert len(errors) == 3


def test_a_management_topic_that_is_also_a_data_topic_is_refused(tmp_path):
    path = write(tmp_path, '[source]\nmanagement_topics = ["zebra/fx/+/reads"]\n')
    (error,) = errors_of(path)
    assert error.startswith("source.management_topics: 'zebra/fx/+/reads' is also in source.sub")


def test_a_negative_silent_limit_is_refused_and_zero_switches_the_flag_off(tmp_path):
    (error,) = errors_of(write(tmp_path, "[gateway]\nhealth_reader_silent_seconds = -1\n"))
    assert error.startswith("gateway.health_reader_silent_seconds: ")
    path = write(tmp_path, "[gateway]\nhealth_reader_silent_seconds = 0\n")
    assert load(path).gateway.health_reader_silent_seconds == 0.0


def test_management_topics_and_the_silent_limit_can_be_set_from_the_environment():
    config = load(
        environ={
            "FXGATE__SOURCE__MANAGEMENT_TOPICS": '["zebra/fx/+/mgmt"]',
            "FXGATE__GATEWAY__HEALTH_READER_SILENT_SECONDS": "90",
        }
    )
    assert config.source.management_topics == ("zebra/fx/+/mgmt",)
    assert config.gateway.health_reader_silent_seconds == 90.0
    assert "zebra/fx/+/mgmt" in config.identity.subscriptions
    errors = errors_of(environ={"FXGATE__SOURCE__MANAGEMENT_TOPICS": '["a/#/b"]'})
    assert errors[0].startswith("source.management_topics[0]: 'a/#/b'")
    assert "FXGATE__SOURCE__MANAGEMENT_TOPICS" in errors[0]
