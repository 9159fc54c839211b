#!/usr/bin/env python3
"""Checks that the crate's modules keep their layering, offline (standard library only).

Every `src/**/*.rs` is read for the paths that name another module: `use` trees and paths in
code that start with `crate::`, `super::` or `self::` (`toolgate::` in src/main.rs). Comments,
doc comments, string and char literals are blanked first, so a comment that mentions
`crate::call` is no dependency. Two rules are checked:

  - the top-level modules (src/*.rs and src/*/) sit in the layers of LAYERS, lowest first: a
    module may use the modules of the layers below its own, and a module of its own layer only
    when SAME_LAYER lists that edge; and no cycle among top-level modules (a loop always has an
    edge that does not go down: an upward one is named as such, and a loop of SAME_LAYER edges
    is named as a cycle);
  - inside src/call/ and each directory module below it (src/call/upstream/, …), no import
    cycle between sibling submodules. The parent (mod.rs) may use its children, and a child may
    use its parent (`super::X` for an item of mod.rs is an edge to mod.rs), but siblings must
    not depend on each other both ways, directly or around a loop.

    scripts/check_layers.py              check src/
    scripts/check_layers.py --graph      print the top-level module graph and each edge's first use
    scripts/check_layers.py --src DIR    check another tree (a checkout of src/)
    scripts/check_layers.py --self-test  check the checker on small inline crates

Exit 0 with a one-line summary when both rules hold, 1 with one `file:line: edge: rule` line per
violation.
"""

import bisect
import os
import re
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The intended layering, lowest first. src/main.rs and src/lib.rs are above every layer.
LAYERS = [
    {"ids", "clock", "body", "paths", "wake", "workers"},
    {"error", "compact", "log"},
    {"config"},
    {"evidence", "auth"},
    {"store"},
    {"metrics", "otel"},
    {"call"},
    {"listen"},
    {"demo", "injector"},
]
# Edges allowed inside one layer (from, to): a log line's strings are escaped with compact's scan
# for plain runs, the tokens hold the evidence keys derived from the run-token key, and the span
# exporter counts the spans it drops.
SAME_LAYER = {
    ("log", "compact"),
    ("auth", "evidence"),
    ("otel", "metrics"),
}
# The directory modules whose sibling submodules must not form an import cycle: these and every
# directory module below them.
CALL_TREE = [("call",)]

# The crate root as main.rs names it.
CRATE_NAME = "toolgate"


# ----------------------------------------------------------------------------------------------
# Reading Rust.

RAW_STRING = re.compile(r'[bc]?r(#*)"')
CHAR = re.compile(r"'(?:\\(?:u\{[0-9a-fA-F]+\}|x[0-9a-fA-F]{2}|.)|[^\\'\n])'")

def blank(text):
    """The text with comments, string, byte-string, raw-string and char literals replaced by
    spaces (newlines kept), so offsets and line numbers stay those of the file."""
    out = list(text)
    i, n = 0, len(text)

    def wipe(a, b):
        for k in range(a, b):
            if out[k] != "\n":
                out[k] = " "

    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            wipe(i, j)
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
            wipe(i, j)
            i = j
        elif m := RAW_STRING.match(text, i):
            close = '"' + m.group(1)
            j = text.find(close, m.end())
            j = n if j < 0 else j + len(close)
            wipe(i, j)
            i = j
        elif c == '"' or (c in "bc" and text.startswith('"', i + 1)):
            j = i + (1 if c == '"' else 2)
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            wipe(i, min(j + 1, n))
            i = j + 1
        elif c == "'":
            # A char literal ('x', '\n', '\u{1F600}', b'x'), else a lifetime or a label.
            if m := CHAR.match(text, i):
                wipe(i, m.end())
                i = m.end()
            else:
                i += 1
        elif c.isalpha() or c == "_":
            # A whole identifier at once: the literals' prefixes (b, c, r) count only at its start.
            j = i + 1
            while j < n and (text[j].isalnum() or text[j] == "_"):
                j += 1
            i = j
        else:
            i += 1
    return "".join(out)


USE = re.compile(r"\buse\s+([^;]*);")
PATH = re.compile(r"(?<![\w:])(\$crate|crate|super|self|" + CRATE_NAME + r")((?:\s*::\s*\w+)+)")
MOD_OPEN = re.compile(r"\bmod\s+(\w+)\s*([{;])")


def use_paths(tree):
    """The full paths of a use tree (`a::{b, c::{d as e, self}}` → a::b, a::c::d, a::c), each a
    list of segments; `*` and aliases are dropped."""
    tree = re.sub(r"\s+", " ", tree).strip()
    if tree.startswith("::"):
        tree = tree[2:]
    out = []

    def split_top(s):
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
            else:
                cur += ch
        parts.append(cur)
        return [p.strip() for p in parts if p.strip()]

    def walk(prefix, s):
        brace = s.find("{")
        if brace < 0:
            segs = [x.strip() for x in re.sub(r"\s+as\s+\w+$", "", s).split("::") if x.strip()]
            if segs and segs[-1] == "*":
                segs = segs[:-1]
            if segs and segs[-1] == "self":
                segs = segs[:-1]
            out.append(prefix + segs)
            return
        head = [x.strip() for x in s[:brace].split("::") if x.strip()]
        inner = s[brace + 1:s.rfind("}")]
        for part in split_top(inner):
            walk(prefix + head, part)

    walk([], tree)
    return [p for p in out if p]


def file_module(rel):
    """The module path of a file under src/: lib.rs → (), call/mod.rs → (call,),
    call/upstream/mcp.rs → (call, upstream, mcp). None for main.rs (its own crate)."""
    parts = rel.replace(os.sep, "/").split("/")
    if parts == ["main.rs"]:
        return None
    if parts == ["lib.rs"]:
        return ()
    if parts[-1] == "mod.rs":
        parts = parts[:-1]
    else:
        parts[-1] = parts[-1][:-3]
    return tuple(parts)


class Ref:
    """One path in one file that names a module (or an item of one): where, from which module
    (`main` in src/main.rs), the absolute module path it names (the segments after the crate
    root), and whether it is test code (inside a `#[cfg(test)]` module)."""

    def __init__(self, rel, line, here, target, test):
        self.rel, self.line, self.here, self.target, self.test = rel, line, here, target, test

    def where(self):
        return f"src/{self.rel}:{self.line}"


TEST_ATTR = re.compile(r"#\[cfg\(test\)\]\s*(?:#\[[^\]]*\]\s*)*(?:pub(?:\([^)]*\))?\s+)?$")


def references(rel, text):
    """Every Ref of one file. Inline `mod x { … }` blocks count: `super` inside one is the file's
    own module. Paths with no crate, super or self anchor resolve only in `use` trees, against the
    child modules declared where the `use` is."""
    base = file_module(rel)
    is_main = base is None
    code = blank(text)
    line_at = _line_index(code)
    opens = {}  # offset of an inline module's `{` → (name, is a test module)
    declared = {}  # offset of a `mod` → its name, for the child modules of each scope
    for m in MOD_OPEN.finditer(code):
        declared[m.start()] = m.group(1)
        if m.group(2) == "{":
            opens[m.end() - 1] = (m.group(1), bool(TEST_ATTR.search(code[max(0, m.start() - 300):m.start()])))
    # (offset, module path, in test code) from that offset on.
    current = ((), False) if is_main else (base, False)
    scopes, stack, depth = [(0, *current)], [], 0
    for i, ch in enumerate(code):
        if ch == "{":
            depth += 1
            if i in opens:
                name, test = opens[i]
                stack.append((depth, current))
                current = (current[0] + (name,), current[1] or test)
                scopes.append((i, *current))
        elif ch == "}":
            if stack and stack[-1][0] == depth:
                current = stack.pop()[1]
                scopes.append((i, *current))
            depth -= 1
    starts = [at for at, _, _ in scopes]

    def scope_at(pos):
        _, here, test = scopes[bisect.bisect_right(starts, pos) - 1]
        return here, test

    children_of = {}
    for pos, name in declared.items():
        children_of.setdefault(scope_at(pos)[0], set()).add(name)

    def resolve(here, segs, in_use):
        head = segs[0]
        if is_main:
            return tuple(segs[1:]) if head == CRATE_NAME else None
        if head in ("crate", "$crate"):
            return tuple(segs[1:])
        if head in ("super", "self"):
            at, rest = list(here), list(segs)
            while rest and rest[0] in ("super", "self"):
                if rest.pop(0) == "super":
                    if not at:
                        return None
                    at.pop()
            return tuple(at + rest)
        if in_use and head in children_of.get(here, ()):
            return tuple(here) + tuple(segs)
        return None  # another crate, or a name brought in by a `use` read on its own

    refs, in_uses = [], []
    for m in USE.finditer(code):
        here, test = scope_at(m.start())
        for segs in use_paths(m.group(1)):
            target = resolve(here, segs, True)
            if target is not None:
                refs.append(Ref(rel, line_at(m.start()), "main" if is_main else here, target, test))
        in_uses.append((m.start(), m.end()))
    use_starts = [a for a, _ in in_uses]
    for m in PATH.finditer(code):
        k = bisect.bisect_right(use_starts, m.start()) - 1
        if k >= 0 and m.start() < in_uses[k][1]:
            continue  # read with its `use` tree
        here, test = scope_at(m.start())
        segs = [m.group(1)] + [s.strip() for s in m.group(2).split("::") if s.strip()]
        target = resolve(here, segs, False)
        if target is not None:
            refs.append(Ref(rel, line_at(m.start()), "main" if is_main else here, target, test))
    return refs


def _line_index(text):
    """pos → its line number (from 1)."""
    starts = [0] + [i + 1 for i, ch in enumerate(text) if ch == "\n"]
    return lambda pos: bisect.bisect_right(starts, pos)


def read_crate(src):
    """{path relative to src: text} of every .rs file under src."""
    files = {}
    for dirpath, dirnames, filenames in os.walk(src):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".rs"):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    files[os.path.relpath(path, src)] = f.read()
    return files


def children(files, parent):
    """The child modules of the module at `parent`: its files and directories under src."""
    out = set()
    for rel in files:
        mod = file_module(rel)
        if mod is not None and len(mod) > len(parent) and mod[:len(parent)] == parent:
            out.add(mod[len(parent)])
    return out


# ----------------------------------------------------------------------------------------------
# The graphs and the rules.

def top_level_edges(files):
    """{(from, to): [Ref, …]} between top-level modules; `main` and `lib` are src/main.rs and the
    crate root's own items."""
    tops = children(files, ())
    edges = {}
    for rel in sorted(files):
        for r in references(rel, files[rel]):
            src_mod = "main" if r.here == "main" else (r.here[0] if r.here else "lib")
            if not r.target:
                continue
            dst = r.target[0] if r.target[0] in tops else "lib"
            if dst != src_mod:
                edges.setdefault((src_mod, dst), []).append(r)
    return edges


def first_ref(refs):
    """An edge's first use in code, else its first use in tests."""
    return ([r for r in refs if not r.test] or refs)[0]


def place(refs):
    """Where an edge is first used, with `(tests only)` when only tests use it."""
    r = first_ref(refs)
    return r.where() + (" (tests only)" if r.test else "")


def layer_of(module, layers):
    for i, layer in enumerate(layers):
        if module in layer:
            return i
    return None


def layer_violations(edges, layers, same_layer):
    """One line per top-level edge that breaks the layering."""
    out = []
    for (a, b), refs in sorted(edges.items()):
        if a in ("main", "lib"):
            continue
        first = place(refs)
        more = f" (and {len(refs) - 1} more)" if len(refs) > 1 else ""
        la, lb = layer_of(a, layers), layer_of(b, layers)
        if b == "lib":
            out.append(f"{first}: {a} → the crate root: {a} may not use an item of src/lib.rs, which "
                       f"is above every layer{more}")
        elif la is None or lb is None:
            missing = a if la is None else b
            out.append(f"{first}: {a} → {b}: module {missing} is in no layer "
                       f"(add it to LAYERS){more}")
        elif lb > la:
            out.append(f"{first}: {a} → {b}: {a} (layer {la + 1}) may not use {b} "
                       f"(layer {lb + 1}), a layer above it{more}")
        elif lb == la and (a, b) not in same_layer:
            out.append(f"{first}: {a} → {b}: {a} and {b} share layer {la + 1} and this "
                       f"edge is not in SAME_LAYER{more}")
    return out


def cycles(nodes, edges):
    """The import cycles: for every edge inside a strongly connected component (Tarjan) of more
    than one node, the shortest cycle through it; each cycle once, as a list of nodes starting at
    its smallest and repeating it at the end. So every edge that closes a loop is shown."""
    index, low, on, stack, comps = {}, {}, set(), [], []
    succ = {n: sorted(b for (a, b) in edges if a == n) for n in nodes}

    def strong(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in succ.get(v, []):
            if w not in index:
                strong(w)
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
            if len(comp) > 1:
                comps.append(set(comp))

    for v in sorted(nodes):
        if v not in index:
            strong(v)

    def path(start, goal, comp):
        """A shortest path start → goal inside comp (breadth first), as a list of nodes."""
        prev, queue = {start: None}, [start]
        while queue:
            v = queue.pop(0)
            if v == goal:
                out = []
                while v is not None:
                    out.append(v)
                    v = prev[v]
                return out[::-1]
            for w in succ[v]:
                if w in comp and w not in prev:
                    prev[w] = v
                    queue.append(w)
        return None

    found = set()
    for comp in comps:
        for a in sorted(comp):
            for b in succ[a]:
                if b in comp:
                    loop = [a] + path(b, a, comp)[:-1]
                    k = loop.index(min(loop))
                    found.add(tuple(loop[k:] + loop[:k]))
    return sorted([*c, c[0]] for c in found)


def cycle_line(cycle, edges, name, rule):
    """One violation line for a cycle: the first edge's place, the loop, every edge's place."""
    steps = list(zip(cycle, cycle[1:], strict=False))
    places = ", ".join(f"{name(a)} → {name(b)} at {place(edges[(a, b)])}" for a, b in steps)
    loop = " → ".join(name(n) for n in cycle)
    return f"{first_ref(edges[steps[0]]).where()}: {loop}: {rule} ({places})"


def sibling_edges(files, parent):
    """{(from, to): [Ref, …]} between the children of the module at `parent`; a child's use of
    the parent's own items is an edge to "mod", the parent's use of a child one from "mod"."""
    kids = children(files, parent)
    edges = {}
    depth = len(parent)
    for rel in sorted(files):
        mod = file_module(rel)
        if mod is None or mod[:depth] != parent:
            continue
        for r in references(rel, files[rel]):
            if r.here == "main" or tuple(r.here[:depth]) != parent:
                continue
            if tuple(r.target[:depth]) != parent:
                continue
            a = r.here[depth] if len(r.here) > depth and r.here[depth] in kids else "mod"
            b = r.target[depth] if len(r.target) > depth and r.target[depth] in kids else "mod"
            if a != b:
                edges.setdefault((a, b), []).append(r)
    return edges


def directory_modules(files, roots):
    """Every directory module (one with a mod.rs) at or below each of roots."""
    out = set()
    for rel in files:
        mod = file_module(rel)
        if mod and rel.replace(os.sep, "/").endswith("/mod.rs"):
            if any(mod[:len(r)] == r for r in roots):
                out.add(mod)
    return sorted(out)


def check(files, layers=LAYERS, same_layer=SAME_LAYER, trees=CALL_TREE):
    """(violation lines, top-level edges, the directory modules whose siblings were checked)."""
    edges = top_level_edges(files)
    problems = layer_violations(edges, layers, same_layer)
    # A loop has an edge that does not go down; an upward one is named above, so what is left to
    # find are the loops made only of edges the layers allow: those of SAME_LAYER.
    allowed = {(a, b): refs for (a, b), refs in edges.items()
               if (a, b) in same_layer and layer_of(a, layers) is not None}
    nodes = {a for a, _ in allowed} | {b for _, b in allowed}
    for cyc in cycles(nodes, allowed):
        problems.append(cycle_line(cyc, allowed, str, "a cycle among top-level modules"))
    parents = directory_modules(files, trees)
    for parent in parents:
        sib = sibling_edges(files, parent)
        # A parent and its children may use each other: only the children's own loops count.
        kid_edges = {e: refs for e, refs in sib.items() if "mod" not in e}
        kid_nodes = {a for a, _ in kid_edges} | {b for _, b in kid_edges}
        prefix = "::".join(parent)
        for cyc in cycles(kid_nodes, kid_edges):
            problems.append(cycle_line(cyc, kid_edges, lambda n, p=prefix: f"{p}::{n}",
                                       f"an import cycle between sibling submodules of {prefix}"))
    return problems, edges, parents


def print_graph(edges, layers, files, parents):
    """Each top-level module's edges, lowest layer first, with the first use of each; then the
    edges between the submodules of each directory module checked for sibling cycles."""
    def rank(m):
        at = layer_of(m, layers)
        return (len(layers) + 1 if m in ("main", "lib") else (at if at is not None else len(layers)), m)

    nodes = sorted({a for a, _ in edges} | {b for _, b in edges}, key=rank)
    for a in nodes:
        outs = sorted(((b, refs) for (x, b), refs in edges.items() if x == a), key=lambda e: rank(e[0]))
        at = layer_of(a, layers)
        label = "top" if a in ("main", "lib") else (f"layer {at + 1}" if at is not None else "no layer")
        print(f"{a} ({label}) → " + (", ".join(b for b, _ in outs) or "nothing"))
        for b, refs in outs:
            print(f"    {b:10} {place(refs)}, {len(refs)} uses")
    for parent in parents:
        prefix = "::".join(parent)
        print(f"\nsubmodules of {prefix} (mod: {prefix}'s own mod.rs):")
        for (a, b), refs in sorted(sibling_edges(files, parent).items()):
            print(f"    {a:12} → {b:12} {place(refs)}, {len(refs)} uses")


# ----------------------------------------------------------------------------------------------
# Self-test.

SELF_TEST_LAYERS = [{"ids", "clock"}, {"config"}, {"call"}]
SELF_TEST_SAME_LAYER = {("clock", "ids"), ("ids", "clock")}
SELF_TEST_CRATE = {
    "lib.rs": "pub mod clock;\npub mod ids;\npub mod config;\npub mod call;\n",
    "main.rs": "use toolgate::call::run;\nfn main() { toolgate::config::load(); }\n",
    "clock.rs": "use crate::ids::Id;\n",
    "ids.rs": "//! Ids. See [`crate::call`] for their use.\n"
              "/// Not crate::config either.\npub struct Id;\n"
              "const DOC: &str = \"crate::call::x\";\n"
              "const RAW: &str = r#\"use crate::config;\"#;\n"
              "fn f<'a>(x: &'a str) -> char { /* crate::call /* nested */ */ '\"' }\n"
              "pub fn now() -> crate::clock::Instant { todo!() }\n",
    "config.rs": "use crate::ids::Id;\n"
                 "pub fn load() -> crate::call::State { todo!() }\n",
    "call/mod.rs": "pub mod a;\npub mod b;\npub mod c;\nuse crate::{config, ids::Id};\n"
                   "pub struct State;\n",
    "call/a.rs": "use super::b::B;\nuse super::State;\n",
    "call/b.rs": "use super::{a::A, State};\npub struct B;\n",
    "call/c.rs": "use crate::call::State;\n#[cfg(test)]\nmod tests {\n    use super::*;\n"
                 "    use super::super::a;\n}\n",
}


def self_test():
    """On a small crate: the downward and the allowed same-layer edges pass, the upward edge is
    named, so are a loop of same-layer edges and a loop of siblings, and nothing is read from
    comments or literals."""
    with tempfile.TemporaryDirectory() as tmp:
        for rel, text in SELF_TEST_CRATE.items():
            path = os.path.join(tmp, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        files = read_crate(tmp)
    problems, edges, parents = check(files, SELF_TEST_LAYERS, SELF_TEST_SAME_LAYER, [("call",)])
    want_edges = {("main", "call"), ("main", "config"), ("clock", "ids"), ("ids", "clock"),
                  ("config", "ids"), ("config", "call"), ("call", "config"), ("call", "ids")}
    want = [
        "src/config.rs:2: config → call: config (layer 2) may not use call (layer 3), a layer "
        "above it",
        "src/clock.rs:1: clock → ids → clock: a cycle among top-level modules (clock → ids at "
        "src/clock.rs:1, ids → clock at src/ids.rs:7)",
        "src/call/a.rs:1: call::a → call::b → call::a: an import cycle between sibling "
        "submodules of call (call::a → call::b at src/call/a.rs:1, call::b → call::a at "
        "src/call/b.rs:1)",
    ]
    bad = []
    if set(edges) != want_edges:
        bad.append(f"edges {sorted(edges)}, want {sorted(want_edges)}")
    if problems != want:
        bad.append("violations:\n    " + "\n    ".join(problems) + "\n  want\n    " + "\n    ".join(want))
    if parents != [("call",)]:
        bad.append(f"directory modules {parents}")
    # `super::super::a` in call/c.rs's `mod tests` is call::a: an edge, but no loop.
    if ("c", "a") not in sibling_edges(files, ("call",)):
        bad.append("`use super::super::a` inside call/c.rs's `mod tests` was not read as c → a")
    if bad:
        print("check_layers self-test failed:\n  " + "\n  ".join(bad), file=sys.stderr)
        return 1
    print(f"check_layers self-test: ok ({len(want_edges)} edges read, none from comments or "
          f"literals; an upward edge, a same-layer loop and a sibling loop found)")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    src = os.path.join(ROOT, "src")
    graph = False
    args = list(argv)
    while args:
        a = args.pop(0)
        if a == "--graph":
            graph = True
        elif a == "--src" and args:
            src = args.pop(0)
        else:
            print(__doc__, file=sys.stderr)
            return 64
    files = read_crate(src)
    problems, edges, parents = check(files)
    if graph:
        print_graph(edges, LAYERS, files, parents)
    for p in problems:
        print(p, file=sys.stderr)
    tops = sorted(children(files, ()))
    print(f"check_layers: {len(files)} files, {len(tops)} top-level modules in {len(LAYERS)} layers, "
          f"{len(edges)} edges; sibling cycles checked in {', '.join('::'.join(p) for p in parents)}: "
          f"{len(problems)} violations")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
