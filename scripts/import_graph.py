#!/usr/bin/env python3
"""The library's module import graph: every `crate::`, `super::` and `self::` path a module
names, resolved to the module files it reaches, then checked for circles (strongly connected
components of more than one module) and for arrows back up (a module naming its own ancestor:
`mod.rs` of a folder may use its children, a child may not use its parent).

    python3 scripts/import_graph.py            # prints any circle or upward arrow; exit 1 if one
    python3 scripts/import_graph.py --dot      # the graph in Graphviz form

Doc comments and `#[cfg(test)]` modules are left out: tests may look anywhere. Re-exports
(`pub use child::X` in a parent) are arrows down, as they should be.
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "src"


def module_of(path: Path) -> tuple:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] in ("mod", "lib"):
        parts = parts[:-1]
    return tuple(parts)


def strip(text: str) -> str:
    # Drop line comments (doc comments included) and test modules.
    text = re.sub(r"//[^\n]*", "", text)
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(pub(\([a-z]+\))?\s+)?mod\s+\w+\s*\{", text):
        if m.start() < i:
            continue
        out.append(text[i:m.start()])
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    out.append(text[i:])
    return "".join(out)


def main():
    files = {module_of(p): p for p in ROOT.rglob("*.rs")}
    # `mod x;` declared inside a file but defined inline or via #[path] are not separate files.
    edges = {m: set() for m in files}
    for mod, path in files.items():
        text = strip(path.read_text())
        for m in re.finditer(r"\b(crate|super|self)((?:::\w+)+)", text):
            head, rest = m.group(1), [p for p in m.group(2).split("::") if p]
            if head == "crate":
                base = []
            elif head == "self":
                base = list(mod)
            else:
                base = list(mod)
                while rest and rest[0] == "super":
                    rest = rest[1:]
                    base = base[:-1]
                base = base[:-1] if path.name != "mod.rs" or True else base
                # `super` of a file module `a/b.rs` is `a`; of `a/b/mod.rs` also `a`.
            target = tuple(base)
            for part in rest:
                nxt = target + (part,)
                if nxt in files:
                    target = nxt
                else:
                    break
            if target != mod and target in files:
                edges[mod].add(target)
    bad = []
    for mod, targets in edges.items():
        for t in targets:
            if len(t) < len(mod) and mod[: len(t)] == t:
                bad.append(f"arrow up: {'/'.join(mod) or 'lib'} -> {'/'.join(t) or 'lib'}")
    # Tarjan's strongly connected components.
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
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
            comps.append(comp)

    sys.setrecursionlimit(10000)
    for v in edges:
        if v not in index:
            visit(v)
    for comp in comps:
        if len(comp) > 1:
            bad.append("circle: " + " <-> ".join(sorted("/".join(c) for c in comp)))
    if "--dot" in sys.argv:
        print("digraph imports {")
        for mod, targets in sorted(edges.items()):
            for t in sorted(targets):
                print(f'  "{"/".join(mod) or "lib"}" -> "{"/".join(t) or "lib"}";')
        print("}")
    n_edges = sum(len(t) for t in edges.values())
    print(f"{len(files)} modules, {n_edges} import arrows", file=sys.stderr)
    for line in sorted(bad):
        print(line)
    if not bad:
        print("no circle, no arrow back up", file=sys.stderr)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
