"""Runs last (pytest orders files by name): no secret, code or token seen during the
suite appears anywhere in any Gatehouse log of the run (the main instance, the
PostgreSQL cluster's instances and the connection-limit instances), and neither does an
upstream's secret."""


def test_no_secret_code_or_token_reaches_any_log(gatehouse, seen, workdir):
    logs = {path.name: path.read_text() for path in [gatehouse["log"], *sorted(workdir.glob("cluster-*.log")),
                                                    *sorted(workdir.rglob("edge-*.log"))]}
    assert "gatehouse is ready" in logs["gatehouse.log"]
    assert len(seen.values) > 10, "the suite should have recorded the secrets it saw"
    leaked = [(name, value[:6] + "…") for name, text in logs.items() for value in seen.values if value in text]
    assert leaked == []
