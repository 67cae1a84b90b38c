// `zico-umctl simulate`: training jobs from memory traces sharing one
// virtual GPU under a memory policy (tools/simulate/simulator.h), compared
// with each other and with the fixed-offset bound.
#pragma once

namespace zico::umctl {

// argv holds the arguments after "simulate". Returns the process exit code
// (exit_status.h).
int run_simulate(int argc, char** argv);

}  // namespace zico::umctl
