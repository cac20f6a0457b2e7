"""The documentation cannot rot: every relative link and anchor in README.md, docs/ and the other
Markdown files of the tree resolves, and no user-facing text names an issue number (the README
and docs describe the software as it is; its history is CHANGELOG.md's, by date and feature).

Anchors follow GitHub's rule: the heading's text without its Markdown, lowercased, every
character but letters, digits, spaces, hyphens and underscores dropped, spaces turned into
hyphens, and a repeated heading numbered -1, -2, … in order. (That every configuration key is
in docs/configuration.md, and no other, is ConfigurationReferenceTests' check, in Swift, against
the decoder itself.)"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_FOLDERS = {".build", ".venv", ".git", "node_modules", "__pycache__"}

#: Pages a newcomer is promised (README "Where next"): each exists and says what it is for.
PAGES = ["configuration", "oauth2", "oidc", "franceconnect", "central", "app", "relay", "sessions",
         "instances", "operations", "security", "architecture", "performance"]


def markdown_files():
    files = []
    for path in sorted(ROOT.rglob("*.md")):
        relative = path.relative_to(ROOT)
        if any(part in SKIPPED_FOLDERS or part.startswith(".build") for part in relative.parts):
            continue
        files.append(path)
    return files


def without_code(text):
    """The text outside fenced code blocks (a link or heading inside one is an example)."""
    out, fenced = [], False
    for line in text.splitlines():
        if re.match(r"^\s*(```|~~~)", line):
            fenced = not fenced
            out.append("")
            continue
        out.append("" if fenced else line)
    return out


def slug(heading):
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links and images: their text
    text = re.sub(r"<[^>]+>", "", text)                           # inline HTML
    text = text.replace("`", "").replace("*", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    found, counts = set(), {}
    lines = without_code(path.read_text())
    for line in lines:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        n = counts.get(base, 0)
        counts[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    for line in lines:   # explicit <a id="…"> / <a name="…">
        found.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return found


LINK = re.compile(r"(?<!\\)!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(path):
    for number, line in enumerate(without_code(path.read_text()), 1):
        stripped = re.sub(r"`[^`]*`", "", line)   # inline code is not a link
        for match in LINK.finditer(stripped):
            yield number, match.group(1)


def broken_links(files, root=ROOT):
    problems = []
    anchor_cache = {}
    for path in files:
        for number, target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):   # http:, https:, mailto:
                continue
            file_part, _, fragment = target.partition("#")
            destination = path if not file_part else (path.parent / file_part).resolve()
            where = f"{path.relative_to(root)}:{number}: {target}"
            if not destination.exists():
                problems.append(f"{where}: no such file")
                continue
            if root not in destination.parents and destination != root:
                problems.append(f"{where}: outside the repository")
                continue
            if fragment:
                if destination.suffix != ".md":
                    problems.append(f"{where}: an anchor into a file that is not Markdown")
                    continue
                if destination not in anchor_cache:
                    anchor_cache[destination] = anchors(destination)
                if fragment not in anchor_cache[destination]:
                    problems.append(f"{where}: no heading with this anchor")
    return problems


def test_every_relative_link_and_anchor_resolves():
    files = markdown_files()
    assert ROOT / "README.md" in files and any(p.parent == ROOT / "docs" for p in files)
    assert broken_links(files) == []


def test_the_link_check_finds_a_broken_link_and_a_broken_anchor(tmp_path):
    """The check itself can fail: a missing file, a missing anchor and a link out of the tree."""
    root = (tmp_path / "tree").resolve()
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "target.md").write_text("# Target\n\n## The S2S signature\n\n## Again\n\n## Again\n")
    probe = root / "docs" / "probe.md"
    probe.write_text("# Probe\n\n[gone](no-such-page.md) [bad](target.md#no-such-heading) "
                     "[good](target.md#the-s2s-signature) [second](target.md#again-1) [self](#probe) "
                     "[out](../../outside.md)\n\n```\n[in code](ignored.md)\n```\n")
    (tmp_path / "outside.md").write_text("# Outside\n")
    problems = broken_links([probe], root=root)
    assert len(problems) == 3, problems
    assert "no-such-page.md: no such file" in problems[0]
    assert "no-such-heading: no heading with this anchor" in problems[1]
    assert "outside the repository" in problems[2]


def test_anchors_follow_githubs_rule():
    assert slug("The S2S signature") == "the-s2s-signature"
    assert slug("Sign-in with `kind: oidc` (OpenID Connect)") == "sign-in-with-kind-oidc-openid-connect"
    assert slug("[Rate limits](operations.md) and more") == "rate-limits-and-more"


@pytest.mark.parametrize("page", PAGES)
def test_each_docs_page_exists_and_says_what_it_is_for(page):
    path = ROOT / "docs" / f"{page}.md"
    assert path.exists(), f"docs/{page}.md is missing"
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    assert lines[0].startswith("# "), f"docs/{page}.md starts with its title"
    assert not lines[1].startswith("#") and not lines[1].startswith("|"), \
        f"docs/{page}.md says what it is for before its first section or table"


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 220, "README.md is a front door; reference belongs in docs/"
    for command in ["scripts/demo", "scripts/test"]:
        assert command in readme
    for page in PAGES:
        assert f"docs/{page}.md" in readme, f"README.md leads to docs/{page}.md"


def test_no_user_facing_text_names_an_issue_number():
    user_facing = [p for p in markdown_files() if not p.is_relative_to(ROOT / "Tests")]
    user_facing += [ROOT / "Benchmarks" / "run", *sorted((ROOT / "Benchmarks").rglob("*.py")), *sorted((ROOT / "sandbox").rglob("*.py")),
                    *sorted((ROOT / "scripts").iterdir()), *sorted((ROOT / "deploy").rglob("*.yaml"))]
    found = []
    for path in user_facing:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if re.search(r"\bissues?\s*#?\d+", line, re.IGNORECASE):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []
