#!/usr/bin/env python3
"""Fails when the top-level modules of `daemon/src` (the daemon library) import each other in a circle.

Why: the crate is layered (docs/architecture.md, issue 35): `record/` at the bottom, the
engines above it, the data path, `control/` and `daemon/` on top. Every import must point
down; a cycle between top-level modules means one of them points up.

What it reads: every `.rs` file of the library, found by walking `mod` declarations from
`daemon/src/lib.rs` (so `#[path = "x_tests.rs"]` files and inline `mod tests { }` get their
true module path). In each, outside comments and string literals, every path that starts
with `crate::` (or `$crate::`), or with enough `super::` to climb to the crate root, names a
top-level module: its first segment after the root (`use crate::{a, b::C}` names `a` and
`b`). The file's own top-level module is the first segment of its module path. That gives
a graph of top-level modules, edges `from -> to` with the first `file:line` that makes them.
Test code counts like any other code: a test that imports upward is an upward import.

The allow-list (`tools/module-cycles.allow`): edges still to be cut, one `from -> to` a line,
each with a `# why` comment. The check passes when the graph without the allowed edges has
no cycle, and every allowed edge still exists and still lies on a cycle, so the list can
only shrink.

Usage: tools/module-cycles.py [--edges] [--allow FILE] [--src DIR]
  --edges   also print every edge (with one example import each)
Exit status: 0 no cycle left (outside the allow-list), 1 a cycle or a stale allow-list
entry, 2 bad usage or unreadable input. Python 3 standard library only.
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def strip(text):
    """Blanks comments and the contents of string and char literals, keeping line breaks
    and columns, so braces and paths are only seen in code."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
        elif text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif re.match(r'b?r#*"', text[i:i + 64]) and not _ident_char(text, i - 1):
            m = re.match(r'(b?r)(#*)"', text[i:])
            close = '"' + m.group(2)
            j = text.find(close, i + m.end())
            j = n if j < 0 else j + len(close)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif c == "'":
            # A char literal ('x', '\n', '\u{7f}'), else a lifetime or label ('a).
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'", text[i:])
            if m:
                out.append(" " * m.end())
                i += m.end()
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def die(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)


def _ident_char(text, i):
    return i >= 0 and (text[i].isalnum() or text[i] == "_")


MOD_DECL = re.compile(r"\bmod\s+(r#)?(\w+)\s*([;{])")
PATH_ATTR = re.compile(r'#\[\s*path\s*=\s*"([^"]+)"\s*\]')
# A path that starts at the crate root or climbs with super (`self::` stays put).
PATH = re.compile(r"(?<![\w$])(\$?crate|super)\s*::\s*((?:super\s*::\s*)*)")


def parse_file(path, modpath, files, raw_cache):
    """Records `path` as module `modpath`, then follows its `mod` declarations."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except OSError as e:
        die(f"module-cycles: cannot read {path}: {e}")
    raw_cache[path] = raw
    code = strip(raw)
    # Where `mod x;` finds its file: beside a mod.rs/lib.rs, else in a folder named for us.
    base = os.path.basename(path)
    if base in ("mod.rs", "lib.rs", "main.rs"):
        mod_dir = os.path.dirname(path)
    else:
        mod_dir = os.path.join(os.path.dirname(path), base[:-3])
    # Inline modules shift the module path of what they contain; track them by brace depth.
    stack = []  # (depth at which the inline mod's body closes, name)
    depth = 0
    for m in re.finditer(r"[{}]|\bmod\s+(?:r#)?\w+\s*[;{]", code):
        tok = m.group(0)
        if tok == "{":
            depth += 1
            continue
        if tok == "}":
            depth -= 1
            if stack and stack[-1][0] == depth:
                stack.pop()
            continue
        d = MOD_DECL.match(tok)
        name, end = d.group(2), d.group(3)
        inner = [s[1] for s in stack]
        if end == "{":
            stack.append((depth, name))
            depth += 1
            continue
        # `mod x;`: a #[path] among the attributes just before it wins.
        boundary = max(code.rfind(ch, 0, m.start()) for ch in ";{}")
        attr = PATH_ATTR.findall(raw[boundary + 1:m.start()])
        sub_dir = os.path.join(mod_dir, *inner)
        if attr:
            # Relative to the file's own directory (or the inline module's, inside one).
            child = os.path.join(sub_dir if inner else os.path.dirname(path), attr[-1])
        elif os.path.exists(os.path.join(sub_dir, name + ".rs")):
            child = os.path.join(sub_dir, name + ".rs")
        else:
            child = os.path.join(sub_dir, name, "mod.rs")
        child = os.path.normpath(child)
        if not os.path.exists(child):
            die(f"module-cycles: {path}: `mod {name};` has no file ({child})")
        parse_file(child, modpath + inner + [name], files, raw_cache)
    # Per-line module path, for paths written inside inline modules.
    files[path] = (modpath, code, _inline_paths(code, modpath))


def _inline_paths(code, modpath):
    """For each offset range, the module path there (file's own plus enclosing inline mods)."""
    ranges = []  # (start, end, extra)
    stack = []
    depth = 0
    for m in re.finditer(r"[{}]|\bmod\s+(?:r#)?(\w+)\s*\{", code):
        tok = m.group(0)
        if tok == "{":
            depth += 1
        elif tok == "}":
            depth -= 1
            if stack and stack[-1][0] == depth:
                _, name, start = stack.pop()
                ranges.append((start, m.start(), len(stack) + 1, name))
        else:
            stack.append((depth, m.group(1), m.end()))
            depth += 1
    return ranges


def module_at(offset, modpath, ranges):
    """The module path at `offset`: inline modules enclosing it, innermost last."""
    enclosing = sorted((r for r in ranges if r[0] <= offset < r[1]), key=lambda r: r[2])
    return modpath + [r[3] for r in enclosing]


def targets(code, offset_after):
    """The first segment(s) of the path continuing at `offset_after`: a name, or the names
    of a `{…}` group's members."""
    rest = code[offset_after:offset_after + 4000]
    m = re.match(r"\s*(\w+)", rest)
    if m and m.group(1) != "self":
        return [m.group(1)]
    if m:
        return []
    if not rest.lstrip().startswith("{"):
        return []
    body = rest[rest.index("{") + 1:]
    names, depth, item = [], 0, ""
    for ch in body:
        if ch == "{":
            depth += 1
        elif ch == "}":
            if depth == 0:
                break
            depth -= 1
        elif ch == "," and depth == 0:
            names.append(item)
            item = ""
            continue
        if depth == 0:
            item += ch
    names.append(item)
    out = []
    for it in names:
        w = re.match(r"\s*(\w+)", it)
        if w and w.group(1) != "self":
            out.append(w.group(1))
    return out


def build_graph(src):
    files, raw = {}, {}
    parse_file(os.path.join(src, "lib.rs"), [], files, raw)
    top = {mp[0] for mp, *_ in files.values() if mp}
    edges = {}  # (from, to) -> "file:line"
    for path, (modpath, code, ranges) in sorted(files.items()):
        if not modpath:
            continue  # lib.rs only declares the modules
        rel = os.path.relpath(path, ROOT)
        for m in PATH.finditer(code):
            here = module_at(m.start(), modpath, ranges)
            supers = 1 if m.group(1) == "super" else 0
            supers += len(re.findall(r"super", m.group(2)))
            if m.group(1).endswith("crate"):
                level = 0
            else:
                level = len(here) - supers
                if level < 0:
                    die(f"module-cycles: {rel}: `super` climbs above the crate")
            if level > 0:
                continue  # stays inside a top-level module
            for name in targets(code, m.end()):
                if name not in top or name == modpath[0]:
                    continue
                line = code.count("\n", 0, m.start()) + 1
                edges.setdefault((modpath[0], name), f"{rel}:{line}")
    return top, edges


def sccs(nodes, edges):
    """Tarjan's strongly connected components."""
    adj = {n: sorted(t for (f, t) in edges if f == n) for n in nodes}
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in adj[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for n in sorted(nodes):
        if n not in index:
            visit(n)
    return [c for c in out if len(c) > 1]


def read_allow(path):
    allow = {}
    if not os.path.exists(path):
        return allow
    with open(path, encoding="utf-8") as f:
        for no, line in enumerate(f, 1):
            body, _, why = line.partition("#")
            if not body.strip():
                continue
            m = re.fullmatch(r"\s*(\w+)\s*->\s*(\w+)\s*", body)
            if not m or not why.strip():
                die(f"module-cycles: {path}:{no}: want `from -> to  # why`, got {line.strip()!r}")
            allow[(m.group(1), m.group(2))] = no
    return allow


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--edges", action="store_true", help="print every edge")
    ap.add_argument("--allow", default=os.path.join(ROOT, "tools", "module-cycles.allow"))
    ap.add_argument("--src", default=os.path.join(ROOT, "daemon", "src"))
    args = ap.parse_args()

    nodes, edges = build_graph(args.src)
    allow = read_allow(args.allow)
    if args.edges:
        print(f"{len(edges)} edges between {len(nodes)} top-level modules:")
        for (f, t), at in sorted(edges.items()):
            print(f"  {f} -> {t}  ({at})")
    failed = False

    comps = sccs(nodes, edges)
    if comps:
        print(f"{len(comps)} cycle(s) between top-level modules (with the allow-list's edges):")
    for comp in comps:
        print(f"  cycle of {len(comp)}: {', '.join(comp)}")
        for (f, t), at in sorted(edges.items()):
            if f in comp and t in comp:
                mark = "  [allowed]" if (f, t) in allow else ""
                print(f"    {f} -> {t}  ({at}){mark}")

    rest = {e: at for e, at in edges.items() if e not in allow}
    left = sccs(nodes, rest)
    for comp in left:
        failed = True
        print(f"FAIL: cycle not broken by the allow-list: {', '.join(comp)}")
        for (f, t), at in sorted(rest.items()):
            if f in comp and t in comp:
                print(f"    {f} -> {t}  ({at})")

    on_cycle = {(f, t) for comp in comps for (f, t) in edges if f in comp and t in comp}
    for (f, t), no in sorted(allow.items(), key=lambda kv: kv[1]):
        if (f, t) not in edges:
            failed = True
            print(f"FAIL: {os.path.relpath(args.allow, ROOT)}:{no}: {f} -> {t} does not exist (any more): remove it")
        elif (f, t) not in on_cycle:
            failed = True
            print(f"FAIL: {os.path.relpath(args.allow, ROOT)}:{no}: {f} -> {t} is on no cycle any more: remove it")

    if not failed:
        print(f"module-cycles: ok ({len(edges)} edges, {len(allow)} allowed edge(s) still to cut)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
