// `zico-umctl replay`: replays memory traces against zicoum's allocator and
// the baselines, in one run, and reports memory footprint and allocator cost.
#pragma once

namespace zico::umctl {

// argv holds the arguments after "replay". Returns the process exit code.
int run_replay(int argc, char** argv);

}  // namespace zico::umctl
