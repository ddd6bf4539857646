"""The docs stay true to the repository: every relative link in README.md and docs/*.md names
a file of the repository (tracked, or new and not ignored) and, with ``#anchor``, a heading
of that page; and every page that names the default policy names the one `tgx.compile` has."""

from __future__ import annotations

import inspect
import pathlib
import re
import subprocess
import sys

import pytest

import tgx

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF = re.compile(r"^\s*\[[^\]]+\]:\s+(\S+)", re.M)
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def _text(page: pathlib.Path) -> str:
    """The page without its code blocks (a link in code is not a link)."""
    return CODE.sub("", page.read_text(encoding="utf-8"))


def _links(page: pathlib.Path) -> list[str]:
    text = INLINE.sub("", _text(page))
    return LINK.findall(text) + REF.findall(text)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: pathlib.Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for h in HEADING.findall(_text(page)):
        s = _slug(h)
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def _repository_files() -> set[pathlib.Path] | None:
    """Tracked files plus new files git would commit; None outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                              "--exclude-standard"], cwd=ROOT, capture_output=True,
                             timeout=60, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {(ROOT / p).resolve() for p in out.decode().split("\0") if p}


FILES = _repository_files()


def _in_repository(target: pathlib.Path) -> bool:
    if not target.exists():
        return False
    if FILES is None or target == ROOT:
        return True
    if target.is_dir():
        return any(target in f.parents for f in FILES)
    return target in FILES


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page):
    bad = _bad_links(page)
    assert not bad, f"{page.name}:\n  " + "\n  ".join(bad)


def _bad_links(page: pathlib.Path) -> list[str]:
    bad = []
    for link in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", link, re.I):  # http:, https:, mailto: ...
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        if not _in_repository(target):
            bad.append(f"{link}: no such file in the repository")
        elif anchor and target.suffix == ".md" and anchor not in _anchors(target):
            bad.append(f"{link}: {target.name} has no heading #{anchor}")
    return bad


def test_slugs_follow_github():
    assert _slug("Persistent weights: `weights=`") == "persistent-weights-weights"
    assert _slug("One hand-off: `Assignment`") == "one-hand-off-assignment"
    assert _slug("File format — `schema_version` 2") == "file-format--schema_version-2"


POLICY = re.compile(r'`"(heuristic|fastest|explore)"`,?\s*\(?(?:the\s+)?default\b', re.I)


def test_every_statement_of_the_default_policy_names_the_real_one():
    default = inspect.signature(tgx.compile).parameters["policy"].default
    said = {(p.name, m) for p in PAGES for m in POLICY.findall(" ".join(_text(p).split()))}
    assert said, "no page states the default policy"
    assert {m for _, m in said} == {default}, said


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path, monkeypatch):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A backend — 1 module\n\n[ok](#a-backend--1-module) "
                    "[gone](missing.md) [bad](#nope) `[code](nowhere.md)`\n"
                    "```\n[in a block](nowhere.md)\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "FILES", None)  # not in the repository
    assert _bad_links(page) == ["missing.md: no such file in the repository",
                                "#nope: page.md has no heading #nope"]


def test_the_index_links_every_page():
    linked = {link.partition("#")[0] for link in _links(ROOT / "docs" / "index.md")}
    pages = {p.name for p in PAGES if p.parent.name == "docs" and p.name != "index.md"}
    assert pages <= linked, sorted(pages - linked)


def test_the_glossary_defines_the_terms_the_docs_use_and_limits_says_what_is_missing():
    headings = {h.strip("`").lower() for h in
                HEADING.findall((ROOT / "docs" / "glossary.md").read_text(encoding="utf-8"))}
    for term in ("plan", "binding", "workspace", "copy_to", "cpu/owned", "pending",
                 "graph_recipe"):
        assert term in headings, f"docs/glossary.md has no heading for {term}"
    limits = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    assert len(HEADING.findall(limits)) >= 4 and "limits.md" in (ROOT / "README.md").read_text(
        encoding="utf-8") + (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
