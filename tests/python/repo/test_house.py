"""The house rules a reader relies on, checked on the tree:

* the project describes itself as it is: no docs, code or tests speak of the sessions or issue
  numbers of its own history (git log holds history). Upstream projects' reports are cited as
  ``MQBench #248`` or ``pytorch/pytorch#12345``, without the word "issue";
* the README can be skimmed: no paragraph over 120 words; docs/llm.md at most 700 lines;
* one place per concept: no test oracle (``*_reference``) in the package, the ONNX export in the
  ``mqbench.onnx`` subpackage (no ``_onnx_*.py`` at the package root), no header file name used
  twice, every Python test in an area folder of tests/python.
"""
import os
import re
import subprocess

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
PACKAGE = os.path.join(ROOT, "python", "mqbench")

TEXT_SUFFIXES = (".md", ".py", ".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh", ".cmake", ".sh",
                 ".toml", ".ini", ".cfg", ".txt", ".in")
HISTORY = re.compile(r"(?i)\b(?:session|issue)s?\s+#?\d+\b|"
                     r"\b(?:an earlier|a later|the previous|the next|this|that|last) session\b")


def _skip_dir(rel):
    parts = rel.split(os.sep)
    return parts[0].startswith((".", "build")) or parts[0] in ("third_party", "venv") or \
        "__pycache__" in parts or rel.startswith(os.path.join("tests", "fuzz", "corpus"))


def tracked_text_files(root=ROOT):
    """The text files git tracks (a clean clone's files); outside a git checkout (an sdist),
    every file under ``root`` but build folders, hidden folders and third_party/."""
    try:
        listed = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True,
                                check=True).stdout.decode().split("\0")
    except (OSError, subprocess.CalledProcessError):
        listed = None
    if listed is not None:
        for rel in sorted(p for p in listed if p):
            name = os.path.basename(rel)
            if not _skip_dir(rel) and (name.endswith(TEXT_SUFFIXES) or
                                       name in ("CMakeLists.txt", "run")) and \
                    os.path.isfile(os.path.join(root, rel)):
                yield os.path.join(root, rel)
        return
    for directory, dirs, files in os.walk(root):
        rel_dir = os.path.relpath(directory, root)
        dirs[:] = sorted(d for d in dirs
                         if not _skip_dir(os.path.normpath(os.path.join(rel_dir, d))))
        for name in sorted(files):
            if name.endswith(TEXT_SUFFIXES) or name in ("CMakeLists.txt", "run"):
                yield os.path.join(directory, name)


def history_mentions(root=ROOT):
    """[(path:line, text)] of every mention of the project's own sessions or issue numbers."""
    found = []
    for path in tracked_text_files(root):
        if os.path.abspath(path) == os.path.abspath(__file__):
            continue  # its own examples of what is refused
        with open(path, encoding="utf-8", errors="replace") as f:
            for k, line in enumerate(f, 1):
                if HISTORY.search(line):
                    found.append((f"{os.path.relpath(path, root)}:{k}", line.strip()[:120]))
    return found


def test_no_history_mentions():
    found = history_mentions()
    assert not found, (
        "docs, code and tests describe the project as it is; say what machine and command gave "
        "a figure instead of who measured it when, and cite upstream reports as 'MQBench #248':\n"
        + "\n".join(f"  {where}: {text}" for where, text in found))


@pytest.mark.parametrize("text, hit", [
    ("Session 18 read 0.0589", True), ("see issue #29", True), ("issues 3 and 4", True),
    ("an earlier session measured", True), ("MQBench #248 is re-pinged", False),
    ("an onnxruntime InferenceSession", False), ("the session options of onnxruntime", False),
    ("pytorch/pytorch#12345", False)])
def test_the_history_pattern(text, hit):
    assert bool(HISTORY.search(text)) == hit


def paragraphs(markdown):
    """The prose paragraphs of a Markdown text: blank-line separated, outside code fences,
    without headings, tables and list items' markup counted as words."""
    out, cur, fenced = [], [], False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            if cur:
                out.append(" ".join(cur))
                cur = []
            continue
        if fenced:
            continue
        s = line.strip()
        if not s or s.startswith(("#", "|")):
            if cur:
                out.append(" ".join(cur))
                cur = []
            continue
        if s.startswith(("- ", "* ", "1. ")) and cur:  # a list item is a paragraph of its own
            out.append(" ".join(cur))
            cur = []
        cur.append(s)
    if cur:
        out.append(" ".join(cur))
    return out


def test_readme_paragraphs_are_short():
    with open(os.path.join(ROOT, "README.md")) as f:
        long_ones = [p for p in paragraphs(f.read()) if len(p.split()) > 120]
    assert not long_ones, "README paragraphs over 120 words:\n" + "\n\n".join(
        f"({len(p.split())} words) {p[:200]}..." for p in long_ones)


def test_paragraph_splitting():
    text = "a b\nc\n\n```\nx y z\n```\n- one\n- two three\n| t | u |\n# Head\nd"
    assert paragraphs(text) == ["a b c", "- one", "- two three", "d"]


def test_the_llm_guide_is_at_most_700_lines():
    with open(os.path.join(ROOT, "docs", "llm.md")) as f:
        n = sum(1 for _ in f)
    assert n <= 700, f"docs/llm.md has {n} lines; measured tables belong in docs/benchmarks.md"


def test_no_oracle_in_the_package():
    found = []
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(directory, name)
                with open(path) as f:
                    for k, line in enumerate(f, 1):
                        if re.match(r"\s*def \w+_reference\(", line):
                            found.append(f"{os.path.relpath(path, ROOT)}:{k}")
    assert not found, "test oracles belong in tests/python/reference.py: " + ", ".join(found)


def test_the_onnx_export_lives_in_its_subpackage():
    stray = sorted(n for n in os.listdir(PACKAGE) if re.fullmatch(r"_onnx\w*\.py", n))
    assert not stray, f"ONNX export modules at the package root: {stray} (python/mqbench/onnx/)"
    assert os.path.isfile(os.path.join(PACKAGE, "onnx", "__init__.py"))


def test_no_header_file_name_is_used_twice():
    seen = {}
    for base in ("include", "src"):
        for directory, _, files in os.walk(os.path.join(ROOT, base)):
            for name in files:
                if name.endswith((".h", ".hpp", ".cuh")):
                    seen.setdefault(name, []).append(
                        os.path.relpath(os.path.join(directory, name), ROOT))
    twice = {n: p for n, p in seen.items() if len(p) > 1}
    assert not twice, f"header names used twice (name them after what they hold): {twice}"


def test_python_tests_live_in_area_folders():
    top = os.path.join(ROOT, "tests", "python")
    loose = sorted(n for n in os.listdir(top) if n.startswith("test_") and n.endswith(".py"))
    assert not loose, f"tests/python/<area>/ holds each test file: move {loose}"
    names = {}
    for directory, _, files in os.walk(top):
        for n in files:
            if n.startswith("test_") and n.endswith(".py"):
                names.setdefault(n, []).append(os.path.relpath(directory, top))
    twice = {n: d for n, d in names.items() if len(d) > 1}
    assert not twice, f"test file names must be unique across the area folders: {twice}"
