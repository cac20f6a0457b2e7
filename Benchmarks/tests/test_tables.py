"""The report's notes of a side's runs (bench.tables.run_notes): both tables write them this way."""

from bench.tables import run_notes


def test_each_invalid_run_and_socket_line_becomes_a_note_under_its_side():
    side = {"invalid": [(2, ["non-2xx answers 3", "body unchecked"])], "socket": ["socket errors: connect 1"]}
    assert run_notes("relay, gatehouse", side) == [
        "- relay, gatehouse, run 2: INVALID: non-2xx answers 3; body unchecked",
        "- relay, gatehouse, socket errors: connect 1",
    ]


def test_a_clean_side_has_no_notes():
    assert run_notes("relay", {"invalid": [], "socket": None}) == []
    assert run_notes("relay", {"invalid": []}) == []
