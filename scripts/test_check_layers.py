"""Unit tests of check_layers.py: `python3 -m unittest discover -s scripts` (run by `make lint`)."""

import contextlib
import io
import os
import unittest

import check_layers as cl


class Blank(unittest.TestCase):
    def test_comments_and_literals_go_lines_stay(self):
        text = ('let s = "crate::a"; // crate::b\n'
                "/* crate::c /* nested crate::d */ still */ let r = r#\"crate::e \"# ;\n"
                "let b = b\"crate::f\"; let c = '\"'; let e = '\\''; fn f<'a>(x: &'a crate::g::T) {}\n"
                "/// crate::h\n//! crate::i\nlet u = '\\u{1F600}'; crate::j::k();\n")
        out = cl.blank(text)
        self.assertEqual(len(out), len(text))
        self.assertEqual(out.count("\n"), text.count("\n"))
        self.assertEqual(cl.PATH.findall(out), [("crate", "::g::T"), ("crate", "::j::k")])

    def test_an_identifier_ending_in_b_or_r_starts_no_literal(self):
        out = cl.blank('let rb = 1; let br = crate::x; let s = b"crate::y";')
        self.assertEqual([m.group(2) for m in cl.PATH.finditer(out)], ["::x"])


class UsePaths(unittest.TestCase):
    def test_trees(self):
        self.assertEqual(cl.use_paths("crate::a::{b, c::{d as e, self}, f::*}"),
                         [["crate", "a", "b"], ["crate", "a", "c", "d"], ["crate", "a", "c"],
                          ["crate", "a", "f"]])
        self.assertEqual(cl.use_paths("super::{\n    self,\n    x::Y,\n}"), [["super"], ["super", "x", "Y"]])
        self.assertEqual(cl.use_paths("::std::io"), [["std", "io"]])
        self.assertEqual(cl.use_paths("super::*"), [["super"]])


class References(unittest.TestCase):
    def targets(self, rel, text):
        return [(r.line, r.here, r.target, r.test) for r in cl.references(rel, text)]

    def test_super_counts_inline_modules(self):
        text = ("use super::pod::Pod;\n"
                "#[cfg(test)]\nmod tests {\n    use super::*;\n    use super::super::pod::X;\n}\n"
                "mod inner { fn f() { super::super::review::g(); } }\n")
        self.assertEqual(self.targets("injector/review.rs", text), [
            (1, ("injector", "review"), ("injector", "pod", "Pod"), False),
            (4, ("injector", "review", "tests"), ("injector", "review"), True),
            (5, ("injector", "review", "tests"), ("injector", "pod", "X"), True),
            (7, ("injector", "review", "inner"), ("injector", "review", "g"), False),
        ])

    def test_declared_children_resolve_in_use_only(self):
        text = "mod pool;\nuse pool::Connections;\nuse hyper::Uri;\nfn f() { pool::take(); }\n"
        self.assertEqual(self.targets("call/upstream/mod.rs", text),
                         [(2, ("call", "upstream"), ("call", "upstream", "pool", "Connections"), False)])

    def test_main_names_the_crate(self):
        text = "use toolgate::config::{self, Config};\nmod cli;\nuse crate::cli::Args;\n" \
               "fn main() { toolgate::log::init(); }\n"
        self.assertEqual(self.targets("main.rs", text), [
            (1, "main", ("config",), False), (1, "main", ("config", "Config"), False),
            (4, "main", ("log", "init"), False)])

    def test_file_modules(self):
        self.assertEqual(cl.file_module("lib.rs"), ())
        self.assertIsNone(cl.file_module("main.rs"))
        self.assertEqual(cl.file_module("call/mod.rs"), ("call",))
        self.assertEqual(cl.file_module("call/upstream/mcp.rs"), ("call", "upstream", "mcp"))
        self.assertEqual(cl.file_module("ids.rs"), ("ids",))


class Rules(unittest.TestCase):
    @staticmethod
    def edges(*pairs, test=False):
        return {(a, b): [cl.Ref(f"{a}.rs", i + 1, (a,), (b,), test)] for i, (a, b) in enumerate(pairs)}

    def test_layers(self):
        layers = [{"ids", "clock"}, {"config"}, {"call"}]
        edges = self.edges(("config", "ids"), ("call", "config"), ("config", "call"), ("ids", "clock"),
                           ("clock", "ids"), ("call", "mystery"), ("ids", "lib"), ("main", "call"))
        self.assertEqual(cl.layer_violations(edges, layers, {("clock", "ids")}), [
            "src/call.rs:6: call → mystery: module mystery is in no layer (add it to LAYERS)",
            "src/config.rs:3: config → call: config (layer 2) may not use call (layer 3), a layer above it",
            "src/ids.rs:4: ids → clock: ids and clock share layer 1 and this edge is not in SAME_LAYER",
            "src/ids.rs:7: ids → the crate root: ids may not use an item of src/lib.rs, which is above "
            "every layer",
        ])

    def test_cycles_cover_every_edge_that_closes_a_loop(self):
        edges = self.edges(("a", "b"), ("b", "a"), ("b", "c"), ("c", "a"), ("c", "d"), ("d", "e"))
        self.assertEqual(cl.cycles({"a", "b", "c", "d", "e"}, edges),
                         [["a", "b", "a"], ["a", "b", "c", "a"]])
        self.assertEqual(cl.cycles({"d", "e"}, self.edges(("d", "e"))), [])

    def test_a_test_only_edge_says_so(self):
        self.assertEqual(cl.place(self.edges(("a", "b"), test=True)[("a", "b")]),
                         "src/a.rs:1 (tests only)")

    def test_self_test_passes(self):
        with contextlib.redirect_stdout(io.StringIO()):
            self.assertEqual(cl.self_test(), 0)


class TheCrate(unittest.TestCase):
    def test_every_top_level_module_has_one_layer(self):
        files = cl.read_crate(os.path.join(cl.ROOT, "src"))
        tops = cl.children(files, ())
        placed = [m for layer in cl.LAYERS for m in layer]
        self.assertEqual(sorted(placed), sorted(set(placed)), "a module in two layers")
        self.assertEqual(sorted(tops - set(placed)), [], "modules of src/ in no layer")
        self.assertEqual(sorted(set(placed) - tops), [], "LAYERS names modules src/ does not have")
        for a, b in cl.SAME_LAYER:
            self.assertEqual(cl.layer_of(a, cl.LAYERS), cl.layer_of(b, cl.LAYERS), (a, b))


if __name__ == "__main__":
    unittest.main()
