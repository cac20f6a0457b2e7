"""`python -m sandbox.franceconnect --config cfg.json [--port 0] …` from the repository's root,
or `python sandbox/franceconnect …` from anywhere: runs the FranceConnect look-alike until SIGTERM
(see the package's docstring)."""

import sys
from pathlib import Path

if not __package__:  # run as a folder: import it as sandbox.franceconnect, with the repository's root in its place
    sys.path[0] = str(Path(__file__).resolve().parents[2])

from sandbox.franceconnect.server import main  # noqa: E402

if __name__ == "__main__":
    main()
