"""A command agent that fails: writes a traceback-like message to stderr and exits with status 3."""

from __future__ import annotations

import sys


def main() -> None:
    print("partial output, no result line")
    print(
        "Traceback (most recent call last):\n  ...\nRuntimeError: the agent broke on purpose", file=sys.stderr
    )
    sys.exit(3)


if __name__ == "__main__":
    main()
