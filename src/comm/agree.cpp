// check_ranks_agree and file_fingerprint (include/clattn/comm.h): the start-up check every
// command run under mpirun makes (train, attend, bench-model), one mechanism for all of them.
#include <filesystem>
#include <fstream>

#include "clattn/comm.h"
#include "clattn/error.h"

namespace clattn {
namespace {

// FNV-1a: the fingerprint of a fact's value or of a file's bytes.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

}  // namespace

std::string file_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (path.empty() || !fs::is_regular_file(path, ec)) return "(no regular file)";
  const auto size = static_cast<int64_t>(fs::file_size(path, ec));
  std::ifstream in(path, std::ios::binary);
  constexpr int64_t kBlock = 64 * 1024, kBlocks = 16;
  std::vector<char> buf(static_cast<size_t>(kBlock));
  uint64_t h = fnv1a(&size, sizeof size);
  for (int64_t b = 0; b < kBlocks && in; ++b) {
    const int64_t at = size <= kBlock ? 0 : (size - kBlock) * b / (kBlocks - 1);
    in.seekg(at);
    in.read(buf.data(), kBlock);
    h = fnv1a(buf.data(), static_cast<size_t>(in.gcount()), h);
    if (size <= kBlock) break;
  }
  return detail::concat(size, " bytes, sampled hash ", h);
}

std::string bytes_fingerprint(const void* data, size_t n) {
  return detail::concat(n, " bytes, hash ", fnv1a(data, n));
}

void check_ranks_agree(Communicator& comm, const std::string& who,
                       const std::vector<std::pair<std::string, std::string>>& facts) {
  if (comm.size() <= 1) return;
  // The number of facts first: ranks whose lists differ in length would gather different sizes.
  const size_t n = facts.size(), R = static_cast<size_t>(comm.size());
  std::vector<uint64_t> counts(R);
  const uint64_t mine_n = n;
  comm.all_gather(&mine_n, sizeof mine_n, counts.data());
  for (size_t r = 1; r < R; ++r)
    check(counts[r] == counts[0], who, ": the ranks were started with different commands (rank ", r, " checks ",
          counts[r], " facts, rank 0 ", counts[0], "); every rank must run the same command on the same data");
  std::vector<uint64_t> mine(n), all(n * R);
  for (size_t i = 0; i < n; ++i) mine[i] = fnv1a(facts[i].second.data(), facts[i].second.size());
  comm.all_gather(mine.data(), n * sizeof(uint64_t), all.data());
  for (size_t i = 0; i < n; ++i) {
    std::string differ;
    for (size_t r = 1; r < R; ++r)
      if (all[r * n + i] != all[i]) differ += (differ.empty() ? "" : ", ") + std::to_string(r);
    check(differ.empty(), who, ": the ranks were started with different ", facts[i].first, ": rank(s) ", differ,
          " differ from rank 0 (this rank, ", comm.rank(), ", has '", facts[i].second,
          "'); every rank must run the same command on the same data");
  }
}

}  // namespace clattn
