"""Runs last (pytest orders files by name): no secret, code or token seen during the
suite appears anywhere in Gatehouse's log, and neither does the upstream's secret."""


def test_no_secret_code_or_token_reaches_the_log(gatehouse, seen):
    log = gatehouse["log"].read_text()
    assert "gatehouse is ready" in log
    assert len(seen.values) > 10, "the suite should have recorded the secrets it saw"
    leaked = [value[:6] + "…" for value in seen.values if value in log]
    assert leaked == []
