#pragma once

namespace mg::cli {

// Has a crash of the process (SIGSEGV, SIGBUS, SIGILL, SIGFPE: a bug in meganeura or in the GPU
// driver, since every user mistake is an error with a message) print one line naming `command`
// and what to report, then the stack (a frame a line), before the process dies of the signal as
// it would have (its exit status and any core dump unchanged).
void report_crashes(const char* command);

}  // namespace mg::cli
