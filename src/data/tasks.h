// The task builders make_task (tasks.cpp) dispatches to, and the file reading they share.
#pragma once

#include <memory>
#include <string>

#include "clattn/data.h"

namespace clattn::data {

// The whole file as bytes; errors name the file and say whether it is missing, a directory or
// unreadable.
std::string read_file_bytes(const std::string& path);

std::unique_ptr<Task> make_listops_task(const TaskOptions& opt);
std::unique_ptr<Task> make_text_task(const TaskOptions& opt, TaskKind kind);  // mlm or lm
std::unique_ptr<Task> make_features_task(const TaskOptions& opt);

}  // namespace clattn::data
