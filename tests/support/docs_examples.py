"""The examples of the README and of each docs page, as a new user would run them.

Code blocks fenced as ``sh``, ``sql`` or ``python`` are examples; other fences (none,
``json``, ``text``) are output or shapes. An example that cannot run as written (a
fragment of a larger program, something that changes the machine rather than Conveyor)
says so on the line right above its fence: ``<!-- not run: the reason -->``. What an
example's output must show can be said there too, a line each: ``<!-- prints: text -->``.
A page whose
blocks are all commands rather than examples (benchmarks: minutes of load each) says so
once: ``<!-- no example on this page is run: the reason -->``.

A page's examples run in order against one fresh server and database, the way a reader
pastes them: ``sh`` in bash with ``set -e`` from a directory where ``./bin/conveyor`` (and
``conveyor``) is the CLI (``serve``, ``./bin/test`` and ``pip`` are no-ops: the server is
already running, the clients installed) and the aws CLI is on PATH, with no AWS
configuration; ``sql`` through psql; ``python`` in one
interpreter per page (top-level ``await`` allowed). The documented address
(127.0.0.1:9324, Queen's 6632, hq's 9999) is rewritten to the test server's.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = ("sh", "sql", "python")
_FENCE = re.compile(r"^```(\w*)\s*$")
_NOT_RUN = re.compile(r"^<!--\s*not run:\s*(.+?)\s*-->\s*$")
_PRINTS = re.compile(r"^<!--\s*prints:\s*(.+?)\s*-->\s*$")
_PAGE_NOT_RUN = re.compile(r"^<!--\s*no example on this page is run:\s*(.+?)\s*-->\s*$")
_ADDRESSES = re.compile(r"(127\.0\.0\.1|localhost):(9324|6632|9999)\b")
_DOCUMENTED_PORTS = {"9324": "port", "6632": "queen_port", "9999": "hq_port"}


@dataclass(frozen=True)
class Example:
    page: str
    line: int  # of the opening fence, 1-based
    lang: str
    code: str
    not_run: str | None  # the reason, when it is not run
    prints: tuple[str, ...] = ()  # what its output must show (``<!-- prints: ... -->`` above it)

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def examples(page: Path) -> list[Example]:
    """Every fenced ``sh``/``sql``/``python`` block of ``page``, in order."""
    found, lines = [], page.read_text().splitlines()
    whole = next((m.group(1) for m in map(_PAGE_NOT_RUN.match, lines) if m), None)
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        start, lang = i, fence.group(1)
        i += 1
        body = []
        while i < len(lines) and not lines[i].startswith("```"):
            body.append(lines[i])
            i += 1
        i += 1
        if lang in RUN:
            comments = []  # the comment lines right above the fence
            j = start - 1
            while j >= 0 and lines[j].startswith("<!--"):
                comments.append(lines[j])
                j -= 1
            not_run = next((m.group(1) for m in map(_NOT_RUN.match, comments) if m), whole)
            prints = tuple(reversed([m.group(1) for m in map(_PRINTS.match, comments) if m]))
            found.append(Example(str(page.relative_to(ROOT)), start + 1, lang, "\n".join(body) + "\n",
                                 not_run, prints))
    return found


@dataclass(frozen=True)
class Ports:
    """The test server's ports standing in for the documented ones."""

    port: int
    queen_port: int
    hq_port: int


def at(code: str, ports: Ports) -> str:
    return _ADDRESSES.sub(lambda m: f"127.0.0.1:{getattr(ports, _DOCUMENTED_PORTS[m.group(2)])}", code)


_CONVEYOR = """#!/bin/sh
# the CLI as ./bin/conveyor; `serve` is a no-op: the docs test runs the server itself
[ "$1" = serve ] && exit 0
exec {python} -m conveyor "$@"
"""

# one interpreter per page: it reads a file name a line, runs that block in the page's
# shared scope (top-level await allowed), and answers one line: "ok" or "failed"
_PY_RUNNER = textwrap.dedent("""
    import ast, asyncio, contextlib, sys, traceback, types
    scope = {"__name__": "__main__"}
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    answers = sys.stdout
    for line in sys.stdin:
        path = line.strip()
        try:
            with contextlib.redirect_stdout(sys.stderr):  # what the example prints is output, not an answer
                code = compile(open(path).read(), path, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
                result = eval(code, scope)
                if isinstance(result, types.CoroutineType):
                    loop.run_until_complete(result)
            answer = "ok"
        except BaseException:
            traceback.print_exc()
            answer = "failed"
        sys.stderr.flush()
        print(answer, file=answers, flush=True)
""")


class Reader:
    """Runs one page's examples in order in a scratch directory ``workdir``."""

    def __init__(self, workdir: Path, ports: Ports, database_url: str, timeout: float = 120.0) -> None:
        self.workdir, self.ports, self.timeout = workdir, ports, timeout
        (workdir / "bin").mkdir(parents=True, exist_ok=True)
        # ./bin/conveyor and a bare `conveyor` are the CLI; ./bin/test and pip install are
        # no-ops (the suite is what runs this; the test extra has every client installed)
        for name, script in (("conveyor", _CONVEYOR.format(python=sys.executable)),
                             ("test", "#!/bin/sh\nexit 0\n"), ("pip", "#!/bin/sh\nexit 0\n")):
            (workdir / "bin" / name).write_text(script)
            (workdir / "bin" / name).chmod(0o755)
        environ = {k: v for k, v in os.environ.items()
                   if not k.startswith(("AWS_", "CONVEYOR_")) and k != "DATABASE_URL"}
        self.env = {**environ, "DATABASE_URL": database_url, "HOME": str(workdir),
                    "PATH": f"{workdir / 'bin'}:{Path(sys.executable).parent}:{environ.get('PATH', '')}",
                    "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), environ.get("PYTHONPATH", "")])}
        self._interpreter: subprocess.Popen[str] | None = None
        self._blocks = 0

    def run(self, example: Example) -> tuple[bool, str]:
        """Run ``example``; whether it succeeded, and what it printed."""
        code = at(example.code, self.ports)
        if example.lang == "python":
            return self._python(code)
        if example.lang == "sh":
            argv, pasted = ["bash", "-e", "-o", "pipefail", "-c", code], None
        else:  # pasted into psql, as the pages say: meta-commands (\gset) work too
            argv, pasted = ["psql", self.env["DATABASE_URL"], "-v", "ON_ERROR_STOP=1", "-X"], code
        done = subprocess.run(argv, cwd=self.workdir, env=self.env, capture_output=True, text=True,
                              input=pasted, timeout=self.timeout)
        return done.returncode == 0, done.stdout + done.stderr

    def _python(self, code: str) -> tuple[bool, str]:
        if self._interpreter is None:
            self._log = (self.workdir / "python.log").open("w+")
            self._interpreter = subprocess.Popen(
                [sys.executable, "-c", _PY_RUNNER], cwd=self.workdir, env=self.env, text=True,
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log)
        assert self._interpreter.stdin is not None and self._interpreter.stdout is not None
        path = self.workdir / f"example_{self._blocks}.py"
        self._blocks += 1
        path.write_text(code)
        offset = self._log.tell()
        self._interpreter.stdin.write(f"{path}\n")
        self._interpreter.stdin.flush()
        ready, _, _ = select.select([self._interpreter.stdout], [], [], self.timeout)
        answer = self._interpreter.stdout.readline().strip() if ready else f"still running after {self.timeout:g}s"
        self._log.seek(offset)
        return answer == "ok", self._log.read()

    def close(self) -> None:
        if self._interpreter is not None:
            self._interpreter.kill()
            self._interpreter.wait(10)
            self._log.close()
