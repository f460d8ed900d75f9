// A live one-line status on stderr for the commands that run for more than a few seconds (bench,
// bench-model, approx, eval, inspect, and gnuplot's drawing):
//
//   clattn bench: [3/12] improved-clustered:clusters=100 N=4096, call 2/5 | 14 s, ETA 41 s
//
// rewritten in place about twice a second, so the elapsed time moves during a long case; the ETA
// is the mean time of a finished unit times the units left. Only when stderr is a terminal:
// redirected or piped, nothing is written and no thread is started, so logs and CI output stay
// clean. CLATTN_PROGRESS=1 forces it on (tests), CLATTN_PROGRESS=0 off.
//
// Output of the command's own (table rows on stdout, notes on stderr) goes through above(), which
// clears the status line, prints, and draws it again below.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

namespace clattn::cli {

class Progress {
 public:
  // `cmd` names the command ("bench"); `total` the units of work (cases), 0 when unknown. `show`
  // false keeps it off (e.g. on every rank but the first).
  Progress(std::string cmd, int64_t total, bool show = true);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  bool enabled() const { return enabled_; }
  // `done` units are finished; `what` is running now (a case, its seed, its call).
  void set(int64_t done, std::string what);
  // Runs f (which prints) with the status line cleared, then draws it again.
  template <class F>
  void above(F&& f) {
    if (!enabled_) {
      f();
      return;
    }
    std::unique_lock<std::mutex> lock(mu_);
    clear_locked();
    f();
    draw_locked();
  }
  // Clears the line and stops redrawing (the destructor does it too).
  void finish();

  // Whether a status line is shown for this process (stderr a terminal, or CLATTN_PROGRESS).
  static bool wanted();

 private:
  void draw_locked();
  void clear_locked();
  void tick();

  std::string cmd_;
  int64_t total_ = 0, done_ = 0;
  std::string what_;
  bool enabled_ = false, drawn_ = false, stop_ = false;
  std::chrono::steady_clock::time_point t0_, done_at_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::thread ticker_;
};

}  // namespace clattn::cli
