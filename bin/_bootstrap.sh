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
    if ! { "$VENV/bin/python" -m pip install --upgrade pip &&
           "$VENV/bin/python" -m pip install -e "$target"; } >"$VENV/install.log" 2>&1; then
      tail -n 30 "$VENV/install.log" >&2
      echo "conveyor: installing dependencies failed (full log: $VENV/install.log)" >&2
      return 1
    fi
    echo "$want" >>"$stamp"
  fi
}
