"""Unit tests of check_docs.py: `python3 -m unittest discover -s scripts` (run by `make lint`)."""

import contextlib
import io
import os
import tempfile
import unittest

import check_docs


class Slug(unittest.TestCase):
    def test_githubs_anchors(self):
        for heading, anchor in (
                ("The store's `keys`", "the-stores-keys"),
                ("Failure layers", "failure-layers"),
                ("[Links](x.md) in a heading", "links-in-a-heading"),
                ("A/B: (what) else?", "ab-what-else"),
                ("snake_case and-hyphens", "snake_case-and-hyphens"),
                ("  Trimmed  ", "trimmed")):
            with self.subTest(heading=heading):
                self.assertEqual(check_docs.slug(heading), anchor)


class LinesOutsideCode(unittest.TestCase):
    def test_fences_of_both_kinds_and_lengths(self):
        text = "a\n```rust\nb\n```\nc\n~~~~\nd\n~~~\ne\n~~~~\nf\n````\ng\n```\nh\n````\ni"
        # ~~~~ is closed only by ~~~~ or longer, ```` only by ```` or longer.
        self.assertEqual([line for _, line in check_docs.lines_outside_code(text)],
                         ["a", "c", "f", "i"])
        self.assertEqual([n for n, _ in check_docs.lines_outside_code(text)], [1, 5, 11, 17])


class Check(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.root = os.path.realpath(tmp.name)
        check_docs._ANCHORS.clear()
        self.addCleanup(check_docs._ANCHORS.clear)

    def write(self, rel, text):
        path = os.path.join(self.root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        return path

    def test_self_test_passes(self):
        with contextlib.redirect_stdout(io.StringIO()) as out:
            self.assertEqual(check_docs.self_test(), 0)
        self.assertIn("ok", out.getvalue())

    def test_images_titles_directories_and_files(self):
        self.write("docs/img/a.png", "")
        self.write("docs/ref.md", "# Ref\n\n# Ref\n")
        path = self.write("docs/page.md", "\n".join([
            "# Page",
            '![pic](img/a.png "a title") [dir](img) [up](../README.md)',
            "[ok](ref.md#ref-1) [bad](ref.md#ref-2) [not md](img/a.png#x)",
            "[bad](img/b.png) [ok](mailto:x@example.com)",
        ]) + "\n")
        self.write("README.md", "# Readme\n")
        self.assertEqual(check_docs.check(path, self.root), [
            "docs/page.md:3: ref.md#ref-2: no heading with that anchor",
            "docs/page.md:4: img/b.png: no such file",
        ])

    def test_a_heading_inside_a_fence_is_no_anchor(self):
        path = self.write("a.md", "# Real\n\n```\n# Fake\n```\n\n[x](#real) [y](#fake)\n")
        self.assertEqual(check_docs.check(path, self.root),
                         ["a.md:7: #fake: no heading with that anchor"])

    def test_main_checks_against_the_repository(self):
        # main() judges links from the repository's root: this page is in it, a file elsewhere
        # is not, so its relative link points outside.
        page = os.path.join(check_docs.ROOT, "docs", "architecture.md")
        bad = self.write("bad.md", "[sibling](other.md)\n")
        self.write("other.md", "# Other\n")
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
            self.assertEqual(check_docs.main([page]), 0)
            self.assertEqual(check_docs.main([page, bad]), 1)
        self.assertIn("other.md points outside the repository", err.getvalue())

if __name__ == "__main__":
    unittest.main()
