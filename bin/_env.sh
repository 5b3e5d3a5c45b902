# Shared by the scripts in bin/: find Python 3.11+, check Java, and create the project's
# virtual environment (.venv) with event_etl installed, on first use or when setup.cfg changed.
# Source it; then call ensure_venv [EXTRAS] (comma-separated extras of setup.cfg: job, graphs, otlp, all, test).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EVENT_ETL_VENV:-$ROOT/.venv}"

die() { echo "error: $1" >&2; [ -n "${2:-}" ] && echo "  fix: $2" >&2; exit 1; }

find_python() {
  local c
  for c in "${EVENT_ETL_PYTHON:-}" python3.13 python3.12 python3.11 python3; do
    [ -n "$c" ] || continue
    if command -v "$c" >/dev/null 2>&1 && "$c" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  die "Python 3.11 or newer was not found" "install it (e.g. 'sudo apt-get install python3 python3-venv'), or set EVENT_ETL_PYTHON=/path/to/python3.11"
}

check_java() {
  if [ -n "${JAVA_HOME:-}" ] && [ -x "$JAVA_HOME/bin/java" ]; then return 0; fi
  if command -v java >/dev/null 2>&1; then return 0; fi
  die "Java was not found; Spark needs Java 17 (or 21)" \
      "install it: 'sudo apt-get install -y openjdk-17-jre-headless' (Debian/Ubuntu) or 'brew install openjdk@17' (macOS), then open a new shell or set JAVA_HOME"
}

ensure_venv() {
  local extras="${1:-}" spec="." stamp sum py
  [ -n "$extras" ] && spec=".[${extras}]"
  sum="$(cat "$ROOT/setup.cfg" "$ROOT/pyproject.toml" 2>/dev/null | cksum | cut -d' ' -f1)-${extras:-run}"
  stamp="$VENV/.event_etl-installed-$sum"
  # an environment installed with every extra (bin/test's all,test) serves every other command too
  if [ -f "$VENV/.event_etl-installed-${sum%-*}-all,test" ]; then return 0; fi
  if [ ! -f "$stamp" ]; then
    py="$(find_python)"
    if [ ! -x "$VENV/bin/python" ]; then
      echo "event_etl: creating $VENV with $($py --version 2>&1)" >&2
      "$py" -m venv "$VENV" || die "could not create $VENV" "install the venv module (e.g. 'sudo apt-get install python3-venv')"
    fi
    echo "event_etl: installing event_etl${extras:+ with [$extras]} and its dependencies (first run takes a few minutes)" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2 || true
    # pip's and the build backend's notes (setuptools' "Editable installation" box) go to a log, shown on failure
    if ! (cd "$ROOT" && "$VENV/bin/python" -m pip install --quiet -e "$spec") >"$VENV/.event_etl-install.log" 2>&1; then
      cat "$VENV/.event_etl-install.log" >&2
      die "installing the dependencies failed (see above; also in $VENV/.event_etl-install.log)" \
        "check the network access to PyPI, then run the command again"
    fi
    rm -f "$VENV"/.event_etl-installed-*-"${extras:-run}" 2>/dev/null || true
    touch "$stamp"
    ensure_jvm_archive
  fi
}

# The archive of Spark's JVM classes (`event-etl warmup`): every later job's JVM starts ~2.5 s sooner.
# Built once after an install (~20 s); a job runs as before without it, so a failure here is only a note.
ensure_jvm_archive() {
  "$VENV/bin/python" -c 'import pyspark' 2>/dev/null || return 0  # no job extra: no Spark to start
  "$VENV/bin/event-etl" warmup --check >/dev/null 2>&1 && return 0
  echo "event_etl: building the archive of Spark's JVM classes for faster job starts (once, ~20 s)" >&2
  "$VENV/bin/event-etl" warmup >&2 || echo "event_etl: no class archive (see above); jobs start without it" >&2
}

# Prometheus and promtool (Debian package `prometheus`) for the monitoring tests.
ensure_prometheus() {
  command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  if command -v apt-get >/dev/null 2>&1 && { [ -z "$sudo" ] || command -v sudo >/dev/null 2>&1; }; then
    echo "event_etl: installing Prometheus (apt-get install -y prometheus) for the monitoring tests" >&2
    { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq prometheus; } >&2 || true
  fi
  command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 \
    || die "Prometheus (prometheus and promtool) is missing; the monitoring tests need it" \
           "install it: 'sudo apt-get install -y prometheus' (Debian/Ubuntu) or 'brew install prometheus' (macOS)"
}
