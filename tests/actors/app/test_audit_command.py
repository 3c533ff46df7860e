"""`fxgate audit` refusing to audit (exit status 2) before or when Spark fails, in process: no
JVM starts here. The command's reports and exit statuses 0 and 1 are checked against real
brokers and daemons in test_audit_end_to_end.py, its logic in tests/spark/test_audit.py."""

from click.testing import CliRunner

import spark.session
from actors.app.cli import main
from spark.tables import READS


def audit_cli(tmp_path, *args):
    """In-process: only for the failures found before any JVM starts (a JVM started here
    would be the shared test session's)."""
    env = {"FXGATE__GATEWAY__DATA_DIR": str(tmp_path / "data")}
    return CliRunner().invoke(main, ["audit", *args], env=env)


def test_the_command_exits_2_naming_a_tables_directory_that_does_not_exist(tmp_path):
    result = audit_cli(tmp_path, "--tables", str(tmp_path / "nowhere"))
    assert result.exit_code == 2
    assert "could not audit: tables directory" in result.stderr
    assert "nowhere does not exist" in result.stderr


def test_the_command_exits_2_for_the_configs_own_tables_when_nothing_landed_yet(tmp_path):
    (tmp_path / "data" / "tables").mkdir(parents=True)
    result = audit_cli(tmp_path)
    assert result.exit_code == 2
    assert f"holds no reads table: {tmp_path / 'data' / 'tables' / READS}" in result.stderr


def test_the_command_exits_2_with_the_cause_when_spark_fails(tmp_path, monkeypatch):
    def no_jvm(*_args, **_kwargs):
        raise RuntimeError("Java gateway process exited before sending its port number")

    monkeypatch.setattr(spark.session, "build_session", no_jvm)
    (tmp_path / "tables" / READS).mkdir(parents=True)
    result = audit_cli(tmp_path, "--tables", str(tmp_path / "tables"), "--json", "--no-progress")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr == (
        "fxgate audit: could not audit: Spark failed: RuntimeError: "
        "Java gateway process exited before sending its port number\n"
    )
