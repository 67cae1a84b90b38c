#!/usr/bin/env bash
# The example alerting rules (tools/prometheus/alerts.yml): valid for
# promtool, and each alert fires when, and only when, tests/integration/
# prometheus/alerts_test.yml says. Skips (77) without promtool.
# Usage: prometheus_rules_test.sh ALERTS_YML ALERTS_TEST_YML
set -u
rules=$1
unit_tests=$2
if ! command -v promtool >/dev/null; then
  echo "SKIP: promtool not found on PATH (Debian: apt-get install --no-install-recommends prometheus)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

promtool check rules "$rules" || { echo "FAIL: promtool check rules $rules"; exit 1; }

# The unit tests pin when alerts fire and their labels; the annotations are
# prose for people, so they go from the copy promtool tests (it would compare
# them word for word): an `annotations:` line and the lines indented below it.
awk '
  skip && match($0, /^ */) && RLENGTH <= indent && $0 !~ /^ *$/ { skip = 0 }
  /^ *annotations:/ { skip = 1; match($0, /^ */); indent = RLENGTH; next }
  !skip { print }
' "$rules" >"$tmp/alerts.yml"
grep -q 'annotations' "$tmp/alerts.yml" && { echo "FAIL: annotations left in the copy"; exit 1; }
[[ $(grep -c '^ *- alert:' "$tmp/alerts.yml") == $(grep -c '^ *- alert:' "$rules") ]] ||
  { echo "FAIL: the copy lost alerts"; exit 1; }
cp "$unit_tests" "$tmp/alerts_test.yml"

# Every alert of the rules file has a unit test.
missing=0
for alert in $(sed -n 's/^ *- alert: *//p' "$rules"); do
  grep -q "alertname: $alert\b" "$unit_tests" || { echo "FAIL: no unit test for $alert"; missing=1; }
done
((missing == 0)) || exit 1

(cd "$tmp" && promtool test rules alerts_test.yml) || { echo "FAIL: promtool test rules"; exit 1; }
echo OK
