import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from actors.config import reference
from actors.config.identity import ENVIRONMENT_KEY, ENVIRONMENT_VARIABLE
from actors.config.reference import difference, main, render_reference
from actors.config.schema import ARRAYS, SECTIONS, _apply_overrides, load_config

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "pages" / "reference" / "configuration.md"
CONFIGS = ROOT / "configs"
# A commented-out key line or section header of gateway.toml ("# key = value", "# [x]").
COMMENTED_OUT = re.compile(
    r"^# (\[\[?[a-z_.]+\]\]?|[a-z_]+ = (?:[\"\[0-9-]|true\b|false\b).*)$", re.MULTILINE
)
SECTION_HEADING = re.compile(r"^### `(\[\[?[a-z_]+\]\]?)`$", re.MULTILINE)
# A key's row: "| `key`<br>`VARIABLE`<br>... | type | default | meaning |".
KEY_ROW = re.compile(r"^\| `(?P<key>[a-z0-9_]+)`(?P<names>(?:<br>[^|]*)*) \|", re.MULTILINE)
SETTING = "spark.test.setting"


def committed_page() -> str:
    return PAGE.read_text(encoding="utf-8")


def rows_by_section(page: str) -> dict[str, dict[str, str]]:
    """{"[source]": {"port": "<the row's key cell>", ...}, "[[routes]]": {...}, ...}"""
    sections: dict[str, dict[str, str]] = {}
    headings = list(SECTION_HEADING.finditer(page))
    for heading, following in zip(headings, [*headings[1:], None], strict=True):
        block = page[heading.end() : following.start() if following else len(page)]
        rows = {row["key"]: row["names"] for row in KEY_ROW.finditer(block)}
        sections[heading.group(1)] = rows
    return sections


def heading_of(name: str) -> str:
    return f"[[{name}]]" if name in ARRAYS else f"[{name}]"


def schema_keys() -> list[tuple[str, str]]:
    models = {**SECTIONS, **ARRAYS}
    return [(name, key) for name, model in models.items() for key in model.model_fields]


def test_the_committed_configuration_reference_is_what_the_schema_generates_now():
    how = difference(committed_page(), render_reference())
    if how is not None:
        pytest.fail(
            f"docs/pages/reference/configuration.md is out of date with the configuration "
            f"schema ({how}): run `python -m actors.config.reference --write "
            "docs/pages/reference/configuration.md` or `make docs`"
        )


def test_every_key_of_the_schema_is_in_the_reference_with_the_variables_that_set_it():
    sections = rows_by_section(committed_page())
    assert set(sections) == {heading_of(name) for name in [*SECTIONS, *ARRAYS]}
    for name, key in schema_keys():
        rows = sections[heading_of(name)]
        assert key in rows, f"{name}.{key} is not in the reference"
        names = re.findall(r"`([^`]+)`", rows[key])
        variables = [variable for variable in names if variable.startswith("FXGATE__")]
        expected = (
            f"FXGATE__{name.upper()}__<i>__{key.upper()}"
            if name in ARRAYS
            else f"FXGATE__{name.upper()}__{key.upper()}"
        )
        assert expected in variables, f"{name}.{key}: {expected} not given, only {names}"
        # Each variable the page gives sets this key (and only it) when the daemon loads.
        for variable in variables:
            concrete = variable.replace("<i>", "0").replace("<setting>", SETTING)
            origins, errors = _apply_overrides({}, {concrete: "1"})
            assert errors == [], f"{variable}: {errors}"
            target: tuple[Any, ...] = (name, 0, key) if name in ARRAYS else (name, key)
            if "<setting>" in variable:
                target = (*target, SETTING)
            assert list(origins) == [target], f"{variable} sets {list(origins)}, not {target}"
        if f"{name}.{key}" == ENVIRONMENT_KEY:
            assert ENVIRONMENT_VARIABLE in names, f"{ENVIRONMENT_KEY}: {ENVIRONMENT_VARIABLE}"


def shipped_keys(path: Path) -> list[tuple[str, str]]:
    """(section heading, key) for every key a shipped file writes, commented out or not."""
    text = path.read_text(encoding="utf-8")
    written = tomllib.loads(COMMENTED_OUT.sub(r"\1", text))
    found = []
    for section, value in written.items():
        entries = value if isinstance(value, list) else [value]
        heading = f"[[{section}]]" if isinstance(value, list) else f"[{section}]"
        found += [(heading, key) for entry in entries for key in entry]
    return found


@pytest.mark.parametrize("name", ["gateway.toml", "production.example.toml"])
def test_every_key_written_in_a_shipped_config_file_is_in_the_reference(name):
    sections = rows_by_section(committed_page())
    keys = shipped_keys(CONFIGS / name)
    assert len(keys) > 10
    for heading, key in keys:
        # A sub-table such as [spark.conf] is the key `conf` of its section; its own entries
        # are Spark's settings, not fxgate's keys.
        assert key in sections.get(heading, {}), f"{heading} {key} of {name} is not in the page"


def test_every_key_of_the_schema_has_a_description_and_every_section_an_introduction():
    missing = [
        f"{name}.{key}"
        for name, model in {**SECTIONS, **ARRAYS}.items()
        for key, field in model.model_fields.items()
        if not (field.description or "").strip()
    ]
    missing += [
        f"[{name}]"
        for name, model in {**SECTIONS, **ARRAYS}.items()
        if not (model.__doc__ or "").strip()
    ]
    assert missing == [], (
        f"give these a docstring in actors/config/schema.py (it is their meaning in the "
        f"configuration reference): {missing}"
    )


def test_the_toml_examples_on_the_page_load(tmp_path):
    blocks = re.findall(r"^```toml\n(.*?)^```$", committed_page(), re.MULTILINE | re.DOTALL)
    assert blocks
    for index, block in enumerate(blocks):
        path = tmp_path / f"example-{index}.toml"
        path.write_text(block, encoding="utf-8")
        config = load_config(path, environ={}, hostname="gw-01")
        assert config.forwarding == ("upstream" in tomllib.loads(block))


def test_check_exits_1_with_one_line_saying_to_run_make_docs_when_the_page_is_stale(
    tmp_path, capsys
):
    page = tmp_path / "configuration.md"
    assert main(["--write", str(page)]) == 0
    assert main(["--check", str(page)]) == 0
    assert capsys.readouterr().err == ""

    page.write_text(page.read_text().replace("| `port`<br>", "| `prot`<br>", 1))
    assert main(["--check", str(page)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert str(page) in line
    assert "1 line(s) differ" in line
    assert "make docs" in line

    page.unlink()
    assert main(["--check", str(page)]) == 1
    assert "does not exist" in capsys.readouterr().err


def test_the_reference_refuses_a_hand_kept_note_about_a_key_the_schema_does_not_have(
    monkeypatch,
):
    monkeypatch.setitem(reference._TYPE_OF_KEY, "source.no_such_key", "string")
    with pytest.raises(ValueError, match=r"source\.no_such_key"):
        render_reference()
