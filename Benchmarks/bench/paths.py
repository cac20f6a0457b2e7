"""Where the harness's files are: its folder, the fixtures the backend serves and the load checks
against, the wrk script, and where the report and each run's numbers are written."""

from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent.parent   # Benchmarks/
ROOT = BENCH_DIR.parent                              # the repository
FIXTURES = BENCH_DIR / "fixtures"
DATA = FIXTURES / "data.json"
IDENTITY = FIXTURES / "identity.json"
POST_BODY = FIXTURES / "post.json"
POST_ANSWER = FIXTURES / "post-answer.json"
CHECK_LUA = BENCH_DIR / "check.lua"
SEALED_PY = BENCH_DIR / "sealed.py"
PERF_BUCKETS_PY = BENCH_DIR / "perf_buckets.py"
OUT_DIR = ROOT / ".build" / "benchmarks"
REPORT = OUT_DIR / "latest.md"
RUNS_DIR = OUT_DIR / "runs"
