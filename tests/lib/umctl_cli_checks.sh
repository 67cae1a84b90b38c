# Shared by the zico-umctl command tests (sourced, not run): a scratch
# folder and checks (cli_checks.sh), and runs of one command. Before sourcing, set
#   umctl    the zico-umctl binary
#   command  the command under test (page, simulate...)
# After the checks: finish (prints the count, exits 1 on any failure).
source "$(dirname "${BASH_SOURCE[0]}")/cli_checks.sh"

# zico-umctl COMMAND ARGS..., output in $out and $err, exit status in $status.
run() {
  "$umctl" "$command" "$@" >"$out" 2>"$err"
  status=$?
}

# A usage error: exit 2, and the last argument appears in stderr.
refuses() {
  local args=("${@:1:$#-1}") expect=${*: -1}
  run "${args[@]}"
  if [ "$status" -ne 2 ]; then fail "$command ${args[*]}: exit $status, expected 2"; return; fi
  grep -qF -- "$expect" "$err" || fail "$command ${args[*]}: stderr lacks '$expect'"
}
