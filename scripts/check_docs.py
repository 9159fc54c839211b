#!/usr/bin/env python3
"""Checks the links of the repository's Markdown files, offline.

Every relative link must name a file inside the repository, and a `#fragment` must name a
heading of the file it points into (GitHub's anchors: lower case, punctuation dropped, spaces
to hyphens, `-1`, `-2`, … for repeats). Links to `http(s)://` and `mailto:` are not followed,
and nothing inside a fenced code block or an inline code span is read as a link.

    scripts/check_docs.py              check every Markdown file git tracks
    scripts/check_docs.py FILE…        check these files
    scripts/check_docs.py --self-test  check the checker on a tree of known good and bad links

Exit 0 when every link holds, 1 with one `file:line: problem` line per broken link.
"""

import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
CODE_SPAN = re.compile(r"(`+).*?\1")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")


def lines_outside_code(text):
    """Yields (line number, line) for the lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            continue
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        yield number, line


def slug(heading):
    """GitHub's anchor for a heading's text."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


_ANCHORS = {}


def anchors(path):
    """The anchors of a Markdown file's headings (read once per run)."""
    cache = _ANCHORS
    if path not in cache:
        seen, found = {}, set()
        with open(path, encoding="utf-8") as f:
            for _, line in lines_outside_code(f.read()):
                m = HEADING.match(line)
                if not m:
                    continue
                base = slug(m.group(2))
                n = seen.get(base, 0)
                seen[base] = n + 1
                found.add(base if n == 0 else f"{base}-{n}")
        cache[path] = found
    return cache[path]


def check(path, root):
    """The problems of one file's links, as `file:line: problem` strings."""
    problems = []
    rel = os.path.relpath(path, root)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # Fenced blocks become empty lines and code spans blanks, so a link's text may wrap over
    # lines as Markdown allows and every offset keeps its line number.
    kept = dict(lines_outside_code(text))
    visible = "\n".join(CODE_SPAN.sub(lambda c: " " * len(c.group(0)), kept.get(n, ""))
                        for n in range(1, text.count("\n") + 2))
    for m in LINK.finditer(visible):
        number = visible.count("\n", 0, m.start()) + 1
        target = m.group(1)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):
            continue  # http:, https:, mailto:
        file_part, _, fragment = target.partition("#")
        if file_part:
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if os.path.commonpath([resolved, root]) != root:
                problems.append(f"{rel}:{number}: {target} points outside the repository")
                continue
            if not os.path.exists(resolved):
                problems.append(f"{rel}:{number}: {target}: no such file")
                continue
        else:
            resolved = path
        if fragment and resolved.endswith(".md") and fragment not in anchors(resolved):
            problems.append(f"{rel}:{number}: {target}: no heading with that anchor")
    return problems


def tracked_markdown(root):
    out = subprocess.run(["git", "ls-files", "*.md"], cwd=root, check=True,
                         capture_output=True, text=True).stdout
    return [os.path.join(root, p) for p in out.split()]


def self_test():
    """The checker must pass good links and name every bad one."""
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.realpath(os.path.join(tmp, "repo"))
        os.makedirs(os.path.join(root, "docs"))
        with open(os.path.join(root, "docs", "b.md"), "w") as f:
            f.write("# B\n\n## The store's `keys`\n\n## Repeat\n\n## Repeat\n")
        with open(os.path.join(root, "a.md"), "w") as f:
            f.write("\n".join([
                "# Top", "",
                "[ok](docs/b.md) [ok](docs/b.md#the-stores-keys) [ok](docs/b.md#repeat-1)",
                "[ok](#top) [ok](https://example.com/x#y) [ok](mailto:x@example.com)",
                "`[not a link](nowhere.md)`",
                "```", "[not a link](nowhere.md)", "```",
                "[bad](docs/c.md)",
                "[bad](docs/b.md#repeat-2)",
                "[bad](#nothing)",
                "[bad](../outside.md)",
                "a link whose [text",
                "wraps](#nowhere) over lines",
            ]) + "\n")
        got = check(os.path.join(root, "a.md"), root)
    want = [
        "a.md:9: docs/c.md: no such file",
        "a.md:10: docs/b.md#repeat-2: no heading with that anchor",
        "a.md:11: #nothing: no heading with that anchor",
        "a.md:12: ../outside.md points outside the repository",
        "a.md:13: #nowhere: no heading with that anchor",
    ]
    if got != want:
        print(f"check_docs self-test failed:\n  got  {got!r}\n  want {want!r}", file=sys.stderr)
        return 1
    print("check_docs self-test: ok (5 broken links found, 6 good ones passed)")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    root = os.path.realpath(ROOT)
    files = [os.path.realpath(p) for p in argv] or tracked_markdown(root)
    problems = [p for path in files for p in check(path, root)]
    for p in problems:
        print(p, file=sys.stderr)
    print(f"check_docs: {len(files)} Markdown files, {len(problems)} broken links")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
