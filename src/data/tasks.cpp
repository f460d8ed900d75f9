// make_task (include/clattn/data.h) and the file reading the tasks share.
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "clattn/error.h"
#include "data/tasks.h"

namespace clattn {

namespace data {

std::string read_file_bytes(const std::string& path) {
  check(!path.empty(), "data: no file given");
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) fail(path, ": cannot open (", std::strerror(errno), ")");
  check(!S_ISDIR(st.st_mode), path, ": is a directory, not a data file");
  std::ifstream f(path, std::ios::binary);
  check(f.good(), path, ": cannot open for reading (", std::strerror(errno), ")");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  check(!f.bad(), path, ": read error");
  return s;
}

}  // namespace data

std::unique_ptr<Task> make_task(const TaskOptions& opt) {
  if (opt.kind == "listops") return data::make_listops_task(opt);
  if (opt.kind == "mlm" || opt.kind == "lm")
    check(!opt.data.empty(), opt.kind, ": needs a text file to read (data)");
  if (opt.kind == "mlm") return data::make_text_task(opt, TaskKind::mlm);
  if (opt.kind == "lm") return data::make_text_task(opt, TaskKind::lm);
  fail("data: unknown task '", opt.kind, "' (expected listops, mlm or lm)");
}

}  // namespace clattn
