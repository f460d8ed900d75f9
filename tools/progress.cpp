#include "progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace clattn::cli {

namespace {

std::string seconds_text(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%d min %02d s", static_cast<int>(s) / 60, static_cast<int>(s) % 60);
  else std::snprintf(buf, sizeof buf, "%d h %02d min", static_cast<int>(s) / 3600, static_cast<int>(s) / 60 % 60);
  return buf;
}

// Columns of the terminal on stderr (the line must not wrap, or \r cannot rewrite it).
size_t columns() {
  struct winsize w {};
  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 20) return w.ws_col;
  return 100;
}

}  // namespace

bool Progress::wanted() {
  if (const char* v = std::getenv("CLATTN_PROGRESS"); v && *v) return std::strcmp(v, "0") != 0;
  return isatty(STDERR_FILENO) == 1;
}

Progress::Progress(std::string cmd, int64_t total, bool show)
    : cmd_(std::move(cmd)), total_(total), enabled_(show && wanted()), t0_(std::chrono::steady_clock::now()),
      done_at_(t0_) {
  if (enabled_) ticker_ = std::thread([this] { tick(); });
}

Progress::~Progress() { finish(); }

void Progress::set(int64_t done, std::string what) {
  if (!enabled_) return;
  std::unique_lock<std::mutex> lock(mu_);
  if (done != done_) done_at_ = std::chrono::steady_clock::now();
  done_ = done;
  what_ = std::move(what);
  draw_locked();
}

void Progress::finish() {
  if (!enabled_) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) return;
    stop_ = true;
    clear_locked();
  }
  cv_.notify_all();
  if (ticker_.joinable()) ticker_.join();
}

void Progress::tick() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(500));
    if (!stop_) draw_locked();
  }
}

void Progress::draw_locked() {
  if (stop_) return;
  using namespace std::chrono;
  const auto now = steady_clock::now();
  const double elapsed = duration<double>(now - t0_).count();
  // A stream, not string concatenation: GCC 12 warns falsely (-Wrestrict) on `"[" + to_string(...)`.
  std::ostringstream os;
  os << "clattn " << cmd_ << ": ";
  if (total_ > 0) os << "[" << std::min(done_ + 1, total_) << "/" << total_ << "] ";
  os << what_ << " | " << seconds_text(elapsed);
  if (total_ > 0 && done_ > 0 && done_ < total_) {
    // Mean time of a finished unit times the units left, less what the current one has run.
    const double per = duration<double>(done_at_ - t0_).count() / static_cast<double>(done_);
    const double left = per * static_cast<double>(total_ - done_) - duration<double>(now - done_at_).count();
    os << ", ETA " << seconds_text(left > 0 ? left : 0);
  }
  std::string line = os.str();
  const size_t width = columns() - 1;
  if (line.size() > width) {
    line.resize(width - 3);
    line += "...";
  }
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void Progress::clear_locked() {
  if (!drawn_) return;
  std::fputs("\r\033[K", stderr);
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace clattn::cli
