# Shared by bin/conveyor and bin/test: make .venv and install the project into it.
# Re-installs only when pyproject.toml or this file changed since the last install.
VENV="${CONVEYOR_VENV:-$here/.venv}"
bootstrap() {
  local extras="$1" stamp want python target
  python="${PYTHON:-python3}"
  # No PostgreSQL server on this machine: take its binaries from PyPI (extra "embedded")
  if ! command -v pg_ctl >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    extras="${extras:+$extras,}embedded"
  fi
  if [ ! -x "$VENV/bin/python" ]; then
    "$python" -m venv "$VENV" >&2
  fi
  want="$(cat "$here/pyproject.toml" "$here/bin/_bootstrap.sh" | cksum | cut -d' ' -f1)-$extras"
  stamp="$VENV/.conveyor-installed"
  if [ ! -f "$stamp" ] || ! grep -qx -- "$want" "$stamp"; then
    echo "conveyor: installing dependencies into $VENV (log: $VENV/install.log)" >&2
    target="$here"
    [ -n "$extras" ] && target="$here[$extras]"
    # uv (from PyPI, into the venv) resolves and installs in parallel: about half of
    # pip's time on a fresh machine (43 s against 96 s, measured); pip is the fallback.
    # --compile-bytecode writes the .pyc files at install, as pip does: where
    # PYTHONDONTWRITEBYTECODE is set, every process would otherwise compile every module
    # it imports, every time (a server start: 1.6 s of CPU, half of it compiling)
    if ! { "$VENV/bin/python" -m pip install --upgrade pip uv &&
           { "$VENV/bin/python" -m uv pip install --compile-bytecode --python "$VENV/bin/python" -e "$target" ||
             "$VENV/bin/python" -m pip install -e "$target"; }; } >"$VENV/install.log" 2>&1; then
      tail -n 30 "$VENV/install.log" >&2
      echo "conveyor: installing dependencies failed (full log: $VENV/install.log)" >&2
      return 1
    fi
    echo "$want" >>"$stamp"
  fi
  # the project's own modules likewise (an editable install: they live in src/); cheap
  # when nothing changed since the last time
  "$VENV/bin/python" -m compileall -q "$here/src" >/dev/null 2>&1 || true
}
