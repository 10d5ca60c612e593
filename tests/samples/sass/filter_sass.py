"""Shrink a real ``cuobjdump -sass`` listing to what kvprefetch.verify.sass reads, for saved
samples.

Keeps every line matching ``arch =|code for|Function :|UBLKPF|CCTL`` plus the first three
instruction lines (``/*0000*/ ...``) after each ``Function :`` line, in order. Nothing is
rewritten or invented: every kept line is a verbatim line of the input.

Usage: python filter_sass.py < full.sass > sample.sass
How the saved samples were made is in README.md next to this file."""

import re
import sys

KEEP = re.compile(r"arch =|code for|Function :|UBLKPF|CCTL")
INSTRUCTION = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/")


def filter_sass(text: str) -> str:
    out = []
    after_function = 0
    for line in text.splitlines():
        if KEEP.search(line):
            out.append(line)
            if "Function :" in line:
                after_function = 3
            continue
        if after_function and INSTRUCTION.match(line):
            out.append(line)
            after_function -= 1
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(filter_sass(sys.stdin.read()))
