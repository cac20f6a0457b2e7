"""wrk's output read into numbers (bench.wrk)."""

import pytest

from bench.wrk import parse_wrk, to_ms

OUTPUT = """Running 3s test @ http://127.0.0.1:40337/api/data
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    75.63ms   75.94ms 502.73ms   89.45%
    Req/Sec   535.82    103.74   640.00     85.00%
  Latency Distribution
     50%   54.39ms
     75%   66.97ms
     90%  155.36ms
     99%     1.20s
  3233 requests in 3.06s, 1.42MB read
  Socket errors: connect 0, read 2, write 1, timeout 4
  Non-2xx or 3xx responses: 17
Requests/sec:   1057.31
Transfer/sec:    474.82KB
body-check: checked=4 failed=1 responses=3233 every=1000
body-check first failure: status 502, body 'bad gateway'
"""


def test_parse_wrk_reads_every_number():
    run = parse_wrk(OUTPUT)
    assert run["rps"] == pytest.approx(1057.31)
    assert run["p50"] == pytest.approx(54.39)
    assert run["p99"] == pytest.approx(1200.0)  # seconds in ms
    assert run["requests"] == 3233
    assert run["non2xx"] == 17
    assert run["socket_errors"] == 7
    assert run["socket_detail"] == "Socket errors: connect 0, read 2, write 1, timeout 4"
    assert (run["checked"], run["check_failed"], run["check_responses"]) == (4, 1, 3233)
    assert run["first_failure"] == "status 502, body 'bad gateway'"


def test_parse_wrk_without_errors_or_body_check():
    text = "\n".join(line for line in OUTPUT.splitlines() if not line.lstrip().startswith(("Socket", "Non-2xx", "body-check")))
    run = parse_wrk(text)
    assert (run["non2xx"], run["socket_errors"], run["socket_detail"]) == (0, 0, "")
    assert run["checked"] is None and run["first_failure"] is None


def test_parse_wrk_without_numbers_names_the_first_line():
    with pytest.raises(ValueError, match="unable to connect to 127.0.0.1:1 Connection refused"):
        parse_wrk("\nunable to connect to 127.0.0.1:1 Connection refused\n")
    with pytest.raises(ValueError, match="no wrk output"):
        parse_wrk("  \n")


@pytest.mark.parametrize("text, ms", [("250us", 0.25), ("1.5ms", 1.5), ("2s", 2000.0), ("1m", 60_000.0), ("1h", 3_600_000.0)])
def test_to_ms(text, ms):
    assert to_ms(text) == pytest.approx(ms)


def test_to_ms_refuses_an_unknown_unit():
    with pytest.raises(ValueError):
        to_ms("3d")
