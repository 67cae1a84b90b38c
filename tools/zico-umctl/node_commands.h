// The zico-umctl commands that talk to zico-umd, one file each. argv holds
// the arguments after the command's name; each returns the exit status
// (exit_status.h).
#pragma once

namespace zico::umctl {

int run_status(int argc, char** argv);   // status_command.cpp
int run_jobs(int argc, char** argv);     // jobs_command.cpp
int run_budget(int argc, char** argv);   // budget_command.cpp
int run_suspend(int argc, char** argv);  // suspend_command.cpp
int run_resume(int argc, char** argv);   // suspend_command.cpp
int run_top(int argc, char** argv);      // top_command.cpp

}  // namespace zico::umctl
