#!/usr/bin/env bash
# in_memory_cgroup.sh [--or-bare] LIMIT CMD [ARGS...]: runs CMD in a memory
# cgroup of its own, limited to LIMIT (bytes, or a number with K, M or G as
# the kernel reads it), beside this process's own cgroup. So that a test that
# passes here is shown not to depend on free host memory it does not use, and
# one that would take the machine down meets its limit instead.
#
# Exits with CMD's status; 137 (and "OOM kill" on stderr) where the kernel's
# OOM killer ended something in the cgroup. Where no memory cgroup can be
# made here (not root, no memory controller): 77 (skipped, with the reason),
# or with --or-bare, CMD runs without one (said on stderr).
set -u
or_bare=false
if [[ ${1:-} == --or-bare ]]; then
  or_bare=true
  shift
fi
if (($# < 2)); then
  echo "usage: $0 [--or-bare] LIMIT CMD [ARGS...]" >&2
  exit 2
fi
limit=$1
shift
command=("$@")
group=

skip() {
  [[ -n $group ]] && rmdir "$group" 2>/dev/null
  if $or_bare; then
    echo "in_memory_cgroup.sh: $1: running without a $limit memory cgroup" >&2
    exec "${command[@]}"
  fi
  echo "SKIP: $1: cannot run the test in a memory cgroup here" >&2
  exit 77
}

if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
  # cgroup v2: a child of this process's cgroup, which must pass the memory
  # controller down (a cgroup with processes cannot, unless it is the root).
  own=$(awk -F: '$1 == "0" { print $3 }' /proc/self/cgroup)
  parent=/sys/fs/cgroup${own%/}
  grep -qw memory "$parent/cgroup.subtree_control" 2>/dev/null ||
    echo +memory >"$parent/cgroup.subtree_control" 2>/dev/null ||
    skip "the cgroup v2 $parent does not pass the memory controller to its children"
  limit_file=memory.max
  swap_file=memory.swap.max
else
  own=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' /proc/self/cgroup)
  [[ -n $own ]] || skip "no cgroup v1 memory controller"
  parent=/sys/fs/cgroup/memory${own%/}
  limit_file=memory.limit_in_bytes
  swap_file=memory.memsw.limit_in_bytes
fi
mkdir "$parent/zicoum-test-$$" 2>/dev/null || skip "cannot create $parent/zicoum-test-$$ (not root?)"
group=$parent/zicoum-test-$$
cleanup() {
  # Whatever is left in it (a stray child) moves back out before it goes.
  if [[ -f $group/cgroup.procs ]]; then
    while read -r pid; do echo "$pid" >"$parent/cgroup.procs" 2>/dev/null; done <"$group/cgroup.procs"
  fi
  rmdir "$group" 2>/dev/null
}
trap cleanup EXIT
echo "$limit" >"$group/$limit_file" || skip "cannot set $limit_file to $limit"
# Swap would let the cgroup grow past its limit at the host's expense.
echo "$limit" >"$group/$swap_file" 2>/dev/null || true

oom_kills() {
  if [[ -f $group/memory.events ]]; then
    awk '$1 == "oom_kill" { print $2 }' "$group/memory.events"
  else
    awk '$1 == "oom_kill" { print $2 }' "$group/memory.oom_control" 2>/dev/null || echo 0
  fi
}

# The command joins the cgroup before it runs: a subshell moves itself, then execs.
(echo "$BASHPID" >"$group/cgroup.procs" && exec "${command[@]}")
status=$?
kills=$(oom_kills)
if [[ ${kills:-0} != 0 ]]; then
  echo "in_memory_cgroup.sh: $kills OOM kill(s) in the $limit cgroup (exit status $status)" >&2
  exit 137
fi
exit "$status"
