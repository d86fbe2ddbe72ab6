"""A command agent that never finishes, with a child process that would outlive it if only the agent
were killed (the worker must kill the whole process group). ``argv[1]``: a file the child writes its
pid to, so a test can check it is gone."""

from __future__ import annotations

import subprocess
import sys
import time


def main() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            fh.write(str(child.pid))
    print("started", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
