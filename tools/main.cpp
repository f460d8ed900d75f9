// clattn: attention for long sequences on the CPU. `clattn --help` lists the subcommands.
#include <cstdio>
#include <exception>

#include "clattn/error.h"
#include "commands.h"

int main(int argc, char** argv) {
  CLI::App app{"clattn: clustered attention and its rivals, fast on the CPU"};
  app.require_subcommand(1);
  clattn::cli::add_approx(app);
  clattn::cli::add_attend(app);
  clattn::cli::add_generate(app);
  clattn::cli::add_bench(app);
  clattn::cli::add_bench_model(app);
  clattn::cli::add_make_inputs(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const clattn::Error& e) {
    std::fprintf(stderr, "clattn: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "clattn: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
