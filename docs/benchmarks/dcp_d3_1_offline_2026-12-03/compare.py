"""Compare two offline build folders (from offline_builds.py), build by build: the PTX and the SASS byte for byte,
and the TTGIR operation for operation: locations are stripped already; the constants' definitions (hoisted to the
function's top, in the order they were first made) are folded into their uses, and SSA names (named after the source's
variables) are numbered in order of appearance."""
import re
import sys
from pathlib import Path

ALIAS = re.compile(r"^(#[\w]+) = (.*)$")
ALIAS_REF = re.compile(r"#[A-Za-z_]\w*")
CONST = re.compile(r"^\s*(%[\w$.-]+) = arith\.constant (.*)$")
NAME = re.compile(r"%[\w$.-]+")


def ops(ttgir: str) -> list[str]:
    """The operations, with the layout aliases (#blocked1, ..., numbered in order of first use) replaced by their
    definitions, constants folded into their uses and SSA values renumbered."""
    aliases, lines = {}, []
    for line in ttgir.splitlines():
        m = ALIAS.match(line)
        if m:
            aliases[m.group(1)] = m.group(2)
        else:
            lines.append(line)
    lines = [ALIAS_REF.sub(lambda m: aliases.get(m.group(0), m.group(0)), line) for line in lines]
    consts, out = {}, []
    for line in lines:
        m = CONST.match(line)
        if m:
            consts[m.group(1)] = f"<const {m.group(2)}>"
            continue
        out.append(line)
    # SSA values numbered by definition, in order: results (left of " = "), loop variables and iter_args ("%x = "
    # inside a line), block and function arguments ("%x: type"); a use refers to the latest definition of its name
    names, count, out2 = {}, [0], []

    def fresh(tok):
        names[tok] = f"%v{count[0]}"
        count[0] += 1

    for line in out:
        stripped = line.lstrip()
        lhs_end = line.index(" = ") if stripped.startswith("%") and " = " in line else -1
        defs, pieces, last = [], [], 0
        for m in NAME.finditer(line):
            tok, after = m.group(0), line[m.end():m.end() + 3]
            is_def = (lhs_end >= 0 and m.start() < lhs_end) or after.startswith(" = ") or after.startswith(": ")
            pieces.append(line[last:m.start()])
            if is_def:
                defs.append(len(pieces))
                pieces.append(tok)
            elif tok in consts:
                pieces.append(consts[tok])
            else:
                if tok not in names:
                    fresh(tok)
                pieces.append(names[tok])
            last = m.end()
        pieces.append(line[last:])
        for i in defs:
            fresh(pieces[i])
            pieces[i] = names[pieces[i]]
        out2.append("".join(pieces))
    return out2


a, b = Path(sys.argv[1]), Path(sys.argv[2])
names = sorted(str(p.parent.relative_to(b)) for p in b.rglob("sass"))
counts = {"ttgir ops": 0, "ttgir bytes": 0, "ptx": 0, "sass": 0}
missing, diffs = 0, []
for n in names:
    if not (a / n / "sass").exists():
        missing += 1
        continue
    ta, tb = (a / n / "ttgir").read_text(), (b / n / "ttgir").read_text()
    same = {"ttgir ops": ops(ta) == ops(tb), "ttgir bytes": ta == tb,
            "ptx": (a / n / "ptx").read_bytes() == (b / n / "ptx").read_bytes(),
            "sass": (a / n / "sass").read_bytes() == (b / n / "sass").read_bytes()}
    for kind, ok in same.items():
        counts[kind] += ok
        if not ok and kind != "ttgir bytes":
            diffs.append((n, kind))
print(f"compared {len(names) - missing} builds ({missing} of {len(names)} missing in {a}); identical: {counts}")
for n, kind in diffs[:40]:
    print("DIFF", kind, n)
