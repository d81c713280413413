"""The reference in docs/ builds strict, and the README is short and links only to what exists.

The site is built with MkDocs exactly as ``mkdocs.yml`` says (``strict: true``
and every ``validation`` check a warning), so a link to a missing page or
anchor, or a page left out of the nav, fails here. One test plants a broken
anchor in a copy of the docs and expects the build to refuse it, so the
strictness itself is what is tested, not assumed. The README is outside the
site: its relative links are checked here against the files and the headings
of the pages they name.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from markdown.extensions.toc import slugify

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: A newcomer reads the README in five minutes; the rest is in docs/.
README_MAX_LINES = 300

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (.+?)\s*$", re.M)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_the_docs_site_builds_strict(tmp_path):
    done = build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr[-3000:]
    site = tmp_path / "site"
    for page in (ROOT / "docs").glob("*.md"):
        html = site / "index.html" if page.stem == "index" else site / page.stem / "index.html"
        assert html.exists(), f"{page.name} was not built"


def test_a_broken_anchor_fails_the_build(tmp_path):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    page = tmp_path / "docs" / "settings.md"
    page.write_text(page.read_text() + "\nSee [the steps](steps.md#no-such-heading).\n")
    done = build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-heading" in done.stderr


def anchors(page: Path) -> set[str]:
    return {slugify(h, "-") for h in HEADING.findall(page.read_text(encoding="utf-8"))}


def test_the_readme_is_short_and_its_links_resolve():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # a URL: not a file of this repository
        path, _, anchor = target.partition("#")
        file = ROOT / path
        if not file.exists():
            broken.append(target)
        elif anchor and anchor not in anchors(file):
            broken.append(target)
    assert not broken, f"README links to what does not exist: {broken}"
