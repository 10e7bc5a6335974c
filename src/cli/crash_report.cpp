#include "cli/crash_report.hpp"

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <initializer_list>

namespace mg::cli {
namespace {

// A copy, as a crash may come after main returns (a driver's teardown).
char crashed_command[64] = "";
constexpr int kMostFrames = 64;

// Only async-signal-safe calls: the heap or stdio may be what broke.
void write_text(const char* text) {
  size_t left = std::strlen(text);
  while (left > 0) {
    const ssize_t written = ::write(STDERR_FILENO, text, left);
    if (written <= 0) return;
    text += written;
    left -= static_cast<size_t>(written);
  }
}

const char* signal_text(int signal) {
  switch (signal) {
    case SIGSEGV:
      return "segmentation fault";
    case SIGBUS:
      return "bus error";
    case SIGILL:
      return "illegal instruction";
    default:
      return "arithmetic exception";
  }
}

void report_crash(int signal) {
  write_text("meganeura ");
  write_text(crashed_command);
  write_text(": internal error: ");
  write_text(signal_text(signal));
  write_text(
      ", a bug in meganeura or in the GPU driver: please report it with this command line, "
      "this output and the output of `meganeura devices --verbose`\n");
  // Where it happened, for the developers: each frame as binary(+offset), which addr2line turns
  // into a function with the same build. backtrace_symbols_fd allocates nothing.
  write_text("stack:\n");
  void* frames[kMostFrames];
  backtrace_symbols_fd(frames, backtrace(frames, kMostFrames), STDERR_FILENO);
  // The signal is blocked while its handler runs, so it takes its default action on return:
  // the process dies of it as without this handler, also when it came from kill().
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigemptyset(&default_action.sa_mask);
  sigaction(signal, &default_action, nullptr);
  raise(signal);
}

}  // namespace

void report_crashes(const char* command) {
  std::strncpy(crashed_command, command, sizeof crashed_command - 1);
  // backtrace loads the unwinder on its first call, which allocates: done here, not in the
  // handler, where the heap may be what broke.
  void* frame = nullptr;
  backtrace(&frame, 1);
  // A stack overflow leaves no stack for the handler to run on.
  static char handler_stack[1 << 16];
  stack_t stack{};
  stack.ss_sp = handler_stack;
  stack.ss_size = sizeof handler_stack;
  sigaltstack(&stack, nullptr);
  struct sigaction action {};
  action.sa_handler = report_crash;
  action.sa_flags = SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  for (const int signal : {SIGSEGV, SIGBUS, SIGILL, SIGFPE}) sigaction(signal, &action, nullptr);
}

}  // namespace mg::cli
