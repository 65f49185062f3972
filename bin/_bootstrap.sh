# Shared by bin/conveyor and bin/test: make .venv and install the project into it.
# Re-installs only when pyproject.toml changed since the last install.
VENV="${CONVEYOR_VENV:-$here/.venv}"
bootstrap() {
  local extras="$1" stamp want python
  python="${PYTHON:-python3}"
  if [ ! -x "$VENV/bin/python" ]; then
    "$python" -m venv "$VENV" >&2
  fi
  want="$(cat "$here/pyproject.toml" "$here/bin/_bootstrap.sh" | cksum | cut -d' ' -f1)-$extras"
  stamp="$VENV/.conveyor-installed"
  if [ ! -f "$stamp" ] || ! grep -qx -- "$want" "$stamp"; then
    echo "conveyor: installing dependencies into $VENV" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    if [ -n "$extras" ]; then
      "$VENV/bin/python" -m pip install --quiet -e "$here[$extras]" >&2
    else
      "$VENV/bin/python" -m pip install --quiet -e "$here" >&2
    fi
    echo "$want" >>"$stamp"
  fi
}
