// `zico-umctl page`: one training job beyond its GPU's memory, simulated
// under the paging policies of prefetch/ and judged against the in-memory
// time and the lower bound (tools/page/paging_study.h).
#pragma once

namespace zico::umctl {

// argv holds the arguments after "page". Returns the process exit code.
int run_page(int argc, char** argv);

}  // namespace zico::umctl
