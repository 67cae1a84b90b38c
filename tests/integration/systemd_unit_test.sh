#!/usr/bin/env bash
# The configured zico-umd.service: every @VAR@ expanded, ExecStart on the
# installed daemon, the runtime directory the one holding the default socket;
# then `systemd-analyze verify` (no running systemd needed) on a copy whose
# ExecStart names the daemon of this build, since the installed one may not
# exist yet. verify exits 0 on unknown keys and bad values, so any line it
# prints about the unit is a failure.
# Usage: systemd_unit_test.sh UNIT BINDIR BUILT_ZICO_UMD CONFIG_H [SYSTEMD_ANALYZE]
set -euo pipefail
unit=$1 bindir=$2 daemon=$3 config_h=$4 analyze=${5:-}
fail() { echo "FAIL: $*" >&2; exit 1; }

test -f "$unit" || fail "no unit at $unit"
if grep -n '@[A-Za-z_]*@' "$unit"; then fail "unexpanded @VARS@ in $unit"; fi
case $bindir in /*) ;; *) fail "BINDIR '$bindir' is not absolute" ;; esac
grep -qx "ExecStart=$bindir/zico-umd \$ZICO_UMD_ARGS" "$unit" || fail "ExecStart is not $bindir/zico-umd \$ZICO_UMD_ARGS"

# The unit's runtime directory must be where the code puts the socket by default.
socket=$(sed -n 's/.*kDefaultSocketPath = "\(.*\)";.*/\1/p' "$config_h")
test -n "$socket" || fail "no kDefaultSocketPath in $config_h"
dir=$(dirname "$socket")
grep -qx "RuntimeDirectory=${dir#/run/}" "$unit" || fail "RuntimeDirectory is not ${dir#/run/} (default socket $socket)"
grep -qx "ReadWritePaths=$dir" "$unit" || fail "ReadWritePaths is not $dir"
grep -qx "RuntimeDirectoryPreserve=restart" "$unit" || fail "the state file would not survive a restart"

if [ -n "$analyze" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  sed "s#^ExecStart=$bindir/zico-umd #ExecStart=$daemon #" "$unit" > "$work/zico-umd.service"
  out=$("$analyze" verify "$work/zico-umd.service" 2>&1) || fail "systemd-analyze verify: $out"
  if grep -F "zico-umd.service" <<<"$out"; then fail "systemd-analyze verify complained"; fi
  echo "systemd-analyze verify: clean"
else
  echo "systemd-analyze not found: static checks only"
fi
echo "unit OK"
