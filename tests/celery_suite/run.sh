#!/usr/bin/env bash
# Run Celery's own integration suite (t/integration/test_canvas.py and test_tasks.py from
# the sdist of the installed Celery) with priority-router installed on the suite's apps.
#
# usage: tests/celery_suite/run.sh [redis|amqp|both] [--without-router] [-- extra pytest args]
#
# Environment (all optional):
#   CELERY_SUITE_HOME   work dir (default /work/main/.celery-suite, git-ignored)
#   CELERY_SUITE_TAG    suffix of the result files (default: none for a full run,
#                       "partial-<time>" when extra pytest args are given)
#   CELERY_SUITE_TIMEOUT  per-test timeout in seconds (default 300). It is armed for each
#                       attempt of the test function (timeout_func_only): with the whole-
#                       protocol default, pytest-timeout arms one timer for all of the
#                       @flaky re-runs, so a re-run that hangs is never stopped.
#   REDIS_HOST/REDIS_PORT  the Redis for broker, backend and counter (127.0.0.1:6379)
#   AMQP_URL            RabbitMQ (default amqp://guest:guest@127.0.0.1:5672//)
#   CELERY_SUITE_RUN_TIMEOUT  seconds for a whole pytest run (default 3600)
#   CELERY_SUITE_ROUTER_SRC  a folder holding another priority_router/ to test (e.g. an
#                       older commit: git archive REV priority_router | tar -x -C DIR)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
HOME_DIR="${CELERY_SUITE_HOME:-$ROOT/.celery-suite}"
VENV="$HOME_DIR/venv"
RESULTS="$HOME_DIR/results"
PROJECT_PY="$ROOT/.venv/bin/python"
REDIS_HOST="${REDIS_HOST:-127.0.0.1}"
REDIS_PORT="${REDIS_PORT:-6379}"
REDIS_BASE="redis://$REDIS_HOST:$REDIS_PORT"
# Dbs of our own: the suite's tasks use db 0 (t/integration/tasks.py) and the project's
# tests use 13-15.
BROKER_DB=3
BACKEND_DB=4
ROUTER_DB=5
AMQP_URL="${AMQP_URL:-amqp://guest:guest@127.0.0.1:5672//}"
TIMEOUT="${CELERY_SUITE_TIMEOUT:-300}"
TEST_FILES=(t/integration/test_canvas.py t/integration/test_tasks.py)

usage() { sed -n '4p' "$0" | sed 's/^# //'; exit 2; }

target=redis
with_router=1
extra=()
while (($#)); do
  case "$1" in
    redis | amqp | both) target="$1" ;;
    --without-router) with_router=0 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) usage ;;
    *) echo "run.sh: unknown argument $1" >&2; usage ;;
  esac
  shift
done

log() { echo "celery-suite: $*"; }

port_open() { (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }

# -- the virtualenv (created once; pytest plugins stay out of the project's .venv) ------
ensure_venv() {
  [[ -x "$PROJECT_PY" ]] || { echo "run.sh: $PROJECT_PY missing: run 'make test' once first" >&2; exit 1; }
  local want_py
  want_py="$("$PROJECT_PY" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')"
  if [[ -x "$VENV/bin/python" ]] &&
    [[ "$("$VENV/bin/python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')" != "$want_py" ]]; then
    log "recreating $VENV (Python differs from $PROJECT_PY)"
    rm -rf "$VENV"
  fi
  if [[ ! -x "$VENV/bin/python" ]]; then
    log "creating $VENV with $PROJECT_PY ($want_py)"
    "$PROJECT_PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
  fi
  # The same Celery/kombu as the project's venv, so the suite tests what the project uses.
  local pins
  pins="$("$PROJECT_PY" -c 'import celery, kombu; print(f"celery=={celery.__version__} kombu=={kombu.__version__}")')"
  local stamp="$VENV/.project-installed"
  local key="$pins $(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
  if [[ "$(cat "$stamp" 2>/dev/null)" != "$key" ]]; then
    log "installing the project (-e $ROOT) and $pins into $VENV"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT" $pins
    echo "$key" >"$stamp"
  fi
}

# -- the Celery sdist: t/integration and its pinned test requirements -----------------
ensure_sdist() {
  VERSION="$("$VENV/bin/python" -c 'import celery; print(celery.__version__)')"
  SDIST="$HOME_DIR/celery-$VERSION"
  if [[ ! -d "$SDIST/t/integration" ]]; then
    local archive="$HOME_DIR/celery-$VERSION.tar.gz"
    if [[ ! -f "$archive" ]]; then
      log "downloading the celery==$VERSION source distribution"
      "$VENV/bin/python" -m pip download --quiet --no-deps --no-binary :all: "celery==$VERSION" -d "$HOME_DIR"
    fi
    tar -xzf "$archive" -C "$HOME_DIR"
  fi
  # pytest puts the sdist's root first on sys.path (t/ is a package); move the source
  # copy of celery aside so the suite runs the installed Celery, as a user's app does.
  if [[ -d "$SDIST/celery" ]]; then
    mv "$SDIST/celery" "$SDIST/celery.sdist-source-unused"
  fi
  local stamp="$VENV/.suite-requirements"
  if [[ "$(cat "$stamp" 2>/dev/null)" != "$VERSION" ]]; then
    # Only what t/integration/conftest.py, tasks.py and the two test files import or use:
    # pytest, pytest-timeout (the timeout marker), pytest-rerunfailures (the flaky marker)
    # and pydantic (tasks.py); redis and amqp come with the project.  pytest >= 9 has the
    # subtests fixture built in, so pytest-subtests is not needed.
    local reqs
    reqs="$(grep -hE '^(pytest|pytest-timeout|pytest-rerunfailures|pydantic)==' \
      "$SDIST/requirements/test.txt" "$SDIST/requirements/extras/pydantic.txt" | sed 's/;.*//' | tr '\n' ' ')"
    log "installing the suite's test requirements: $reqs"
    # shellcheck disable=SC2086
    "$VENV/bin/python" -m pip install --quiet $reqs
    echo "$VERSION" >"$stamp"
  fi
  local where
  where="$(cd /tmp && "$VENV/bin/python" -c 'import celery, os; print(os.path.dirname(celery.__file__))')"
  [[ "$where" == "$VENV"/* ]] || { echo "run.sh: celery is imported from $where, not $VENV" >&2; exit 1; }
}

# -- one run ---------------------------------------------------------------------------
summary() { # junit.xml label seconds
  "$VENV/bin/python" - "$@" <<'PY'
import sys
import xml.etree.ElementTree as ET

path, label, seconds = sys.argv[1], sys.argv[2], int(sys.argv[3])
counts = dict(passed=0, failed=0, skipped=0, errors=0, rerun=0)
try:
    root = ET.parse(path).getroot()
except (OSError, ET.ParseError) as exc:
    print(f"celery-suite: {label}: no junit report ({exc})")
    sys.exit(0)
# pytest-rerunfailures writes one <testcase> per attempt: the last one is the outcome.
last = {}
for case in root.iter("testcase"):
    key = (case.get("classname"), case.get("name"))
    if key in last:
        counts["rerun"] += 1
    last[key] = case
for case in last.values():
    kinds = {child.tag for child in case}
    if "error" in kinds:
        counts["errors"] += 1
    elif "failure" in kinds:
        counts["failed"] += 1
    elif "skipped" in kinds:
        counts["skipped"] += 1
    else:
        counts["passed"] += 1
parts = " ".join(f"{k}={v}" for k, v in counts.items())
print(f"celery-suite: {label}: {parts} time={seconds // 60}m{seconds % 60:02d}s junit={path}")
PY
}

run_one() { # broker
  local broker="$1" mode broker_url tag name
  mode=$([[ $with_router == 1 ]] && echo router || echo baseline)
  if [[ $broker == redis ]]; then
    broker_url="$REDIS_BASE/$BROKER_DB"
  else
    broker_url="$AMQP_URL"
  fi
  tag="${CELERY_SUITE_TAG:-}"
  if [[ -z $tag && ${#extra[@]} -gt 0 ]]; then tag="partial-$(date +%Y%m%d-%H%M%S)"; fi
  name="$broker-$mode${tag:+-$tag}"
  mkdir -p "$RESULTS"
  local junit="$RESULTS/$name.xml" logfile="$RESULTS/$name.log"
  rm -f "$junit"

  # A fresh start, as Celery's CI has with new containers: empty broker and backend dbs,
  # and on RabbitMQ no leftover 'celery' queue (one declared by a baseline run lacks
  # x-max-priority, and a worker with the router refuses to start on it).
  "$VENV/bin/python" - "$broker" "$broker_url" "$REDIS_BASE" "$BROKER_DB" "$BACKEND_DB" "$ROUTER_DB" <<'PY'
import sys

import redis
from kombu import Connection

broker, url, base, broker_db, backend_db, router_db = sys.argv[1:]
if broker == "redis":
    redis.Redis.from_url(f"{base}/{broker_db}").flushdb()
redis.Redis.from_url(f"{base}/{backend_db}").flushdb()
r = redis.Redis.from_url(f"{base}/{router_db}")
for key in r.scan_iter("celery-suite:*"):
    r.delete(key)
if broker == "amqp":
    with Connection(url) as conn:
        try:
            conn.default_channel.queue_delete("celery")
        except Exception as exc:  # absent already
            print(f"celery-suite: queue_delete('celery'): {exc}")
PY

  local -a env_args=(TEST_BROKER="$broker_url" TEST_BACKEND="$REDIS_BASE/$BACKEND_DB"
    REDIS_HOST="$REDIS_HOST" REDIS_PORT="$REDIS_PORT")
  # Celery's fixtures come from celery.contrib.pytest; Celery's CI gets it registered
  # through pytest-celery, the Celery docs' other way is -p celery.contrib.pytest.
  local -a plugin_args=(-p celery.contrib.pytest)
  if [[ $with_router == 1 ]]; then
    env_args+=(PYTHONPATH="${CELERY_SUITE_ROUTER_SRC:+$CELERY_SUITE_ROUTER_SRC:}$HERE"
      CELERY_SUITE_ROUTER_REDIS_URL="$REDIS_BASE/$ROUTER_DB")
    plugin_args+=(-p plugin)
  fi
  local -a selection=("${TEST_FILES[@]}")
  # Node ids or paths given after -- replace the default files.
  for arg in "${extra[@]}"; do
    if [[ $arg == t/* ]]; then selection=(); break; fi
  done

  log "$broker/$mode: TEST_BROKER=$broker_url TEST_BACKEND=$REDIS_BASE/$BACKEND_DB" \
    "router=$([[ $with_router == 1 ]] && echo "$REDIS_BASE/$ROUTER_DB(prefix celery-suite:)" || echo off)" \
    "log=$logfile"
  # The router is installed editable: record which state of priority_router/ this run used.
  local state
  state="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo no-git)"
  state+="+$( (git -C "$ROOT" diff HEAD -- priority_router; git -C "$ROOT" ls-files --others --exclude-standard \
    -z -- priority_router | xargs -0r cat) 2>/dev/null | sha1sum | cut -c1-10)"
  log "$broker/$mode: priority_router state $state (commit+hash of uncommitted changes)"
  if [[ $with_router == 1 && -n ${CELERY_SUITE_ROUTER_SRC:-} ]]; then
    log "$broker/$mode: priority_router imported from $CELERY_SUITE_ROUTER_SRC instead"
  fi
  local start rc=0
  start=$(date +%s)
  # A hang that pytest-timeout cannot interrupt (seen: a @flaky re-run of test_expired on
  # RabbitMQ) would stall the run: the whole run gets CELERY_SUITE_RUN_TIMEOUT seconds.
  (cd "$SDIST" && timeout --kill-after=30 "${CELERY_SUITE_RUN_TIMEOUT:-3600}" \
    env -u PYTHONPATH "${env_args[@]}" "$VENV/bin/python" -m pytest "${plugin_args[@]}" \
    -v -rfE -p no:cacheprovider --timeout="$TIMEOUT" -o timeout_func_only=true \
    --junitxml="$junit" -o junit_family=xunit2 -o junit_suite_name="celery-suite-$broker-$mode" \
    "${selection[@]}" "${extra[@]}") >"$logfile" 2>&1 || rc=$?
  local elapsed=$(($(date +%s) - start))
  tail -n 3 "$logfile" | sed -e 's/^/  | /' -e '$a\'
  SUMMARIES+=("$(summary "$junit" "$broker/$mode" "$elapsed")")
  echo "${SUMMARIES[-1]}"
  # pytest: 0 all passed, 1 some failed, 5 nothing collected; anything else is a harness error.
  if ((rc == 124)); then
    log "$broker/$mode: STOPPED after CELERY_SUITE_RUN_TIMEOUT=${CELERY_SUITE_RUN_TIMEOUT:-3600}s" \
      "(a hang); the last test started is at the end of $logfile"
  elif ((rc != 0 && rc != 1)); then
    log "pytest exited $rc for $broker/$mode (see $logfile)"
  fi
  ((rc > STATUS)) && STATUS=$rc
  return 0
}

SUMMARIES=()
STATUS=0
port_open "$REDIS_HOST" "$REDIS_PORT" || { echo "run.sh: no Redis on $REDIS_HOST:$REDIS_PORT" >&2; exit 1; }
ensure_venv
ensure_sdist
log "celery $VERSION suite at $SDIST"

brokers=()
case "$target" in
  redis) brokers=(redis) ;;
  amqp) brokers=(amqp) ;;
  both) brokers=(redis amqp) ;;
esac
for broker in "${brokers[@]}"; do
  if [[ $broker == amqp ]]; then
    hostport="${AMQP_URL#*://}"; hostport="${hostport#*@}"; hostport="${hostport%%/*}"
    if ! port_open "${hostport%%:*}" "${hostport##*:}"; then
      log "amqp: SKIPPED, RabbitMQ does not answer on $hostport"
      SUMMARIES+=("celery-suite: amqp/$([[ $with_router == 1 ]] && echo router || echo baseline): skipped (no RabbitMQ on $hostport)")
      continue
    fi
  fi
  run_one "$broker"
done

echo
printf '%s\n' "${SUMMARIES[@]}"
exit "$STATUS"
