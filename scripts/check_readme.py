#!/usr/bin/env python3
"""Runs the README's command blocks as pasted, and lints the ones that cannot run here.

Every fenced block of README.md is classified by the HTML comment on the line right above it:

    <!-- readme: demo -->           a command that keeps serving (`toolgate demo`): started in the
                                    background when its turn comes, stopped at the end
    <!-- readme: run -->            run as pasted, in order: shell blocks in one bash session
                                    (`set -eo pipefail`, so variables carry from block to block and
                                    any failing command fails the block), a `js` block with `node`
    <!-- readme: run if helm -->    run when `helm` is on PATH, else linted
    <!-- readme: lint -->           not run here (installs, a cluster, a long test): `bash -n`, every
                                    repository path it names exists, every `toolgate` command and
                                    flag it uses exists
    <!-- readme: values FILE -->    a Helm values file (`yaml`): written as FILE for the blocks after
                                    it, its top-level `config:` checked with `toolgate check`
    <!-- example: NAME -->          a `python` block: run by clients/python/tests/test_readme.py

A `run` comment may span lines and carry `expect: TEXT` lines: the block's output must contain
each TEXT. Shell (`sh`, `bash`, `shell`, `console`), `js` and `python` blocks must be classified;
an unclassified one fails the check. Other blocks (`yaml`, `text`) are prose unless marked.

The blocks run in a scratch directory that mirrors the repository root (its tracked top-level
directories linked, its top-level files copied), so what they write stays out of the checkout,
with `toolgate` on PATH: the binary under test. The demo's ports are fixed (15001, 15002, 15090),
as the blocks name them: they must be free.

    scripts/check_readme.py [--toolgate PATH] [README]   PATH: $TOOLGATE_BIN, else target/debug/toolgate
    scripts/check_readme.py --self-test                  check the classifier and the lint on a sample

The `js` blocks import `@toolgate/client` from clients/typescript/dist (`npm run build` there).
Exit 0 when every block passes, 1 with one `README.md:LINE: problem` line per failure.
"""

import argparse
import glob
import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHELL_LANGS = {"sh", "bash", "shell", "console"}
FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")
MARKER = re.compile(r"^<!--\s*(readme|example):\s*(.*?)\s*(-->)?$")
DEMO_PORTS = [("127.0.0.1", 15001), ("127.0.0.1", 15002), ("0.0.0.0", 15090)]
DEMO_ADMIN_URL = "http://127.0.0.1:15002/"
DEMO_READY_SECONDS = 60
BLOCK_SECONDS = 120
SEPARATORS = {"&&", "||", "|", ";", "(", ")", "&", "$(", "`"}


class Block:
    """One fenced block: where it opens, its language, its text and how it is classified."""

    def __init__(self, line, lang, text):
        self.line, self.lang, self.text = line, lang, text
        self.kind = None  # demo, run, run-if-helm, lint, values, example
        self.arg = ""  # the values file name, or the example's name
        self.expect = []


def blocks_of(text):
    """The fenced blocks of a Markdown text, each with the comment right above it read."""
    lines = text.split("\n")
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start = m.group(1), i
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        block = Block(start + 1, m.group(2).lower(), "\n".join(body) + "\n")
        read_marker(block, lines, start)
        found.append(block)
        i += 1
    return found


def read_marker(block, lines, fence_index):
    """Fills in the block's kind from the comment ending on the line above the fence."""
    end = fence_index - 1
    if end < 0 or not lines[end].rstrip().endswith("-->"):
        return
    start = end
    while start >= 0 and not lines[start].lstrip().startswith("<!--"):
        start -= 1
    if start < 0:
        return
    comment = [ln.strip() for ln in lines[start:end + 1]]
    m = MARKER.match(comment[0])
    if not m:
        return
    family, head = m.group(1), m.group(2).removesuffix("-->").strip()
    block.expect = [ln.removeprefix("expect:").strip() for ln in comment[1:] if ln.startswith("expect:")]
    if family == "example":
        block.kind, block.arg = "example", head
    elif head == "run if helm":
        block.kind = "run-if-helm"
    elif head.startswith("values"):
        block.kind, block.arg = "values", head.removeprefix("values").strip()
    else:
        block.kind = head


def classify(blocks):
    """The classification problems, as (line, message); an empty list when every block is marked."""
    problems = []
    for b in blocks:
        lang = b.lang or "(none)"
        if b.kind is None:
            if b.lang in SHELL_LANGS or b.lang == "js":
                problems.append((b.line, f"```{lang} block has no `<!-- readme: run|lint|demo -->` "
                                         "comment right above it"))
            elif b.lang == "python":
                problems.append((b.line, "```python block has no `<!-- example: NAME -->` comment right "
                                         "above it (clients/python/tests/test_readme.py runs those)"))
            continue
        allowed = {
            "demo": SHELL_LANGS, "lint": SHELL_LANGS, "run-if-helm": SHELL_LANGS,
            "run": SHELL_LANGS | {"js"}, "values": {"yaml"}, "example": {"python"},
        }.get(b.kind)
        if allowed is None:
            problems.append((b.line, f"unknown classification {b.kind!r} (demo, run, run if helm, "
                                     "lint, values FILE)"))
        elif b.lang not in allowed:
            problems.append((b.line, f"a `{b.kind}` comment above a ```{lang} block"))
        elif b.kind == "values" and not re.fullmatch(r"[\w.-]+", b.arg):
            problems.append((b.line, f"`values` needs a plain file name, not {b.arg!r}"))
        if b.expect and b.kind not in ("run", "run-if-helm"):
            problems.append((b.line, "`expect:` is only read on a `run` block"))
    if sum(b.kind == "demo" for b in blocks) > 1:
        problems.append((blocks[0].line, "more than one `demo` block"))
    return problems


# ---- lint ------------------------------------------------------------------------------------


def commands_of(block):
    """The shell text of a block: a console block's `$ ` lines (and their continuations)."""
    if block.lang != "console":
        return block.text
    out, going_on = [], False
    for line in block.text.split("\n"):
        if line.startswith("$ ") or going_on:
            out.append(line[2:] if line.startswith("$ ") and not going_on else line)
            going_on = line.endswith("\\")
    return "\n".join(out) + "\n"


def logical_lines(text):
    """Lines with backslash continuations joined, each with the number of its first line."""
    out, pending, first = [], "", 0
    for n, line in enumerate(text.split("\n")):
        if not pending:
            first = n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((first, pending + line))
        pending = ""
    return out


def words(line):
    lexer = shlex.shlex(line, posix=True, punctuation_chars="&|;()<>")
    lexer.whitespace_split = True
    lexer.commentors = "#"
    return list(lexer)


def tracked_top_level(root):
    try:
        out = subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True,
                             text=True).stdout
        return {p.split("/", 1)[0] for p in out.split()}
    except (OSError, subprocess.CalledProcessError):
        return set(os.listdir(root)) - {".git", "target"}


def repo_path(word, top):
    """The repository path a word names, or None: a relative path whose first part is tracked."""
    if "=" in word and word.startswith("-"):
        word = word.split("=", 1)[1]
    if not word or "$" in word or "://" in word or word[0] in "/~-'\"" or "/" not in word:
        return None
    word = re.sub(r"\[[^\]]*\]$", "", word.removeprefix("./"))  # pip extras: ./pkg[extra]
    return word if word.split("/", 1)[0] in top else None


def toolgate_help(binary):
    """{subcommand: set of flags} from the binary's own --help."""
    def run(*args):
        return subprocess.run([binary, *args], capture_output=True, text=True, timeout=30).stdout

    top = run("--help")
    subs = re.findall(r"^  ([a-z][\w-]*)\s", top.split("Commands:", 1)[-1].split("Options:")[0], re.M)
    spec = {"": {"--help", "-h", "--version", "-V"}}
    for sub in subs:
        flags = set(re.findall(r"^\s+(?:-\w, )?(--[\w-]+)", run(sub, "--help"), re.M))
        spec[sub] = flags | {"--help", "-h"}
    return spec


def toolgate_problems(tokens, spec):
    """What is wrong with the toolgate command lines among one logical line's words."""
    problems, command_start = [], True
    for i, tok in enumerate(tokens):
        if tok in SEPARATORS:
            command_start = True
            continue
        if command_start and re.fullmatch(r"[A-Za-z_]\w*=.*", tok):
            continue  # an environment assignment before the command
        args = None
        if command_start and os.path.basename(tok) == "toolgate":
            args = tokens[i + 1:]
        elif command_start and tokens[i:i + 2] == ["cargo", "run"] and "--" in tokens[i:]:
            args = tokens[tokens.index("--", i) + 1:]
        command_start = False
        if args is None:
            continue
        args = args[:next((k for k, a in enumerate(args) if a in SEPARATORS), len(args))]
        sub = "" if not args or args[0].startswith("-") else args[0]
        named = f"toolgate {sub}".strip()
        if sub not in spec:
            problems.append(f"`{named}`: no such command (toolgate --help)")
            continue
        for a in args[1 if sub else 0:]:
            flag = a.split("=", 1)[0]
            if flag.startswith("-") and flag not in spec[sub]:
                problems.append(f"`{named}`: no flag {flag} ({named} --help)")
    return problems


def lint(block, spec, root, top):
    """The lint problems of one shell block, as (line, message)."""
    text, problems = commands_of(block), []
    done = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    if done.returncode != 0:
        # bash numbers the block's lines from 1; the block's text starts on the line after the fence
        m = re.search(r"line (\d+):", done.stderr)
        where = block.line + int(m.group(1)) if m and block.lang != "console" else block.line
        why = " ".join(re.sub(r"^bash: (line \d+: )?", "", ln) for ln in done.stderr.strip().split("\n"))
        problems.append((where, f"bash -n: {why}"))
        return problems
    for offset, line in logical_lines(text):
        number = block.line + 1 + offset
        try:
            tokens = words(line)
        except ValueError as err:
            problems.append((number, f"cannot split into words: {err}"))
            continue
        for tok in tokens:
            path = repo_path(tok, top)
            if path and not exists(root, path):
                problems.append((number, f"{path}: no such file in the repository"))
        problems += [(number, p) for p in toolgate_problems(tokens, spec)]
    return problems


def exists(root, path):
    """Whether a repository path exists; a glob (`scripts/*.sh`) when it matches something."""
    if any(c in path for c in "*?["):
        return bool(glob.glob(os.path.join(root, path)))
    return os.path.lexists(os.path.join(root, path))


def values_config(block):
    """The `config:` subtree of a values block, dedented into a toolgate config; None if absent."""
    lines = block.text.split("\n")
    try:
        start = next(i for i, ln in enumerate(lines) if re.fullmatch(r"config:\s*(#.*)?", ln))
    except StopIteration:
        return None
    body = []
    for ln in lines[start + 1:]:
        if ln and not ln[0].isspace() and not ln.startswith("#"):
            break
        body.append(ln)
    indents = [len(ln) - len(ln.lstrip()) for ln in body if ln.strip() and not ln.lstrip().startswith("#")]
    cut = min(indents, default=0)
    return "\n".join(ln[cut:] if ln[:cut].isspace() else ln.lstrip() for ln in body) + "\n"


# ---- run -------------------------------------------------------------------------------------


def port_taken(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def stop(proc):
    """SIGTERM to the process group, SIGKILL after 15 s."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


class Session:
    """One bash process, fed the run blocks one at a time, so that shell variables carry over."""

    def __init__(self, cwd, env):
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=cwd, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, start_new_session=True)
        self.lines = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.send("set -eo pipefail\n")

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def send(self, text):
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def run(self, script_path, token):
        """Runs a script file in the session; (ok, output, why)."""
        self.send(f"source {shlex.quote(script_path)} </dev/null\nprintf '\\n%s\\n' {token}\n")
        out, deadline = [], time.monotonic() + BLOCK_SECONDS
        while True:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                return False, "".join(out), f"still running after {BLOCK_SECONDS}s"
            if line is None:
                self.proc.wait()
                return False, "".join(out), f"a command failed (the shell exited {self.proc.returncode})"
            if line.strip() == token:
                return True, "".join(out).removesuffix("\n"), ""
            out.append(line)

    def close(self):
        if self.proc.poll() is None:
            try:
                self.send("exit 0\n")
                self.proc.wait(timeout=5)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                pass
        stop(self.proc)


def mirror(root, scratch):
    """The scratch directory as the repository root: tracked directories linked, files copied."""
    for name in sorted(tracked_top_level(root)):
        src = os.path.join(root, name)
        if os.path.isdir(src):
            os.symlink(src, os.path.join(scratch, name))
        elif os.path.isfile(src):
            shutil.copy(src, os.path.join(scratch, name))


def ts_project(root, project):
    """Makes a project directory whose node_modules/@toolgate/client is clients/typescript as
    built (its dist/), as `npm install` of the packed package would."""
    package = os.path.join(root, "clients", "typescript")
    dist = os.path.join(package, "dist")
    if not os.path.isfile(os.path.join(dist, "index.js")):
        raise RuntimeError("clients/typescript/dist/index.js is missing: build the package "
                           "(cd clients/typescript && npm ci && npm run build)")
    client = os.path.join(project, "node_modules", "@toolgate", "client")
    os.makedirs(client)
    with open(os.path.join(project, "package.json"), "w") as f:
        f.write('{ "private": true, "type": "module" }\n')
    with open(os.path.join(package, "package.json")) as f:
        manifest = json.load(f)
    keep = {k: manifest[k] for k in ("name", "version", "type", "exports", "main", "types") if k in manifest}
    with open(os.path.join(client, "package.json"), "w") as f:
        json.dump(keep, f)
    os.symlink(dist, os.path.join(client, "dist"))


def start_demo(block, scratch, env, log_path):
    busy = [f"{h}:{p}" for h, p in DEMO_PORTS if port_taken(h, p)]
    if busy:
        raise RuntimeError(f"the demo needs {', '.join(busy)}, which something else listens on "
                           "(another `toolgate demo`?): stop it and run the check again")
    log = open(log_path, "wb")
    proc = subprocess.Popen(["bash", "-c", block.text], cwd=scratch, env=env, stdin=subprocess.DEVNULL,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    deadline = time.monotonic() + DEMO_READY_SECONDS
    while True:
        if proc.poll() is not None:
            with open(log_path, errors="replace") as f:
                raise RuntimeError(f"the demo exited with {proc.returncode}:\n{f.read()}")
        try:
            urllib.request.urlopen(DEMO_ADMIN_URL, timeout=2).close()
            return proc
        except urllib.error.HTTPError:
            return proc  # any answer (a 401 without a token): the admin listener serves
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"the demo did not answer on {DEMO_ADMIN_URL} within {DEMO_READY_SECONDS}s")
        time.sleep(0.1)


def indent(text, prefix="    | "):
    if not text.strip():
        return prefix + "(nothing)"
    return "\n".join(prefix + ln for ln in text.rstrip("\n").split("\n"))


def check(readme, binary):
    with open(readme, encoding="utf-8") as f:
        blocks = blocks_of(f.read())
    name = os.path.relpath(readme, ROOT) if readme.startswith(ROOT) else readme
    problems = classify(blocks)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        problems.append((0, f"{binary}: no toolgate binary (cargo build --bin toolgate, or TOOLGATE_BIN)"))
    if problems:
        return report(name, problems, blocks, ran=0, linted=0)
    spec = toolgate_help(binary)
    top = tracked_top_level(ROOT)
    have_helm = shutil.which("helm") is not None
    counts = {"run": 0, "lint": 0}
    scratch = tempfile.mkdtemp(prefix="check-readme-")
    work = os.path.join(scratch, ".check-readme")
    os.makedirs(work)
    bindir = os.path.join(work, "bin")
    os.makedirs(bindir)
    os.symlink(os.path.abspath(binary), os.path.join(bindir, "toolgate"))
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("NODE_TEST_CONTEXT", None)
    mirror(ROOT, scratch)
    demo = session = None
    failed_run = None  # the line of a run block that failed: the run blocks after it are skipped
    try:
        for b in blocks:
            if b.kind == "lint" or (b.kind == "run-if-helm" and not have_helm):
                problems += lint(b, spec, ROOT, top)
                counts["lint"] += 1
                if b.kind == "run-if-helm":
                    print(f"{name}:{b.line}: helm is not installed: linted, not run")
            elif b.kind == "values":
                problems += check_values(b, scratch, work, binary)
            elif b.kind == "demo":
                problems += lint(b, spec, ROOT, top)
                try:
                    demo = start_demo(b, scratch, env, os.path.join(work, "demo.log"))
                    print(f"{name}:{b.line}: demo started")
                except RuntimeError as err:
                    problems.append((b.line, str(err)))
                    failed_run = b.line
            elif b.kind in ("run", "run-if-helm") and failed_run is not None:
                print(f"{name}:{b.line}: not run: the block at line {failed_run} failed")
            elif b.kind in ("run", "run-if-helm"):
                if session is None:
                    session = Session(scratch, env)
                try:
                    path = script_for(b, work)
                except RuntimeError as err:
                    problems.append((b.line, str(err)))
                    failed_run = b.line
                    continue
                ok, out, why = session.run(path, f"@@check-readme-{b.line}-done@@")
                counts["run"] += 1
                missing = [e for e in b.expect if e not in out]
                if not ok:
                    problems.append((b.line, f"```{b.lang} block: {why}; its output:\n{indent(out)}"))
                    failed_run = b.line
                elif missing:
                    problems.append((b.line, f"```{b.lang} block did not print {missing}; its output:\n"
                                             f"{indent(out)}"))
                else:
                    print(f"{name}:{b.line}: ran ```{b.lang} block, ok")
    finally:
        if session is not None:
            session.close()
        stop(demo)
        shutil.rmtree(scratch, ignore_errors=True)
    return report(name, problems, blocks, counts["run"], counts["lint"])


def script_for(block, work):
    """The shell script that runs a block as pasted: the block itself, or `node` on a js block
    saved in a project that has `@toolgate/client`."""
    if block.lang == "js":
        project = os.path.join(work, "ts")
        if not os.path.isdir(project):
            ts_project(ROOT, project)
        script = os.path.join(project, f"block-{block.line}.mjs")
        with open(script, "w") as f:
            f.write(block.text)
        text = f"(cd {shlex.quote(project)} && node {shlex.quote(script)})\n"
    else:
        text = commands_of(block)
    path = os.path.join(work, f"block-{block.line}.sh")
    with open(path, "w") as f:
        f.write(text)
    return path


def check_values(block, scratch, work, binary):
    with open(os.path.join(scratch, block.arg), "w") as f:
        f.write(block.text)
    config = values_config(block)
    if config is None or not config.strip():
        return [(block.line, "a values block without a top-level `config:` mapping")]
    path = os.path.join(work, f"values-{block.line}-config.yaml")
    with open(path, "w") as f:
        f.write(config)
    done = subprocess.run([binary, "check", "--config", path], capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip() or done.stdout.strip()
        return [(block.line, f"its config: refused by toolgate check: {why}")]
    return []


def report(name, problems, blocks, ran, linted):
    for line, message in problems:
        print(f"{name}:{line}: {message}", file=sys.stderr)
    python = sum(b.kind == "example" for b in blocks)
    print(f"check_readme: {len(blocks)} blocks, {ran} run, {linted} linted, {python} python "
          f"(clients/python/tests/test_readme.py); {len(problems)} failed")
    return 1 if problems else 0


# ---- self-test -------------------------------------------------------------------------------

SAMPLE = """# Sample

```text
a diagram: prose
```

<!-- readme: lint -->
```sh
cargo install --locked --path .
toolgate check --config deploy/x.yaml   # a good one
```

```sh
echo unmarked
```

<!-- readme: lint -->
```sh
toolgate serve --config deploy/nowhere.yaml
toolgate check --confg deploy/x.yaml
helm install toolgate charts/none \\
  -f my-values.yaml
TOOLGATE_ADMIN_TOKEN=t toolgate launch
if then
```

<!-- readme: lint -->
```console
$ toolgate check --config deploy/x.yaml
deploy/x.yaml: ok
$ pip install './deploy[extra]' && ls deploy/*.yaml
```

<!-- readme: run
expect: "status":"READY"
expect: valid: run
-->
```js
console.log("run with node")
```

<!-- readme: runn -->
```bash
true
```

```python
print("no example comment")
```

<!-- example: quickstart -->
```python
print("run by the SDK's test")
```

<!-- readme: values my-values.yaml -->
```yaml
image: {tag: x}
config:
  # the sidecar's toolgate.yaml
  tools:
    - name: search
rest: 1
```

<!-- readme: demo -->
```yaml
store: {}
```
"""


def self_test():
    blocks = blocks_of(SAMPLE)
    kinds = [(b.line, b.lang, b.kind) for b in blocks]
    want_kinds = [(3, "text", None), (8, "sh", "lint"), (13, "sh", None), (18, "sh", "lint"),
                  (28, "console", "lint"), (38, "js", "run"), (43, "bash", "runn"),
                  (47, "python", None), (52, "python", "example"), (57, "yaml", "values"),
                  (67, "yaml", "demo")]
    got_classes = classify(blocks)
    want_classes = [
        (13, "```sh block has no `<!-- readme: run|lint|demo -->` comment right above it"),
        (43, "unknown classification 'runn' (demo, run, run if helm, lint, values FILE)"),
        (47, "```python block has no `<!-- example: NAME -->` comment right above it "
             "(clients/python/tests/test_readme.py runs those)"),
        (67, "a `demo` comment above a ```yaml block"),
    ]
    with tempfile.TemporaryDirectory() as root:
        os.makedirs(os.path.join(root, "deploy"))
        os.makedirs(os.path.join(root, "charts", "toolgate"))
        open(os.path.join(root, "deploy", "x.yaml"), "w").close()
        top = {"deploy", "charts"}
        spec = {"": {"--help", "-h"}, "check": {"--config", "--help"}, "serve": {"--config", "--help"}}
        got_lint = []
        for b in blocks:
            if b.kind == "lint":
                got_lint += lint(b, spec, root, top)
        syntax = [b for b in blocks if b.line == 18][0]
        syntax.text = "\n".join(syntax.text.split("\n")[:-2]) + "\n"  # without `if then`: the rest
        got_lint_rest = lint(syntax, spec, root, top)
    want_lint = [(24, "bash -n")]  # the whole block refused, `if then` is a syntax error
    want_rest = [
        (19, "deploy/nowhere.yaml: no such file in the repository"),
        (20, "`toolgate check`: no flag --confg (toolgate check --help)"),
        (21, "charts/none: no such file in the repository"),
        (23, "`toolgate launch`: no such command (toolgate --help)"),
    ]
    got_lint_heads = [(ln, msg.split(":")[0]) for ln, msg in got_lint]
    values = values_config([b for b in blocks if b.kind == "values"][0])
    want_values = "# the sidecar's toolgate.yaml\ntools:\n  - name: search\n"
    js = [b for b in blocks if b.lang == "js"][0]
    checks = [
        ("blocks and their classes", kinds, want_kinds),
        ("classification problems", got_classes, want_classes),
        ("lint problems", got_lint_heads, want_lint),
        ("lint problems without the syntax error", got_lint_rest, want_rest),
        ("a values block's config", values, want_values),
        ("a run block's expect lines", js.expect, ['"status":"READY"', "valid: run"]),
        ("a console block's commands", commands_of(blocks[4]),
         "toolgate check --config deploy/x.yaml\npip install './deploy[extra]' && ls deploy/*.yaml\n"),
    ]
    failed = [(what, got, want) for what, got, want in checks if got != want]
    for what, got, want in failed:
        print(f"check_readme self-test failed: {what}:\n  got  {got!r}\n  want {want!r}", file=sys.stderr)
    if failed:
        return 1
    print(f"check_readme self-test: ok ({len(blocks)} blocks classified, {len(want_classes)} badly "
          f"classified found, {len(want_lint) + len(want_rest)} lint problems found, the good lines passed)")
    return 0


def main(argv):
    if argv == ["--self-test"]:
        return self_test()
    parser = argparse.ArgumentParser(description="Run or lint every command block of the README.")
    parser.add_argument("--toolgate", default=os.environ.get("TOOLGATE_BIN") or
                        os.path.join(ROOT, "target", "debug", "toolgate"),
                        help="the toolgate binary (default: $TOOLGATE_BIN, else target/debug/toolgate)")
    parser.add_argument("readme", nargs="?", default=os.path.join(ROOT, "README.md"))
    args = parser.parse_args(argv)
    return check(os.path.abspath(args.readme), args.toolgate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
