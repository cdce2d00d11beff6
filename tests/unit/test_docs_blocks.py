"""Docs stand alone: every fenced block of README.md and docs/*.md runs (tests/docblocks.py
says how each language runs). Files whose blocks start processes run in
tests/integration/test_docs_cluster_blocks.py; this module runs the others and checks
what holds for every block."""

from __future__ import annotations

from pathlib import Path

import pytest
from docblocks import (
    FILL_IN,
    INTEGRATION_FILES,
    KNOWN_FAILING,
    LANGUAGES,
    SKIP,
    Block,
    all_blocks,
    blocks,
    commands,
    doc_files,
    in_dir,
    run_file,
    run_python,
    run_shell,
    runs_processes,
    shown_pattern,
)

from triplane.proto import optable
from triplane.sdk.custom import unregister_op
from triplane.sdk.session import set_default_session

IN_PROCESS = [p for p in doc_files() if not runs_processes(p)]


def test_every_block_names_a_known_language() -> None:
    bad = [b.name for b in all_blocks() if b.lang not in LANGUAGES]
    assert not bad, f"give each block its language, one of {LANGUAGES} (a diagram is text): {bad}"


def test_the_lists_name_real_blocks_and_commands() -> None:
    # An entry that matches nothing any more is stale: it would hide the next change there.
    by_key = {(b.path, b.number): b for b in all_blocks()}
    assert not [k for k in KNOWN_FAILING if k not in by_key]
    assert not [p for p in INTEGRATION_FILES if p not in doc_files()]
    shell = [c for b in all_blocks() if b.lang in ("bash", "console") for c in commands(b)]
    assert {r for c in shell for r in c.skipped} == set(SKIP.values())
    assert {k for k in FILL_IN if any(k in (c.run or "") for c in shell)} == set(FILL_IN)


def test_the_parser_reads_fences_commands_and_placeholders(tmp_path: Path) -> None:
    doc = tmp_path / "d.md"
    doc.write_text("x\n```python\nprint(1)\n```\n\n  ```console\n  $ triplane up  # a comment\n"
                   "  triplane cluster up: http://127.0.0.1:41779 (2 executors)\n  ```\n"
                   "```bash\npython3 -m pip install -e . && python3 -m triplane ops\n```\n")
    got = blocks("d.md", root=tmp_path)
    assert [(b.number, b.lang, b.line) for b in got] == [(1, "python", 2), (2, "console", 6), (3, "bash", 10)]
    (up,) = commands(got[1])
    assert up.run == "triplane up  # a comment" and len(up.shown) == 1
    pat = shown_pattern(up.shown[0], tmp_path)
    assert pat.search("triplane cluster up:  http://127.0.0.1:5001 (2 executors)")
    assert not pat.search("triplane cluster up: http://127.0.0.1:5001 (3 executors)")
    (both,) = commands(got[2])
    assert both.run == "python3 -m triplane ops"
    assert both.skipped == (SKIP["python3", "-m", "pip", "install"],)
    assert shown_pattern("alice   Yc1m0...", tmp_path).search("alice\tq8Zx_-token")


def test_a_failing_block_fails_and_a_repl_block_checks_its_exception() -> None:
    ns: dict[str, object] = {}
    run_python(Block("x.md", 1, "python", 1, ">>> 1 / 0\nZeroDivisionError: division by zero\n"), ns)
    with pytest.raises(AssertionError, match="raised ZeroDivisionError"):
        run_python(Block("x.md", 1, "python", 1, ">>> 1 / 0\nValueError: no\n"), ns)
    with pytest.raises(AssertionError, match="did not raise"):
        run_python(Block("x.md", 1, "python", 1, ">>> 1 + 1\nValueError: no\n"), ns)
    with pytest.raises(NameError):
        run_python(Block("x.md", 1, "python", 1, "undefined_name\n"), ns)


def test_a_command_must_exit_0_and_print_what_is_shown(tmp_path: Path) -> None:
    run_shell(Block("x.md", 1, "console", 1, "$ echo $TRIPLANE_HOME/x\n/home/me/.triplane/x\n"),
              tmp_path / "home", tmp_path)
    with pytest.raises(AssertionError, match="did not print the shown line 'bye'"):
        run_shell(Block("x.md", 1, "console", 1, "$ echo hi\nbye\n"), tmp_path / "home", tmp_path)
    with pytest.raises(AssertionError, match="exited 1"):
        run_shell(Block("x.md", 1, "bash", 1, "true\nfalse  # fails\n"), tmp_path / "home", tmp_path)


def test_a_known_failure_must_keep_failing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "d.md").write_text("```python\nx = 1\n```\n```python\nx.nope\n```\n")
    ns: dict[str, object] = {}
    with pytest.raises(AssertionError, match=r"block 2 .* fails: AttributeError"):
        run_file("d.md", ns, tmp_path / "home", tmp_path, root=tmp_path)
    monkeypatch.setitem(KNOWN_FAILING, ("d.md", 2), "x is an int")
    assert "AttributeError" in run_file("d.md", ns, tmp_path / "home", tmp_path, root=tmp_path)[0]
    monkeypatch.setitem(KNOWN_FAILING, ("d.md", 1), "it does not")
    with pytest.raises(AssertionError, match=r"block 1 .* runs now: remove it from KNOWN_FAILING"):
        run_file("d.md", ns, tmp_path / "home", tmp_path, root=tmp_path)


@pytest.mark.parametrize("path", IN_PROCESS)
def test_blocks_run(path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIPLANE_HOME", str(tmp_path / "home"))
    ns: dict[str, object] = {"__name__": "__docs__"}
    ops_before = set(optable.names())
    try:
        with in_dir(tmp_path):
            run_file(path, ns, tmp_path / "home", tmp_path)
    finally:
        set_default_session(None)
        for name in set(optable.names()) - ops_before:  # user ops a page registers leave with it
            unregister_op(name)
