// A crash of `meganeura` (a bug in it or in the GPU driver) prints one line that says so and
// what to report, then the stack, and the process still dies of the signal.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <string>

#include "cli/cli_runner.hpp"

namespace {

struct Crash {
  int signal = 0;
  std::string what;
};

class CliCrashReport : public testing::TestWithParam<Crash> {};

// Kills the command when a check ends the test before the command has died.
struct ReapChild {
  pid_t pid = -1;
  ~ReapChild() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
  }
};

// `meganeura generate` blocks opening a model folder whose config.json is a FIFO until a writer
// opens it, then reading it: a known place to deliver the signal, as a fault would be.
TEST_P(CliCrashReport, OneLineAndDeathBySignal) {
  const Crash crash = GetParam();
  const std::filesystem::path folder =
      cli_test::scratch_folder("crash", std::to_string(crash.signal));
  const std::filesystem::path config = folder / "config.json";
  ASSERT_EQ(::mkfifo(config.c_str(), 0600), 0);
  int stderr_pipe[2];
  ASSERT_EQ(::pipe(stderr_pipe), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::dup2(stderr_pipe[1], STDERR_FILENO);
    ::close(stderr_pipe[0]);
    ::close(stderr_pipe[1]);
    ::execl(MEGANEURA_BINARY, MEGANEURA_BINARY, "generate", folder.c_str(), "--prompt", "hello",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  ReapChild reap{child};
  ::close(stderr_pipe[1]);
  // Opening the FIFO for writing succeeds once the command has opened it for reading; a command
  // that ended before then (it would have refused the folder) fails the test instead of hanging.
  int writer = -1;
  for (int attempt = 0; attempt < 3000; ++attempt) {
    writer = ::open(config.c_str(), O_WRONLY | O_NONBLOCK);
    if (writer >= 0) break;
    int early_status = 0;
    if (::waitpid(child, &early_status, WNOHANG) == child) {
      reap.pid = -1;
      FAIL() << "the command ended before reading its config.json";
    }
    ::usleep(10000);
  }
  ASSERT_GE(writer, 0) << "the command never opened the FIFO";
  ASSERT_EQ(::kill(child, crash.signal), 0);
  std::string output;
  char buffer[512];
  while (const ssize_t read = ::read(stderr_pipe[0], buffer, sizeof buffer)) {
    if (read < 0) break;
    output.append(buffer, static_cast<size_t>(read));
  }
  ::close(stderr_pipe[0]);
  ::close(writer);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  reap.pid = -1;
  ASSERT_TRUE(WIFSIGNALED(status)) << output;
  EXPECT_EQ(WTERMSIG(status), crash.signal);
  EXPECT_EQ(output.rfind("meganeura generate: internal error: " + crash.what + ", a bug in ", 0),
            0u)
      << output;
  EXPECT_NE(output.find("meganeura devices --verbose"), std::string::npos) << output;
  // Then the stack, a frame a line: the handler's, and below the signal's the command's own
  // frames in the binary (binary(+offset) or binary(function+offset)).
  const size_t first_line_end = output.find('\n');
  ASSERT_NE(first_line_end, std::string::npos) << output;
  EXPECT_EQ(output.compare(first_line_end + 1, 7, "stack:\n"), 0) << output;
  size_t frames_in_binary = 0;
  for (size_t at = output.find("meganeura(", first_line_end); at != std::string::npos;
       at = output.find("meganeura(", at + 1))
    ++frames_in_binary;
  EXPECT_GE(frames_in_binary, 2u) << output;
  std::filesystem::remove_all(folder);
}

INSTANTIATE_TEST_SUITE_P(Signals, CliCrashReport,
                         testing::Values(Crash{SIGSEGV, "segmentation fault"},
                                         Crash{SIGBUS, "bus error"},
                                         Crash{SIGFPE, "arithmetic exception"}),
                         [](const testing::TestParamInfo<Crash>& info) {
                           return info.param.signal == SIGSEGV  ? std::string("Segv")
                                  : info.param.signal == SIGBUS ? std::string("Bus")
                                                                : std::string("Fpe");
                         });

}  // namespace
