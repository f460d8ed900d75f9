// The version `clattn --version` prints and result files record: the project version and the
// commit the build was configured at. They live in one generated file (tools/version.cpp.in ->
// <build>/generated/clattn_version.cpp), so a new commit recompiles that file alone, not every
// command.
#pragma once

namespace clattn::cli {

extern const char* const kVersion;  // "0.3.0"
extern const char* const kCommit;   // "03b7d65", or "unknown" outside a git checkout

}  // namespace clattn::cli
