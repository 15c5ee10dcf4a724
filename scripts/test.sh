#!/bin/bash
# `make test`: the suite as two pytest processes side by side - the tests that start a real
# vLLM engine (`-m engine`, marked from the fixtures they use: tests/conftest.py) in one, in
# order, and everything else in the other - then one verdict.
#
#   scripts/test.sh [pytest arguments...]        TEST_SPLIT=0: one pytest process instead
#                                                (so does a -m of the caller's)
#
# Why two processes: most of the suite's time is waiting (engines loading, fleets starting,
# Ray), and the real-engine tests are the longest chain. Why not more: on a 2-core host two
# engines loading at once only slow each other, and every CPU engine is sized from the
# host's memory, so the real engines keep to one process, one after another as in a serial
# run. (pytest-xdist's `--dist loadgroup` would do the same, but 3.8.0 sets the node id
# through an attribute pytest 9 no longer reads, so its groups were silently ignored.)
# Each half gets its own --basetemp; its output is prefixed with its name, and its
# FAILED/ERROR summary lines are repeated after both end (CI keeps only the log's tail, and
# the halves' summaries interleave with the other half's durations). Exit status:
# the first failing half's; a half that selects no test (pytest's 5) counts as passed
# when the other ran some.
set -u
py=${PYTHON:-.venv/bin/python}
split=${TEST_SPLIT:-1}
for a in "$@"; do  # a marker selection of the caller's own: one process runs exactly it
  case $a in -m|-m*|--markexpr|--markexpr=*) split=0 ;; esac
done
if [ "$split" = 0 ]; then
  exec "$py" -m pytest "$@"
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/fleetserve-test.XXXXXX")
trap 'kill 0 2>/dev/null; rm -rf "$tmp"' INT TERM
half() {  # NAME MARKEXPR ARGS...: run one half, its lines prefixed; its status in $tmp/NAME.rc
  local name=$1 expr=$2; shift 2
  { "$py" -m pytest -m "$expr" --basetemp "$tmp/$name" "$@" 2>&1; echo $? > "$tmp/$name.rc"; } \
    | sed -u "s/^/[$name] /" | tee "$tmp/$name.log"
}
start=$(date +%s)
half engine "engine" "$@" &
half rest "not engine" "$@" &
wait
e=$(cat "$tmp/engine.rc" 2>/dev/null || echo 1); r=$(cat "$tmp/rest.rc" 2>/dev/null || echo 1)
for name in engine rest; do  # pytest's short summary of failures, and its last line
  grep -E "^\[$name\] (FAILED|ERROR) |^\[$name\] =+ .*(passed|failed|error|no tests ran)" \
    "$tmp/$name.log" 2>/dev/null
done
rm -rf "$tmp"
echo "make test: real-engine half exit $e, the rest exit $r, $(( $(date +%s) - start )) s"
if [ "$e" = 5 ] && [ "$r" = 5 ]; then exit 5; fi
[ "$e" = 5 ] && e=0; [ "$r" = 5 ] && r=0
[ "$e" != 0 ] && exit "$e"
exit "$r"
