"""A command agent that floods stdout and stderr with garbage (invalid UTF-8, half JSON) and exits 0."""

from __future__ import annotations

import os
import sys


def main() -> None:
    out = sys.stdout.buffer
    for i in range(2000):
        out.write(os.urandom(300) + b'\n{"reward": ' + str(i).encode() + b"\n")
        sys.stderr.buffer.write(os.urandom(100))
    out.write(b"\xff\xfe not json at the end\n")
    out.flush()


if __name__ == "__main__":
    main()
