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


def expand(tree: str) -> list:
    """The paths of one use tree (`a::{b, c::{d, e}}` -> a::b, a::c::d, a::c::e)."""
    tree = tree.strip()
    i = tree.find("{")
    if i < 0:
        return [tree]
    prefix, inner = tree[:i], tree[i + 1 : tree.rindex("}")]
    items, depth, start = [], 0, 0
    for j, ch in enumerate(inner):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            items.append(inner[start:j])
            start = j + 1
    items.append(inner[start:])
    return [p for item in items if item.strip() for p in expand(prefix + item.strip())]


def paths_named(text: str):
    """(head, [segments]) of every `crate::`, `super::` or `self::` path, braces expanded."""
    for m in re.finditer(r"\b(crate|super|self)::", text):
        # The path runs on through identifiers, `::` and balanced `{...}` groups.
        j, depth = m.end(), 0
        while j < len(text):
            ch = text[j]
            if ch == "{":
                depth += 1
            elif ch == "}":
                if depth == 0:
                    break
                depth -= 1
            elif not (ch.isalnum() or ch in "_:*" or (depth and (ch.isspace() or ch == ","))):
                break
            j += 1
        for path in expand(text[m.start() : j]):
            parts = [re.sub(r"\s+as\s+\w+$", "", p).strip() for p in path.split("::") if p]
            yield parts[0], [p for p in parts[1:] if re.fullmatch(r"\w+", p)]

def scopes(text: str, mod: tuple):
    """The file's text outside inline modules, under the file's module path, then each inline
    `mod name { ... }` under `mod + (name,)` (so that its `super::` means the file)."""
    outer, i = [], 0
    inner = []
    for m in re.finditer(r"\bmod\s+(\w+)\s*\{", text):
        if m.start() < i:
            continue
        outer.append(text[i : m.start()])
        depth, j = 1, m.end()
        while depth and j < len(text):
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        inner.append((mod + (m.group(1),), text[m.end() : j]))
        i = j
    outer.append(text[i:])
    return [(mod, "".join(outer))] + inner


def main():
    files = {module_of(p): p for p in ROOT.rglob("*.rs")}
    # Test modules kept in files of their own (`#[cfg(test)] mod tests;`) are tests too.
    test_files = set()
    for mod, path in files.items():
        for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*mod\s+(\w+)\s*;", path.read_text()):
            test_files.add(mod + (m.group(1),))
    files = {m: p for m, p in files.items() if not any(m[: len(t)] == t for t in test_files)}
    edges = {m: set() for m in files}
    for mod, path in files.items():
        named = [(sc, h, r) for sc, t in scopes(strip(path.read_text()), mod) for h, r in paths_named(t)]
        for scope, head, rest in named:
            if head == "crate":
                base = []
            elif head == "self":
                base = list(scope)
            else:
                base = list(scope)
                while rest and rest[0] == "super":
                    rest = rest[1:]
                    base = base[:-1]
                # `super` of a file module `a/b.rs` is `a`; of `a/b/mod.rs` also `a`.
                base = base[:-1]
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
