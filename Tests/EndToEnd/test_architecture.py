"""The house's walls: each upstream kind lives in its own folder of GatehouseUpstreams, and
nothing outside that folder names its types except the kind's one line in UpstreamRegistry;
no text of GatehouseCore or GatehouseServer names a kind. A kind added the way the seam's test
adds one (Tests/GatehouseServerTests/StaticKind) needs nothing else; these checks keep it so."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCES = ROOT / "Sources"
KINDS = ROOT / "Sources" / "GatehouseUpstreams"
REGISTRY = KINDS / "UpstreamRegistry.swift"

# The folder of each kind, and the kinds it builds on (FranceConnect is OpenID Connect with its
# own rules: it may name the oidc kind's types, never the reverse).
KIND_FOLDERS = {"oauth2": "OAuth2", "oidc": "OIDC", "franceconnect": "FranceConnect", "central": "Central"}
BUILDS_ON = {"franceconnect": {"oidc"}}

TOP_LEVEL_TYPE = re.compile(r"^(?:public |package |internal )?(?:final )?(?:struct|enum|class|actor|protocol) (\w+)", re.M)


def swift_files(folder):
    return sorted(folder.rglob("*.swift"))


def declared_types(kind):
    names = set()
    for path in swift_files(KINDS / KIND_FOLDERS[kind]):
        names.update(TOP_LEVEL_TYPE.findall(path.read_text()))
    return names


def test_every_kind_folder_declares_types():
    for kind in KIND_FOLDERS:
        assert declared_types(kind), f"the {kind} kind's folder declares no type: the checks below would prove nothing"


def test_no_file_outside_a_kinds_folder_names_its_types_but_its_registry_line():
    leaks = []
    for kind, folder in KIND_FOLDERS.items():
        names = declared_types(kind)
        pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
        allowed = {KINDS / KIND_FOLDERS[k] for k, bases in BUILDS_ON.items() if kind in bases} | {KINDS / folder}
        for path in swift_files(SOURCES):
            if any(base in path.parents for base in allowed):
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and not (path == REGISTRY and f'"{kind}":' in line):
                    leaks.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not leaks, "a kind's types named outside its folder:\n" + "\n".join(leaks)


def test_each_kind_has_exactly_one_registry_line():
    text = REGISTRY.read_text()
    for kind in KIND_FOLDERS:
        assert len(re.findall(rf'^\s*"{kind}": \w+\.kind,$', text, re.M)) == 1, kind


def test_core_and_server_name_no_kind():
    words = re.compile(r"\b(" + "|".join(sorted(KIND_FOLDERS) + ["FranceConnect"]) + r")\b", re.I)
    hits = []
    for module in ("GatehouseCore", "GatehouseServer"):
        for path in swift_files(SOURCES / module):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                if words.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, "Core and Server ask the profile instead of naming a kind:\n" + "\n".join(hits)


def test_the_checks_see_a_leak(tmp_path):
    # The pattern that guards the walls finds a kind's type in an ordinary line of code.
    names = declared_types("central")
    pattern = re.compile(r"\b(" + "|".join(sorted(names)) + r")\b")
    assert pattern.search("        if let central = upstream as? CentralUpstream {")
    assert not pattern.search("        if let minter = upstream.minter {")
