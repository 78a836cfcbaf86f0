#!/usr/bin/env python3
"""Lists the production C++ functions longer than a limit.

A function's length is the number of source lines from the first line of its
signature to its closing brace, inclusive (comments and blank lines count:
they are what a reader scrolls through). Functions are found from the brace
structure of each file, after comments, string and character literals and
preprocessor lines are blanked out, so this is an estimate, not a parse: a
macro that opens or closes braces, or a brace split across `#if` branches,
can mislead it. Lambdas and local classes count as part of the function that
contains them.

Production code is every .cc/.h/.cpp/.c/.hpp file under the source folders
except tests/, any bench/, testing/ or third_party/ folder, and files named
*_test.cc / *_test.h (tests and their harnesses are not held to the limit).

Usage:
  tests/function_length_check.py [--root DIR] [--top N] [--max-lines N]
      Prints the N longest functions (default 15), longest first, as
      "LINES path:line name". With --max-lines, also fails (exit 1) if any
      function is longer than the limit and not in KNOWN_LONG_FUNCTIONS,
      or if an entry there no longer names a function over the limit.
  tests/function_length_check.py --self-test [--max-lines N]
      Checks the scanner on planted sources (exit 1 on a wrong answer), then
      the checkout if --max-lines is given.

As a Bazel test (//tests:function_length_test) it runs the self-test, then
checks the checkout it was built from with --max-lines 100. It reads the
source tree, not declared inputs, so it is tagged "external" (never cached).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import tempfile
from typing import Iterable, Iterator

# The folders scanned, relative to the checkout.
SOURCE_DIRS = ("checkpoint", "common", "deploy", "examples", "proto", "python",
               "scheduler", "server", "worker")
EXTENSIONS = (".cc", ".h", ".cpp", ".c", ".hpp")
EXCLUDED_DIRS = {"tests", "bench", "testing", "third_party"}

# Functions over the limit tolerated until the change that shortens them
# lands, each "path name" as printed. An entry that no longer names a
# function over the limit fails the check, so this list only shrinks: delete
# an entry when its function is split. Do not add to it: split the function.
KNOWN_LONG_FUNCTIONS: tuple[str, ...] = ()

_KEYWORDS_BEFORE_PAREN = {
    "if", "for", "while", "switch", "catch", "return", "sizeof", "alignof",
    "decltype", "noexcept", "alignas", "static_assert", "void", "int", "char",
    "bool", "double", "float", "long", "short", "unsigned", "signed", "auto",
    "const", "throw", "new", "delete", "typeid", "requires", "__attribute__",
    "__declspec",
}


@dataclasses.dataclass(frozen=True)
class Function:
    """One function definition found in a file."""

    path: str  # relative to the root, '/'-separated
    line: int  # 1-based line of the first line of the signature
    end_line: int  # 1-based line of the closing brace
    name: str

    @property
    def lines(self) -> int:
        """The length in source lines, signature to closing brace."""
        return self.end_line - self.line + 1

    @property
    def key(self) -> str:
        """The name KNOWN_LONG_FUNCTIONS uses: "path name"."""
        return f"{self.path} {self.name}"


def strip_code(text: str) -> str:
    """Blanks comments, literals and preprocessor lines; keeps every newline.

    String literals become "" and character literals '' so that their
    braces, quotes and semicolons do not count; line numbers are unchanged.
    """
    out: list[str] = []
    i, n = 0, len(text)
    line_start = True  # only whitespace since the last newline

    def blank(s: str) -> str:
        return "".join("\n" if ch == "\n" else " " for ch in s)

    while i < n:
        ch = text[i]
        if ch == "\n":
            out.append(ch)
            line_start = True
            i += 1
            continue
        if line_start and ch == "#":
            # A preprocessor line, with its backslash continuations.
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                if text.startswith("/*", j):
                    end = text.find("*/", j + 2)
                    j = n if end < 0 else end + 2
                    continue
                j += 1
            out.append(blank(text[i:j]))
            i = j
            continue
        if ch in " \t\r\f\v":
            out.append(ch)
            i += 1
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(blank(text[i:j]))
            i = j
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(blank(text[i:j]))
            i = j
            continue
        if ch == '"':
            m = re.search(r'(?:u8|[uUL])?R$', text[max(0, i - 3):i])
            before = text[i - len(m.group(0)) - 1] if m and i - len(
                m.group(0)) > 0 else ""
            if m and not (before.isalnum() or before == "_"):
                # A raw string: R"delim( ... )delim".
                open_paren = text.find("(", i)
                delim = text[i + 1:open_paren]
                end = text.find(")" + delim + '"', open_paren)
                j = n if end < 0 else end + len(delim) + 2
            else:
                j = i + 1
                while j < n and text[j] != '"' and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                j = min(j + 1, n)
            out.append('""' + blank(text[i + 2:j]) if j - i >= 2 else '"')
            i = j
            continue
        if ch == "'":
            # A digit separator (1'000) when the token before it is a number.
            k = i
            while k > 0 and (text[k - 1].isalnum() or text[k - 1] in "_.'"):
                k -= 1
            if k < i and text[k].isdigit():
                out.append(" ")
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append("''" + blank(text[i + 2:j]) if j - i >= 2 else "'")
            i = j
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def _strip_template_prefix(header: str) -> str:
    """Removes leading `template <...>` clauses and [[attributes]]."""
    h = header.strip()
    while True:
        h = re.sub(r"^\[\[.*?\]\]\s*", "", h, flags=re.S)
        m = re.match(r"template\s*<", h)
        if not m:
            return h
        depth, j = 1, m.end()
        while j < len(h) and depth:
            depth += {"<": 1, ">": -1}.get(h[j], 0)
            j += 1
        h = h[j:].lstrip()


def _top_level(header: str) -> str:
    """The header with everything inside (), [] and {} removed."""
    out, depth = [], 0
    for ch in header:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
            continue
        if depth == 0:
            out.append(ch)
    return "".join(out)


def _function_name(header: str) -> str | None:
    """The qualified name of the function a header declares, or None."""
    h = re.sub(r"\boperator\s*\(\s*\)", "operator()", header)
    h = re.sub(r"\boperator\s*(\[\s*\]|[^\w\s(]+)", lambda m: "operator" +
               re.sub(r"\s", "", m.group(1)), h)
    name_re = re.compile(
        r"((?:~?[A-Za-z_]\w*(?:\s*<[^<>()]*>)?\s*::\s*)*"
        r"(?:operator\(\)|operator[^\w\s(]+|operator\s+[\w:<>*& ]+?"
        r"|~?[A-Za-z_]\w*))"
        r"\s*\(")
    depth = 0
    for m in name_re.finditer(h):
        # Only a name outside every parenthesis (not a parameter's type).
        depth = h[:m.start()].count("(") - h[:m.start()].count(")")
        if depth != 0:
            continue
        name = re.sub(r"\s+", "", m.group(1))
        last = name.split("::")[-1]
        if last in _KEYWORDS_BEFORE_PAREN:
            continue
        return name
    return None


def _classify(header: str, before_brace: str) -> str:
    """What a '{' opens at namespace or class scope.

    Returns "scope" (namespace, class, extern "C": its contents are scanned
    for functions), "function", "inner" (a brace that belongs to the header,
    e.g. a member's brace initializer in a constructor's initializer list:
    the header goes on after it) or "other" (an initializer or enum: skipped).
    """
    h = _strip_template_prefix(header)
    h = re.sub(r"^(?:(?:public|private|protected)\s*:(?!:)\s*)+", "", h)
    top = _top_level(h)
    if re.match(r"(?:inline\s+)?namespace\b", h) or re.match(
            r'extern\s*""', h):
        return "scope"
    if "(" not in h and re.match(r"(?:typedef\s+)?(?:class|struct|union)\b",
                                 h):
        return "scope"
    if re.match(r"(?:typedef\s+)?enum\b", h):
        return "other"
    if "(" not in h:
        return "other"
    top_ops = re.sub(r"\boperator\s*\S+", "operator", top)
    if re.search(r"(?<![=!<>])=(?!=)", top_ops):
        # An initializer: `auto x = [](...) {`, `T x = T(...) {`.
        return "other"
    if _function_name(h) is None:
        return "other"
    # A constructor's initializer list: `Foo() : a_(1), b_{2} {`. A brace
    # right after a name (or a template's `>`) initializes a member.
    if re.search(r"\)[^:]*?(?<!:):(?!:)", h) and re.search(
            r"[\w>]\s*$", before_brace):
        return "inner"
    return "function"


def find_functions(path: str, text: str) -> list[Function]:
    """Every function definition in a file's text, in order of appearance."""
    code = strip_code(text)
    functions: list[Function] = []
    # Each entry: the kind of brace that opened it.
    stack: list[str] = []
    header_start = 0  # offset where the current scope-level header begins
    paren = 0  # parenthesis depth inside the current header
    func_depth = 0  # brace depth inside the current function (0: none)
    func_start = 0
    func_name = ""
    line_of = _LineIndex(code)
    i, n = 0, len(code)
    while i < n:
        ch = code[i]
        if func_depth:
            if ch == "{":
                func_depth += 1
            elif ch == "}":
                func_depth -= 1
                if func_depth == 0:
                    functions.append(
                        Function(path, line_of(func_start), line_of(i),
                                 func_name))
                    header_start = i + 1
            i += 1
            continue
        if stack and stack[-1] == "other":
            # Skip an initializer or enum body.
            depth = 1
            i += 1
            while i < n and depth:
                depth += {"{": 1, "}": -1}.get(code[i], 0)
                i += 1
            stack.pop()
            continue
        if ch == "(":
            paren += 1
        elif ch == ")":
            paren = max(0, paren - 1)
        elif ch == ";" and paren == 0:
            header_start = i + 1
        elif ch == "{":
            header = code[header_start:i]
            kind = "inner" if paren else _classify(header, header)
            if kind == "function":
                func_depth = 1
                start = header_start
                while start < i and code[start].isspace():
                    start += 1
                # The signature begins after any access specifier.
                m = re.match(r"(?:(?:public|private|protected)\s*:(?!:)\s*)+",
                             code[start:i])
                func_start = start + (m.end() if m else 0)
                func_name = _function_name(
                    re.sub(r"\s+", " ", _strip_template_prefix(header))) or "?"
            elif kind == "inner":
                stack.append("inner")
            elif kind == "scope":
                stack.append("scope")
                header_start = i + 1
                paren = 0
            else:
                stack.append("other")
        elif ch == "}":
            kind = stack.pop() if stack else "scope"
            if kind == "scope":
                header_start = i + 1
                paren = 0
        i += 1
    return functions


class _LineIndex:
    """Maps an offset in a text to its 1-based line number."""

    def __init__(self, text: str) -> None:
        self._starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def __call__(self, offset: int) -> int:
        lo, hi = 0, len(self._starts)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._starts[mid] <= offset:
                lo = mid
            else:
                hi = mid
        return lo + 1


def production_files(root: str) -> Iterator[str]:
    """The production C++ files under root, as '/'-separated relative paths."""
    for top in SOURCE_DIRS:
        base = os.path.join(root, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
            for f in sorted(filenames):
                if not f.endswith(EXTENSIONS) or re.search(r"_test\.(cc|h)$",
                                                           f):
                    continue
                full = os.path.join(dirpath, f)
                yield os.path.relpath(full, root).replace(os.sep, "/")


def scan(root: str) -> list[Function]:
    """Every production function under root, longest first."""
    functions: list[Function] = []
    for rel in production_files(root):
        with open(os.path.join(root, rel), encoding="utf-8",
                  errors="replace") as f:
            functions.extend(find_functions(rel, f.read()))
    functions.sort(key=lambda fn: (-fn.lines, fn.path, fn.line))
    return functions


def check(functions: Iterable[Function], max_lines: int,
          known: Iterable[str]) -> list[str]:
    """Functions over max_lines not in known, and stale entries of known."""
    known = list(known)
    long_keys = set()
    problems = []
    for fn in functions:
        if fn.lines <= max_lines:
            continue
        long_keys.add(fn.key)
        if fn.key not in known:
            problems.append(
                f"{fn.path}:{fn.line}: {fn.name} is {fn.lines} lines, over "
                f"{max_lines}: split it into well-named pieces")
    for entry in known:
        if entry not in long_keys:
            problems.append(
                f'KNOWN_LONG_FUNCTIONS entry "{entry}" no longer names a '
                f"function over {max_lines} lines: delete it from "
                f"tests/function_length_check.py")
    return problems


_SELF_TEST_SOURCE = r'''
#include "x.h"  // { not a brace
#define OPEN {
namespace ps {
namespace {
constexpr int kTable[] = {1, 2, 3};
const char* kText = "}}} { \" {";
const char kQuote = '}';
int kBig = 1'000'000;
}  // namespace

class Foo : public Bar {
 public:
  Foo(int a) : a_(a), b_{a} {
    x();
  }
  int Get() const { return a_; }
  void operator()(int* p) const { free(p); }
  Foo& operator=(const Foo& other) {
    return *this;
  }
 private:
  int a_;
};

template <typename T>
__attribute__((target("avx2"))) std::function<void(int)> Make(T t) {
  auto f = [](int x) {
    if (x) { return; }
  };
  /* } */
  const char* raw = R"json({"a": "}"})json";
  return f;
}

absl::Status Foo::Run(const Options& options = {})
    ABSL_LOCKS_EXCLUDED(mu_) {
  for (int i = 0; i < 3; ++i) {
    struct Local { int x; };
  }
  return absl::OkStatus();
}

enum class Color { kRed, kBlue };
extern "C" {
int ps_c_call(int x) {
  return x;
}
}
}  // namespace ps
'''

# (name, first line, last line) in _SELF_TEST_SOURCE, whose line 1 is empty.
_SELF_TEST_WANT = [
    ("Foo", 14, 16),
    ("Get", 17, 17),
    ("operator()", 18, 18),
    ("operator=", 19, 21),
    ("Make", 26, 34),
    ("Foo::Run", 36, 42),
    ("ps_c_call", 46, 48),
]


def self_test() -> int:
    """Checks the scanner and the limit on planted sources; 0 when right."""
    failures = 0
    got = [(f.name, f.line, f.end_line)
           for f in find_functions("planted.cc", _SELF_TEST_SOURCE)]
    if got != _SELF_TEST_WANT:
        print(f"self-test: found {got}\n  want {_SELF_TEST_WANT}",
              file=sys.stderr)
        failures += 1
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "server"))
        os.makedirs(os.path.join(tmp, "server", "testing"))
        body = "int Long() {\n" + "  x();\n" * 8 + "}\n"
        for rel in ("server/long.cc", "server/long_test.cc",
                    "server/testing/long.cc"):
            with open(os.path.join(tmp, rel), "w", encoding="utf-8") as f:
                f.write(body)
        functions = scan(tmp)
        cases = [
            # (max_lines, known, expected problem fragments)
            (10, [], []),
            (9, [], ["server/long.cc:1: Long is 10 lines, over 9"]),
            (9, ["server/long.cc Long"], []),
            (10, ["server/long.cc Long"],
             ['entry "server/long.cc Long" no longer names']),
        ]
        for max_lines, known, want in cases:
            problems = check(functions, max_lines, known)
            ok = len(problems) == len(want) and all(
                w in p for w, p in zip(want, problems))
            if not ok:
                print(f"self-test: max {max_lines}, known {known}: got "
                      f"{problems}, want {want}", file=sys.stderr)
                failures += 1
    if failures:
        return 1
    print("self-test: the scanner finds the planted functions and the limit "
          "fails on a long one")
    return 0


def _default_root() -> str:
    me = os.path.abspath(__file__)
    srcdir = os.environ.get("TEST_SRCDIR")
    if srcdir:
        workspace = os.environ.get("TEST_WORKSPACE", "main")
        runfile = os.path.join(srcdir, workspace, "tests",
                               "function_length_check.py")
        if os.path.exists(runfile):
            me = runfile
    return os.path.dirname(os.path.dirname(os.path.realpath(me)))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=None,
                        help="the checkout (default: the one holding this "
                        "file)")
    parser.add_argument("--top", type=int, default=15,
                        help="how many of the longest functions to print")
    parser.add_argument("--max-lines", type=int, default=None,
                        help="fail on a function longer than this")
    parser.add_argument("--self-test", action="store_true",
                        help="check the scanner on planted sources")
    args = parser.parse_args(argv)
    if args.self_test:
        status = self_test()
        if status or args.max_lines is None:
            return status
    root = args.root or _default_root()
    if not os.path.isdir(os.path.join(root, "common")):
        print(f"function_length_check: {root} is not the checkout "
              "(no common/)", file=sys.stderr)
        return 2
    functions = scan(root)
    for fn in functions[:args.top]:
        print(f"{fn.lines:5d} {fn.path}:{fn.line} {fn.name}")
    if args.max_lines is None:
        return 0
    problems = check(functions, args.max_lines, KNOWN_LONG_FUNCTIONS)
    for p in problems:
        print(p, file=sys.stderr)
    if problems:
        print(f"function_length_check: FAILED: {len(problems)} problem(s)",
              file=sys.stderr)
        return 1
    print(f"function_length_check: no production function over "
          f"{args.max_lines} lines outside the known list")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
