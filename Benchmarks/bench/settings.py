"""The command line (`--only LIST`, `--no-build`, `--help`) and the environment variables' checks.
A wrong value stops the run with `run: <why>` and exit status 2."""

import os
import re
import sys
from dataclasses import dataclass, field

from .processes import fail


def env_int(name, default, minimum=1):
    """A whole-number environment variable (`minimum` 0: seconds that may be 0); stops the run when wrong."""
    text = os.environ.get(name, str(default))
    if not re.fullmatch(r"\d+", text) or int(text) < minimum:
        fail(f"{name} must be {'a positive integer' if minimum else 'a whole number of seconds'}, not '{text}'")
    return int(text)


@dataclass
class Settings:
    """What the command line says: the --only list, whether to build, and the arguments as given."""
    only: str = "all"
    build: bool = True
    args: list = field(default_factory=list)


def parse_args(argv, usage):
    """Settings from the arguments; --help prints `usage` (Benchmarks/run's docstring) and exits."""
    s = Settings(args=list(argv))
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--only":
            if i + 1 >= len(argv):
                fail("--only needs a list (see --help)")
            s.only = argv[i + 1]
            i += 2
            continue
        if a.startswith("--only="):
            s.only = a.split("=", 1)[1]
        elif a == "--no-build":
            s.build = False
        elif a in ("-h", "--help"):
            print(usage.strip())
            sys.exit(0)
        else:
            print(f"run: unknown argument '{a}'", file=sys.stderr)
            print(usage.strip(), file=sys.stderr)
            sys.exit(2)
        i += 1
    return s
