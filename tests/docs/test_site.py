"""The documentation site builds in strict mode, as `make docs` builds it, with no warning.

Built from a copy of docs/ (the benchmark plots copied beside their page, as `make docs` does),
so the work tree is left as it was. Strict mode fails the build on a broken link, an anchor
that is not there, a page missing from the navigation or a page the navigation names that is
not there (docs/mkdocs.yml's `validation`).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"


def build(docs: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(docs / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


def copy_docs(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    shutil.copytree(REPO / "docs", docs, ignore=shutil.ignore_patterns("site", "plots"))
    plots = docs / "pages" / "benchmarks" / "plots"
    plots.mkdir(parents=True)
    for plot in (REPO / "bench" / "results").glob("*.png"):
        shutil.copy(plot, plots)
    return docs


def test_the_documentation_site_builds_in_strict_mode_with_no_warning(tmp_path):
    docs = copy_docs(tmp_path)
    done = build(docs, tmp_path / "site")
    said = done.stdout + done.stderr
    assert done.returncode == 0, said
    assert not re.search(r"^(WARNING|ERROR)\b", said, re.MULTILINE), said
    assert (tmp_path / "site" / "getting-started" / "index.html").exists()
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path):
    docs = copy_docs(tmp_path)
    page = docs / "pages" / "index.md"
    page.write_text(page.read_text() + "\n[gone](no-such-page.md)\n")
    done = build(docs, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stdout + done.stderr


def test_every_page_in_the_docs_folder_is_in_the_navigation(tmp_path):
    docs = copy_docs(tmp_path)
    (docs / "pages" / "orphan.md").write_text("# A page nobody links to\n")
    done = build(docs, tmp_path / "site")
    assert done.returncode != 0
    assert "orphan.md" in done.stdout + done.stderr
