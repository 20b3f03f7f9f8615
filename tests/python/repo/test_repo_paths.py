"""Every repository path that a doc or a source comment names exists.

What is checked, precisely:

* Where: the Markdown files (``docs/**/*.md``, ``README.md``, every other ``*.md`` of the
  repository), whole; and the comments of the source files: in Python the ``#`` comments and the
  docstrings (module, class, function); in C, C++ and CUDA (``.h .hpp .cpp .cc .cu .cuh``) the
  ``//`` and ``/* */`` comments; in CMake, shell, TOML, INI and requirements files the ``#``
  comments. Code itself (string literals that the program uses) is not read: a path there is
  the program's business and its tests'. Build folders (``build*``), hidden folders, virtual
  environments and the folders of ``third_party/`` (upstream source that ``scripts/setup.sh``
  unpacks there: its paths are its own) are skipped.
* What: a *repository path* is a token that starts with one of the top-level folders
  (``src/ include/ python/ tests/ docs/ bench/ examples/ scripts/ tools/ cmake/ third_party/``),
  where the folder name is not preceded by a letter, digit, ``_``, ``-``, ``.`` or ``/`` (so
  ``../shared/x``, ``torch/include/x`` and ``site-packages/tools/x`` are not repository paths),
  followed by path characters (letters, digits, ``_ - . / * +``), and ending in a letter, digit
  or ``*``; trailing punctuation is not part of it. A ``<`` (a placeholder, ``src/backends/<name>.cpp``)
  or ``{`` ends the token, so the path checked is the folder before it.
* Also an *include path*: a token such as ``ops/common/checks.h`` or
  ``mqbench/deploy/onnx_graph.h``, written as ``#include`` writes it, relative to ``src/`` or
  ``include/``. It is recognised by its first folder, one of the folders of ``src/`` and
  ``include/`` (``ops``, ``deploy``, ``mqbench``, ...), by the same boundary rule, and by its end,
  a C, C++ or CUDA file name (``.h .hpp .cuh .cpp .cc .cu``).
* Then: the path must exist relative to the repository root (include paths: under ``src/`` or
  ``include/``), as a file or a folder; a token with ``*`` must match at least one path
  (``glob``); a ``:N`` or ``:N-M`` after a file is a line number, and the file must have that
  many lines.

The failure lists every missing path with the files and lines that name it.
"""
import ast
import glob
import io
import os
import re
import tokenize

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))

TOP_FOLDERS = ("src", "include", "python", "tests", "docs", "bench", "examples", "scripts",
               "tools", "cmake", "third_party")
PATH_RE = re.compile(
    r"(?<![A-Za-z0-9_\-./])((?:" + "|".join(TOP_FOLDERS) + r")/[A-Za-z0-9_\-./*+]*[A-Za-z0-9*])"
    r"(?::(\d+)(?:-(\d+))?)?")

C_LIKE = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
HASH_COMMENTS = (".cmake", ".sh", ".toml", ".ini", ".cfg", ".txt")
INCLUDE_ROOTS = ("src", "include")


def include_path_re(root):
    """The pattern of include paths: their first folder is one of src/'s or include/'s."""
    firsts = sorted({d for base in INCLUDE_ROOTS if os.path.isdir(os.path.join(root, base))
                     for d in os.listdir(os.path.join(root, base))
                     if os.path.isdir(os.path.join(root, base, d))} - set(TOP_FOLDERS))
    if not firsts:
        return None
    ext = "|".join(e.lstrip(".") for e in C_LIKE)
    return re.compile(r"(?<![A-Za-z0-9_\-./])((?:" + "|".join(map(re.escape, firsts)) +
                      r")/[A-Za-z0-9_\-./]*\.(?:" + ext + r"))(?![A-Za-z0-9_])"
                      r"(?::(\d+)(?:-(\d+))?)?")


def _skip_dir(name):
    return name.startswith((".", "build")) or name in ("__pycache__", "venv", "node_modules")


def source_files(root=ROOT):
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not _skip_dir(d))
        if os.path.relpath(directory, root) == "third_party":
            dirs[:] = []
        for name in sorted(files):
            if name.endswith((".md", ".py") + C_LIKE + HASH_COMMENTS) or name == "CMakeLists.txt":
                yield os.path.join(directory, name)


def python_comments(text):
    """(line, text) of the ``#`` comments and the docstrings of Python source."""
    out = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT:
                out.append((tok.start[0], tok.string))
        tree = ast.parse(text)
    except (SyntaxError, tokenize.TokenError):
        return [(1, text)]  # not Python we can parse: read it all
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                out.append((body[0].lineno, body[0].value.value))
    return out


def c_comments(text):
    """(line, text) of the ``//`` and ``/* */`` comments of C, C++ or CUDA source; string and
    character literals are skipped."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end < 0 else end
            out.append((text.count("\n", 0, i) + 1, text[i:end]))
            i = end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            out.append((text.count("\n", 0, i) + 1, text[i:end]))
            i = end
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1
    return out


def hash_comments(text):
    return [(k, line[line.index("#"):]) for k, line in enumerate(text.splitlines(), 1)
            if "#" in line]


def commented_text(path):
    """(line, text) pieces of ``path`` where repository paths are looked for."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if path.endswith(".md"):
        return [(1, text)]
    if path.endswith(".py"):
        return python_comments(text)
    if path.endswith(C_LIKE):
        return c_comments(text)
    return hash_comments(text)


def named_paths(pieces, include_re=None):
    """(line, path, first line number or None, last line number or None, include path?) of
    every repository path and include path in the (line, text) pieces."""
    for line, text in pieces:
        for pattern, is_include in ((PATH_RE, False), (include_re, True)):
            if pattern is None:
                continue
            for m in pattern.finditer(text):
                at = line + text.count("\n", 0, m.start())
                first = int(m.group(2)) if m.group(2) else None
                last = int(m.group(3)) if m.group(3) else first
                yield at, m.group(1).rstrip("."), first, last, is_include


def _line_count(path):
    with open(path, encoding="utf-8", errors="replace") as f:
        return sum(1 for _ in f)


def problem(root, path, first, last, is_include=False):
    """None when ``path`` (with its line numbers) exists under ``root``, else what is wrong."""
    if is_include:
        bases = [b for b in INCLUDE_ROOTS if os.path.exists(os.path.join(root, b, path))]
        if not bases:
            return "missing under src/ and include/"
        full = os.path.join(root, bases[0], path)
    else:
        full = os.path.join(root, path)
    if "*" in path:
        return None if glob.glob(full) else "no path matches"
    if not os.path.exists(full.rstrip("/")):
        return "missing"
    if last is not None:
        if not os.path.isfile(full):
            return f"line {last} of a folder"
        lines = _line_count(full)
        if last > lines:
            return f"line {last}, but the file has {lines} lines"
    return None


def missing_paths(root=ROOT):
    """{(path, what is wrong): [where it is named]} over the repository at ``root``."""
    missing = {}
    include_re = include_path_re(root)
    for source in source_files(root):
        rel = os.path.relpath(source, root)
        for at, path, first, last, is_include in named_paths(commented_text(source), include_re):
            why = problem(root, path, first, last, is_include)
            if why is not None:
                shown = path + (f":{first}" if first else "") + (
                    f"-{last}" if last and last != first else "")
                missing.setdefault((shown, why), []).append(f"{rel}:{at}")
    return missing


def test_every_repository_path_named_in_docs_and_comments_exists():
    missing = missing_paths()
    report = "\n".join(f"  {path} ({why}), named in {', '.join(where)}"
                       for (path, why), where in sorted(missing.items()))
    assert not missing, f"{len(missing)} repository paths named in docs or comments do not " \
                        f"exist:\n{report}"


def test_what_counts_as_a_repository_path(tmp_path):
    root = tmp_path
    for rel, text in {
        "src/ops/a.cpp": "// src/ops/a.cpp:1 and src/ops/b.cpp (gone); src/ops/a.cpp:9 (too far)\n"
                         'const char* s = "src/ops/in_a_string.cpp";  // code, not read\n',
        "docs/x.md": "See `src/ops/a.cpp`, src/ops/*.cpp, src/ops/*.cu, ../shared/design.md,\n"
                     "torch/include/ATen.h, src/backends/<name>.cpp and docs/missing.md.\n",
        "python/m.py": '"""python/m.py itself; tests/python/gone.py."""\n'
                       'X = "tests/python/in_code.py"  # tools/gone.sh\n',
        "CMakeLists.txt": "# cmake/Gone.cmake\nset(X src/ops/not_a_comment.cpp)\n",
        "build/notes.md": "src/in_a_build_folder.cpp\n",
        "third_party/README.md": "third_party/gone/LICENSE\n",
        "third_party/upstream-1.0/README.md": "docs/theirs.md and tools/theirs.py\n",
        "src/ops/common/x.h": "// ops/common/x.h, ops/common/gone.h, mqbench/y.h:3, y.h\n",
        "include/mqbench/y.h": "// docs/design/ops.md#layout and docs/design/gone.md\n",
        "docs/design/ops.md": "",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "src/backends").mkdir()
    found = {path: where for (path, _), where in missing_paths(str(root)).items()}
    assert found == {
        "src/ops/b.cpp": ["src/ops/a.cpp:1"],
        "src/ops/a.cpp:9": ["src/ops/a.cpp:1"],
        "src/ops/*.cu": ["docs/x.md:1"],
        "docs/missing.md": ["docs/x.md:2"],
        "tests/python/gone.py": ["python/m.py:1"],
        "tools/gone.sh": ["python/m.py:2"],
        "cmake/Gone.cmake": ["CMakeLists.txt:1"],
        "ops/common/gone.h": ["src/ops/common/x.h:1"],
        "mqbench/y.h:3": ["src/ops/common/x.h:1"],
        "docs/design/gone.md": ["include/mqbench/y.h:1"],
        "third_party/gone/LICENSE": ["third_party/README.md:1"],
    }, found
