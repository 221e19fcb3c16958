#!/usr/bin/env python3
"""Re-runs every command the book shows and pastes its real output.

In book/src/*.md, a line `<!-- output: deploy ARGS -->` followed by a fenced code block marks
that block as the output of `deploy ARGS`, run from the repository root with the debug build
(stdout and stderr together, as a terminal shows them without colour). Run after
`cargo build`:

    python3 book/refresh-outputs.py          # rewrite the blocks
    python3 book/refresh-outputs.py --check  # only report blocks that are out of date
"""

import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "target" / "debug" / "deploy"
MARKER = re.compile(r"^<!-- output: (deploy .*?) -->\n```(\w*)\n(.*?)^```\n", re.M | re.S)


def run(command):
    args = shlex.split(command)
    out = subprocess.run(
        [str(DEPLOY)] + args[1:],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={"PATH": "/usr/bin:/bin", "NO_COLOR": "1"},
        timeout=120,
    )
    return out.stdout.decode()


def main():
    check = "--check" in sys.argv
    stale = 0
    for page in sorted((ROOT / "book" / "src").glob("*.md")):
        text = page.read_text()

        def replace(m):
            nonlocal stale
            output = run(m.group(1))
            if not output.endswith("\n"):
                output += "\n"
            if output != m.group(3):
                stale += 1
                print(f"{page.relative_to(ROOT)}: `{m.group(1)}` changed")
            return f"<!-- output: {m.group(1)} -->\n```{m.group(2)}\n{output}```\n"

        new = MARKER.sub(replace, text)
        if new != text and not check:
            page.write_text(new)
    sys.exit(1 if check and stale else 0)


if __name__ == "__main__":
    main()
