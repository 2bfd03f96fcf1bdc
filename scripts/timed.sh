# Sourced by scripts/test.sh and scripts/test_hardening.sh: `timed NAME COMMAND...` runs the
# command, prints how long it took (so that a CI log shows where its time goes; the aim is
# under 45 minutes on a 2-core machine) and returns the command's status.
timed() {
  local name="$1" start=$SECONDS status=0
  shift
  "$@" || status=$?
  echo "[timed] $name: $((SECONDS - start)) s" >&2
  return "$status"
}
