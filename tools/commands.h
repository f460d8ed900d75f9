// Subcommands of the clattn CLI. Each adds itself to the app and runs when selected.
#pragma once

#include <CLI/CLI.hpp>

namespace clattn::cli {

void add_approx(CLI::App& app);
void add_attend(CLI::App& app);
void add_generate(CLI::App& app);
void add_classify(CLI::App& app);
void add_embed(CLI::App& app);
void add_tokenize(CLI::App& app);
void add_bench(CLI::App& app);
void add_bench_model(CLI::App& app);
void add_make_inputs(CLI::App& app);
void add_train(CLI::App& app);
void add_eval(CLI::App& app);
void add_plot(CLI::App& app);
void add_inspect(CLI::App& app);
void add_variants(CLI::App& app);

}  // namespace clattn::cli
