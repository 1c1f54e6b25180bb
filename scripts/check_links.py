#!/usr/bin/env python3
"""Check the relative links of the project's Markdown: README.md, CHANGELOG.md, docs/**/*.md.

Every relative link or image must name a file or directory that exists; a `#anchor` into a
Markdown file (or within the same file) must match one of its headings, slugged as GitHub slugs
them (or an explicit `<a name=...>` / `id=...`). External links (http, https, mailto, ...) are not
fetched. Prints each broken link as `file:line: target (why)` and exits 1 if there is any.

Python 3 standard library only; run from anywhere: `python3 scripts/check_links.py`.
"""

import os
import re
import sys
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# [text](target "title") and ![alt](target); the text may hold one level of brackets
# (e.g. an image inside a link). The target may be wrapped in <...>.
INLINE = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]*(?:\([^\s()]*\)[^\s()]*)*)"
    r"(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)"
)
# [label]: target
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
# <img src="..."> and <a href="...">
HTML = re.compile(r"<(?:img|a|source)\b[^>]*?\b(?:src|href|srcset)\s*=\s*[\"']([^\"']+)[\"']", re.I)
# Explicit anchors: <a name="x">, <a id="x">, any id="x"
HTML_ANCHOR = re.compile(r"<[a-z][^>]*?\b(?:name|id)\s*=\s*[\"']([^\"']+)[\"']", re.I)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
SETEXT = re.compile(r"^\s{0,3}(=+|-+)\s*$")


def markdown_files():
    files = []
    for name in ("README.md", "CHANGELOG.md"):
        path = os.path.join(ROOT, name)
        if os.path.isfile(path):
            files.append(path)
    docs = os.path.join(ROOT, "docs")
    for dirpath, dirnames, filenames in os.walk(docs):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".md"):
                files.append(os.path.join(dirpath, name))
    return files


def prose_lines(text):
    """(line number, line, line with inline code spans blanked) for the lines outside fenced
    code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)
            continue
        if fence is not None:
            if match and match.group(1)[0] == fence[0] and len(match.group(1)) >= len(fence):
                fence = None
            continue
        yield number, line, strip_code_spans(line)


def strip_code_spans(line):
    """Blanks inline code spans (`...`, ``...``) so that their contents are not read as links."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "`":
            run = len(line) - len(line[i:].lstrip("`"))
            ticks = line[i : i + run]
            end = line.find(ticks, i + run)
            if end == -1:
                out.append(ticks)
                i += run
                continue
            out.append(" " * (end + run - i))
            i = end + run
        else:
            out.append(line[i])
            i += 1
    return "".join(out)


def slug_text(heading):
    """The text GitHub renders for a heading's Markdown (markup dropped)."""
    text = heading
    text = re.sub(r"!\[([^\]]*)\]\([^)]*\)", r"\1", text)  # images: alt text
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # links: their text
    text = re.sub(r"\[([^\]]*)\]\[[^\]]*\]", r"\1", text)  # reference links
    text = re.sub(r"<[^>]+>", "", text)  # HTML tags
    text = text.replace("`", "")
    text = re.sub(r"(\*{1,3})(\S.*?\S|\S)\1", r"\2", text)  # *em*, **strong**
    text = re.sub(r"(?<![\w])(_{1,3})(\S.*?\S|\S)\1(?![\w])", r"\2", text)  # _em_
    text = text.replace("~~", "")
    return text


def github_slug(heading):
    text = slug_text(heading).strip().lower()
    # GitHub keeps letters, digits, marks, connector punctuation (_), hyphens and spaces.
    kept = []
    for ch in text:
        if ch.isalnum() or ch in "-_ " or unicode_mark(ch):
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


def unicode_mark(ch):
    import unicodedata

    return unicodedata.category(ch).startswith("M")


_anchor_cache = {}


def anchors_of(path):
    """Every anchor a Markdown file offers: heading slugs (with -1, -2 for repeats) and ids."""
    if path in _anchor_cache:
        return _anchor_cache[path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    anchors, seen = set(), {}
    previous = None
    for _, line, _ in prose_lines(text):
        match = HEADING.match(line)
        title = None
        if match:
            title = match.group(2)
        elif previous is not None and previous.strip() and SETEXT.match(line):
            title = previous.strip()
        if title is not None:
            slug = github_slug(title)
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
        for name in HTML_ANCHOR.findall(line):
            anchors.add(name)
        previous = line
    _anchor_cache[path] = anchors
    return anchors


def targets(line):
    for match in INLINE.finditer(line):
        yield match.group(1)
    match = REFERENCE.match(line)
    if match:
        yield match.group(1)
    for match in HTML.finditer(line):
        yield match.group(1)


def check_target(source, target):
    """None if `target` (as written in `source`) resolves, else the reason."""
    if target.startswith("<") and target.endswith(">"):
        target = target[1:-1]
    target = target.strip()
    if not target:
        return "empty link"
    if SCHEME.match(target) or target.startswith("//"):
        return None  # external: not fetched
    path_part, _, anchor = target.partition("#")
    path_part = path_part.split("?", 1)[0]
    path_part = urllib.parse.unquote(path_part)
    anchor = urllib.parse.unquote(anchor)
    if path_part:
        if path_part.startswith("/"):
            resolved = os.path.normpath(os.path.join(ROOT, path_part.lstrip("/")))
        else:
            resolved = os.path.normpath(os.path.join(os.path.dirname(source), path_part))
        if not os.path.exists(resolved):
            return "no such file"
        if not (resolved == ROOT or resolved.startswith(ROOT + os.sep)):
            return "outside the repository"
    else:
        resolved = source
    if anchor and resolved.endswith(".md") and os.path.isfile(resolved):
        if anchor not in anchors_of(resolved) and anchor.lower() not in anchors_of(resolved):
            return f"no heading with anchor #{anchor} in {os.path.relpath(resolved, ROOT)}"
    return None


def main():
    broken = 0
    checked = 0
    for path in markdown_files():
        with open(path, encoding="utf-8") as f:
            text = f.read()
        for number, _, line in prose_lines(text):
            for target in targets(line):
                checked += 1
                why = check_target(path, target)
                if why:
                    broken += 1
                    print(f"{os.path.relpath(path, ROOT)}:{number}: {target} ({why})")
    sys.stdout.flush()
    if broken:
        print(f"check_links: {broken} broken link(s) of {checked}", file=sys.stderr)
        return 1
    print(f"check_links: {checked} links, all resolve")
    return 0


if __name__ == "__main__":
    sys.exit(main())
