// Self-registering CLI commands. A command file defines a static Registration naming its
// parent ("" for top level, "bench" for `strata bench X`), its name and help, and a setup
// function that adds its options to the CLI11 app and returns the action to run.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace strata::cli {

using Action = std::function<int()>;
using Setup = Action (*)(CLI::App& command);

struct CommandSpec {
  std::string parent;
  std::string name;
  std::string help;
  Setup setup;
};

std::vector<CommandSpec>& command_registry();

struct Registration {
  Registration(std::string parent, std::string name, std::string help, Setup setup) {
    command_registry().push_back({std::move(parent), std::move(name), std::move(help), setup});
  }
};

// The --help footer of a command that reads a training config: where to find one to start
// from and what its keys mean.
inline constexpr const char* kConfigHelpFooter =
    "--config is a DeepSpeed-style JSON file; runnable examples are in the source tree's scripts/configs/ "
    "(gpt-demo.json: the GPT with ZeRO-3, bf16 and budget-driven NVMe placement; zero3-bf16.json: ZeRO-3 in bf16 with "
    "the optimizer state in host memory), "
    "and docs/config.md lists every key Strata reads, its default and what DeepSpeed does with it.";

// Prints JSON (already serialised) to stdout with a trailing newline.
void print_json(const std::string& text);

}  // namespace strata::cli
