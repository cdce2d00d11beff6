"""Every fenced code block of README.md and docs/*.md, and how each kind runs.

The rule "docs stand alone": a reader can paste any block and it works. The docs tests
(tests/unit/test_docs_blocks.py, tests/integration/test_docs_cluster_blocks.py) collect
every block of every file found here, so a new file or block is covered without a word:

* ``python``: the file's python blocks run in document order in one namespace, as a
  reader pastes them into one interpreter (a block that uses a name defined above it
  works). A block of ``>>>`` lines is a REPL session: each statement runs alone, compiled
  as ``<stdin>`` line 1, and a shown ``Name: message`` line must be what it raises.
* ``bash``: every line is a command; ``console``: the ``$ `` lines are commands and the
  lines under one are its shown output, each of which must appear in what it printed
  (``PLACEHOLDERS`` says which parts of a shown line stand for any value). A command
  must exit 0. Shell commands run with a private run directory (``TRIPLANE_HOME``) and
  with ``python``, ``python3`` and ``triplane`` meaning this interpreter and checkout.
* ``js`` (or ``javascript``): the block is an ES module run alone by ``node`` (20 or later),
  in the shell commands' environment and working directory, where ``node_modules/triplane``
  is the checkout's sdk/js (as ``npm install sdk/js`` makes it); it must exit 0, and what
  it prints is echoed. A block that calls ``connect(`` runs with the integration module.
* ``go``: a whole Go program (``package main``) using the Go SDK: it is built and run
  (``go run``) in a module of its own that finds ``triplane`` in this checkout's
  ``sdk/go``, with the shell commands' environment (so ``triplane.Connect`` finds the
  cluster a block above started with ``triplane up``); it must exit 0, and what it prints
  is the test's output. Without a ``go`` tool the block fails, naming it (.ci/run
  installs Go).
* ``text`` (diagrams, trees, transcripts), ``json``, ``yaml``: data. json and yaml
  blocks must parse. Every block names its language; one that does not fails the tests.

A file whose blocks start a cluster or open sockets (``runs_processes``) runs in the
integration module; every other file runs in the unit module. ``SKIP`` is the named
allow-list of commands that are not run, each with its reason; ``KNOWN_FAILING`` lists
blocks that fail today, each with its error: such a block must keep failing (when it is
fixed, its entry goes).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LANGUAGES = ("python", "bash", "console", "go", "js", "javascript", "text", "json", "yaml")
GO_SDK = ROOT / "sdk" / "go"

# Commands not run, matched by their leading words (comments stripped, `&&` parts apart).
SKIP: dict[tuple[str, ...], str] = {
    ("python3", "-m", "pip", "install"): "installs packages: the tests run after CI installed this "
                                         "checkout with its extras (.ci/run)",
    ("bash", ".ci/run"): "is the CI itself: it runs these tests",
    ("triplane", "scheduler"): "a scheduler in the foreground, running until stopped (and this "
                               "one needs etcd and PostgreSQL): `triplane up` starts one in README.md",
    ("python", "tools/gen_grpc.py"): "rewrites the checked-in gRPC stubs: tests/unit/tools/test_gen_grpc.py "
                                     "runs it into a temporary directory and compares",
    ("python", "-m", "triplane.scheduler.cli"): "a scheduler in the foreground, running until "
                                                "stopped: `triplane up` starts one in README.md",
    ("triplane", "serve"): "a model server in the foreground, running until stopped: the python blocks "
                           "of docs/serving.md start one with tp.serve(block=False)",
    ("sudo",): "changes the machine (packages, users, /etc, services): docs/deploy.md's steps on real "
               "hosts; tests/multihost runs the same processes on network-namespace hosts",
    ("kubectl",): "needs a Kubernetes cluster: tests/integration/test_deploy.py validates the manifests",
    ("podman",): "needs a container builder and a registry: tests/integration/test_deploy.py lints "
                 "the Containerfile",
    ("TRIPLANE_URL=http://10.0.0.10:8470",): "docs/deploy.md's three machines: 10.0.0.10 exists only "
                                             "there (its program runs above on a local cluster)",
}

# (file, block number counting every fenced block of the file from 1) -> why it fails.
KNOWN_FAILING: dict[tuple[str, int], str] = {
}

# Values a command shows cut short, and what the test puts there instead.
FILL_IN: dict[str, str] = {
    "j3f0c...": "the id of the cluster's newest job, from `triplane status --json`",
}

# Files run with the integration module although no block starts a cluster, and why.
INTEGRATION_FILES: dict[str, str] = {
    "docs/executor.md": "its data-port block serves tiles on 127.0.0.1 (a socket: not a unit test)",
    "docs/network.md": "its blocks serve network engines on 127.0.0.1 (sockets: not a unit test)",
    "docs/serving.md": "its blocks serve a model over HTTP and gRPC on 127.0.0.1 (sockets: not a unit test)",
}

# Parts of a shown console output line that stand for any value: (regex, what it matches).
PLACEHOLDERS: tuple[tuple[str, str], ...] = (
    (r"\S*(\\\.){3}\S*", r"\S+"),                      # a value cut short: "Yc1m0...", "j3f0c..."
    (r"/home/me/\\\.triplane", "{home}"),            # the doc's run directory
    (r"127\\\.0\\\.0\\\.1:\d+", r"127\.0\.0\.1:\d+"),  # a free port
    (r"(\\ )+", r"\s+"),                               # column alignment
)


@dataclass(frozen=True)
class Block:
    path: str  # relative to ROOT
    number: int  # 1-based, counting every fenced block of the file
    lang: str
    line: int  # line of the opening fence
    code: str

    @property
    def name(self) -> str:
        return f"{self.path} block {self.number} (line {self.line}, {self.lang or 'no language'})"


def doc_files() -> list[str]:
    return ["README.md", *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))]


def blocks(path: str, root: Path = ROOT) -> list[Block]:
    """The fenced blocks of one file, in order. An unclosed fence raises ValueError."""
    found: list[Block] = []
    lines = (root / path).read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^( {0,3})(```+)\s*([^`\s]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3)
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == fence), None)
        if end is None:
            raise ValueError(f"{path}:{i + 1}: a code fence that is never closed")
        # Lines of an indented block lose the fence's indentation (as CommonMark reads them).
        code = "\n".join(re.sub(f"^ {{0,{indent}}}", "", ln) for ln in lines[i + 1:end])
        found.append(Block(path, len(found) + 1, lang, i + 1, code + "\n"))
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [b for path in doc_files() for b in blocks(path)]


# -- shell -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Command:
    line: str  # as written
    run: str | None  # what runs (None: skipped)
    skipped: tuple[str, ...]  # the reasons of the skipped parts
    shown: tuple[str, ...]  # console output lines shown under it


def commands(block: Block) -> list[Command]:
    """The commands of a bash or console block, with the SKIP list applied."""
    out: list[Command] = []
    pending: list[str] = []
    for raw in block.code.splitlines():
        if block.lang == "console" and not raw.startswith("$ "):
            if raw.strip() and out:
                c = out[-1]
                out[-1] = Command(c.line, c.run, c.skipped, (*c.shown, raw))
            continue
        text = raw[2:] if block.lang == "console" else raw
        if text.rstrip().endswith("\\"):
            pending.append(text.rstrip()[:-1])
            continue
        text = " ".join([*pending, text]).strip()
        pending = []
        if not text or text.startswith("#"):
            continue
        out.append(_command(text))
    return out


def _command(text: str) -> Command:
    words = shlex.split(text, comments=True)
    parts: list[list[str]] = [[]]
    for w in words:
        if w == "&&":
            parts.append([])
        else:
            parts[-1].append(w)
    kept, reasons = [], []
    for part in parts:
        reason = next((why for prefix, why in SKIP.items() if tuple(part[:len(prefix)]) == prefix), None)
        if reason is None:
            kept.append(part)
        else:
            reasons.append(reason)
    if not reasons:
        return Command(text, text, (), ())
    return Command(text, " && ".join(shlex.join(p) for p in kept) or None, tuple(reasons), ())


def shown_pattern(shown: str, home: Path) -> re.Pattern[str]:
    """The regex a shown output line stands for (PLACEHOLDERS applied)."""
    pat = re.escape(shown.strip())
    for doc, value in PLACEHOLDERS:
        pat = re.sub(doc, lambda _m, v=value: v.replace("{home}", re.escape(str(home))), pat)
    return re.compile(pat)


def shell_env(home: Path, bin_dir: Path) -> dict[str, str]:
    """The environment of a doc's shell commands: a private run directory, no cluster
    address from outside, and ``python``/``python3``/``triplane`` of this interpreter."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("python", "python3"):
        link = bin_dir / name
        if not link.exists():
            link.symlink_to(sys.executable)
    tp = bin_dir / "triplane"
    if not tp.exists():
        tp.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m triplane "$@"\n')
        tp.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("TRIPLANE_URL", "TRIPLANE_TOKEN")}
    env.update(TRIPLANE_HOME=str(home), PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
               COLUMNS="200", NO_COLOR="1")
    return env


def run_shell(block: Block, home: Path, cwd: Path, timeout_s: float = 120.0) -> None:
    """Run a bash/console block's commands; AssertionError names the first that fails."""
    env = shell_env(home, cwd / ".docbin")
    for c in commands(block):
        if c.run is None:
            continue
        line = c.run
        for placeholder in FILL_IN:
            if placeholder in line:
                line = line.replace(placeholder, _newest_job(cwd, env, timeout_s))
        r = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout_s)
        said = r.stdout + r.stderr
        assert r.returncode == 0, f"{block.name}: `{line}` exited {r.returncode}:\n{said[-3000:]}"
        for shown in c.shown:
            assert shown_pattern(shown, home).search(said), (
                f"{block.name}: `{line}` did not print the shown line {shown!r}:\n{said[-3000:]}")


def _newest_job(cwd: Path, env: dict[str, str], timeout_s: float) -> str:
    r = subprocess.run(["triplane", "status", "--json"], cwd=cwd, env=env, capture_output=True,
                       text=True, timeout=timeout_s)
    jobs = json.loads(r.stdout).get("jobs") or []
    assert jobs, f"a command needs a job id and the cluster has no job: {r.stdout}{r.stderr}"
    return str(jobs[0]["id"])


# -- javascript ------------------------------------------------------------------------------

def run_js(block: Block, home: Path, cwd: Path, timeout_s: float = 180.0) -> None:
    """Run a js block as an ES module with node, ``triplane`` resolving to sdk/js."""
    node = shutil.which("node")
    assert node, f"{block.name}: a js block needs Node 20 or later on PATH (.ci/run installs nodejs)"
    modules = cwd / "node_modules"
    modules.mkdir(exist_ok=True)
    if not (modules / "triplane").exists():
        (modules / "triplane").symlink_to(ROOT / "sdk" / "js", target_is_directory=True)
    script = cwd / f".docjs-{Path(block.path).stem}-{block.number}.mjs"
    script.write_text("\n" * block.line + block.code)
    env = shell_env(home, cwd / ".docbin")
    r = subprocess.run([node, str(script)], cwd=cwd, env=env, capture_output=True, text=True,
                       timeout=timeout_s)
    print(r.stdout, end="")
    assert r.returncode == 0, f"{block.name} exited {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}"
# -- go ------------------------------------------------------------------------------------

def run_go(block: Block, home: Path, cwd: Path, timeout_s: float = 300.0) -> None:
    """Build and run a go block (a ``package main`` program) in a module of its own that
    replaces ``triplane`` by sdk/go; AssertionError with its output when it fails."""
    go = shutil.which("go")
    assert go is not None, f"{block.name}: a go block needs the Go toolchain (.ci/run installs golang-go)"
    assert re.search(r"^package main\b", block.code, re.M), f"{block.name}: a go block is a whole program"
    mod = cwd / f".goblock-{Path(block.path).stem}-{block.number}"
    mod.mkdir(parents=True, exist_ok=True)
    (mod / "go.mod").write_text(f"module docblock\n\ngo 1.21\n\nrequire triplane v0.0.0\n\n"
                                f"replace triplane => {GO_SDK}\n")
    (mod / "main.go").write_text(block.code)
    env = shell_env(home, cwd / ".docbin")
    r = subprocess.run([go, "run", "."], cwd=mod, env=env, capture_output=True, text=True,
                       timeout=timeout_s)
    print(r.stdout, end="")
    said = (r.stdout + r.stderr)[-3000:]
    assert r.returncode == 0, f"{block.name}: `go run` exited {r.returncode}:\n{said}"


# -- python ----------------------------------------------------------------------------------

def run_python(block: Block, ns: dict[str, object]) -> None:
    """Run a python block in ``ns``; a ``>>>`` block as a REPL session."""
    if block.code.lstrip().startswith(">>>"):
        _run_repl(block, ns)
        return
    exec(compile("\n" * block.line + block.code, str(ROOT / block.path), "exec"), ns)


def _run_repl(block: Block, ns: dict[str, object]) -> None:
    steps: list[tuple[str, list[str]]] = []
    for ln in block.code.splitlines():
        if ln.startswith(">>> "):
            steps.append((ln[4:], []))
        elif ln.startswith("... ") and steps:
            steps[-1] = (steps[-1][0] + "\n" + ln[4:], steps[-1][1])
        elif ln.strip() and steps:
            steps[-1][1].append(ln)
    for src, shown in steps:
        raises = re.match(r"^(\w+): (.*)$", shown[-1]) if shown else None
        buf = io.StringIO()
        try:
            with contextlib.redirect_stdout(buf):
                code = compile(src + "\n", "<stdin>", "single")
                exec(code, ns)
        except Exception as e:  # compared with the shown exception below
            got = f"{type(e).__name__}: {e}"
            assert raises and got == shown[-1], f"{block.name}: `{src}` raised {got}, shown: {shown}"
            continue
        assert not raises, f"{block.name}: `{src}` did not raise the shown {shown[-1]!r}"
        printed = buf.getvalue().split("\n")
        for s in shown:
            assert s.strip() in (p.strip() for p in printed), f"{block.name}: `{src}` did not show {s!r}"


# -- a whole file ----------------------------------------------------------------------------

def check_data(block: Block) -> None:
    if block.lang == "json":
        json.loads(block.code)
    elif block.lang == "yaml":
        yaml.safe_load(block.code)


def runs_processes(path: str) -> bool:
    """Whether the file's blocks start processes or a cluster (the integration module's)."""
    if path in INTEGRATION_FILES:
        return True
    for b in blocks(path):
        if b.lang in ("bash", "console") and any(c.run for c in commands(b)):
            return True
        if b.lang == "python" and "tp.connect(" in b.code:
            return True
        if b.lang in ("js", "javascript") and "connect(" in b.code:
            return True
        if b.lang == "go":  # a Go program builds and runs: a process
            return True
    return False


def run_file(path: str, ns: dict[str, object], home: Path, cwd: Path, root: Path = ROOT) -> list[str]:
    """Run every block of ``path`` in order. Returns the known failures seen; raises
    AssertionError for any other failure, and for a KNOWN_FAILING block that now runs."""
    seen: list[str] = []
    for b in blocks(path, root):
        assert b.lang in LANGUAGES, f"{b.name}: name the block's language, one of {LANGUAGES}"
        known = KNOWN_FAILING.get((path, b.number))
        try:
            if b.lang == "python":
                run_python(b, ns)
            elif b.lang in ("bash", "console"):
                run_shell(b, home, cwd)
            elif b.lang in ("js", "javascript"):
                run_js(b, home, cwd)
            elif b.lang == "go":
                run_go(b, home, cwd)
            else:
                check_data(b)
        except Exception as e:  # a known failure may raise anything
            if known is None:
                raise AssertionError(f"{b.name} fails: {type(e).__name__}: {e}") from e
            seen.append(f"{b.name}: {type(e).__name__}: {textwrap.shorten(str(e), 200)}")
            continue
        assert known is None, f"{b.name} runs now: remove it from KNOWN_FAILING ({known})"
    return seen


@contextlib.contextmanager
def in_dir(path: Path) -> Iterator[None]:
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)
