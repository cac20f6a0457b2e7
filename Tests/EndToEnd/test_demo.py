"""The README's demo command runs its walkthrough to the end (what a new user sees first)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_demo_walkthrough_completes(tmp_path):
    result = subprocess.run([sys.executable, str(ROOT / "deploy/demo/walkthrough.py"), "--no-wait", "--data", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Walkthrough complete." in result.stdout
    assert "HTTP 400" in result.stdout  # the burnt refresh token and the stolen code were refused
