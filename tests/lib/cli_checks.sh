# Shared by the command-line tests (sourced, not run): a scratch folder
# ($tmp; a command's output goes to $out and $err), checks that report
# failures and go on (fail), and finish (prints the count, exits 1 on any
# failure).
failures=0
tmp=$(mktemp -d)
out=$tmp/out
err=$tmp/err
trap 'rm -rf "$tmp"' EXIT

fail() {
  echo "FAIL: $*"
  echo "--- stdout"; head -c 2000 "$out"
  echo "--- stderr"; head -c 4000 "$err"
  failures=$((failures + 1))
}

finish() {
  [ "$failures" -eq 0 ] && echo "OK" || { echo "$failures failure(s)"; exit 1; }
}
