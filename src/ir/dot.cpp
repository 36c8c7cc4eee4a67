#include <fcntl.h>
#include <fmt/format.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "rlx/error.hpp"
#include "rlx/ir/control_flow.hpp"
#include "rlx/ir/text.hpp"

extern char** environ;

namespace rlx::ir {
namespace {

// A DOT string literal; a newline becomes DOT's centered line break.
std::string dot_quote(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + '"';
}

std::string_view fill_color(OpKind op) {
  switch (op_info(op).cls) {
    case OpClass::Leaf: return op == OpKind::Input ? "#d4edda" : "#e8e8e8";
    case OpClass::MatMul: return "#cfe2ff";
    case OpClass::Reduce: return "#fff3cd";
    case OpClass::Composite: return "#f8d7da";
    case OpClass::Custom: return "#e2d9f3";
    case OpClass::ControlFlow: return "#d1ecf1";
    default: return "white";
  }
}

// A fresh file in the temp directory, removed when it goes out of scope.
class TempFile {
 public:
  explicit TempFile(std::string_view suffix)
      : path_((std::filesystem::temp_directory_path() / fmt::format("rlx-XXXXXX{}", suffix)).string()) {
    int fd = ::mkstemps(path_.data(), static_cast<int>(suffix.size()));
    if (fd < 0) throw Error(fmt::format("write_svg: cannot create a temp file: {}", std::strerror(errno)));
    ::close(fd);
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

std::string to_dot(const Graph& g) {
  std::string out = fmt::format("digraph {} {{\n", dot_quote(g.name()));
  out += "  node [shape=box, style=\"rounded,filled\", fontname=\"monospace\"];\n";
  for (const Node& n : g.nodes()) {
    std::string label = fmt::format("%{} {}", n.id, op_name(n.op));
    auto name = n.attrs.items().find("name");
    if (name != n.attrs.items().end() && std::holds_alternative<std::string>(name->second))
      label += fmt::format(" \"{}\"", std::get<std::string>(name->second));
    // Bodies are named rather than drawn: a loop's body would otherwise be
    // repeated once per result node.
    for (const auto& [key, body] : bodies_of(n)) label += fmt::format("\n{}: {}", key, (*body)->name());
    if (is_control_flow(n.op)) label += fmt::format("\nresult {}", n.attrs.get_int("result"));
    label += fmt::format("\n{}{}", dtype_name(n.dtype), n.shape.str());
    out += fmt::format("  n{} [label={}, fillcolor=\"{}\"];\n", n.id, dot_quote(label), fill_color(n.op));
    // Operand order matters for most multi-input ops (sub, matmul, where), so number the edges.
    for (std::size_t i = 0; i < n.inputs.size(); ++i)
      out += n.inputs.size() == 1 ? fmt::format("  n{} -> n{};\n", n.inputs[i], n.id)
                                  : fmt::format("  n{} -> n{} [label=\"{}\"];\n", n.inputs[i], n.id, i);
  }
  for (std::size_t i = 0; i < g.outputs().size(); ++i) {
    const GraphOutput& o = g.outputs()[i];
    std::string label = o.name.empty() ? fmt::format("output {}", i) : "output " + o.name;
    out += fmt::format("  out{} [shape=ellipse, style=solid, label={}];\n  n{} -> out{};\n", i, dot_quote(label),
                       o.node, i);
  }
  return out + "}\n";
}

void write_svg(const Graph& g, const std::string& path) {
  TempFile dot_file(".dot"), err_file(".err");
  {
    std::ofstream f(dot_file.path(), std::ios::binary);
    f << to_dot(g);
    if (!f.flush()) throw Error("write_svg: cannot write " + dot_file.path());
  }
  // posix_spawnp rather than system(): no shell, so paths need no quoting.
  std::string args[] = {"dot", "-Tsvg", "-o", path, dot_file.path()};
  char* argv[] = {args[0].data(), args[1].data(), args[2].data(), args[3].data(), args[4].data(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, err_file.path().c_str(), O_WRONLY | O_TRUNC, 0);
  pid_t pid;
  int rc = posix_spawnp(&pid, "dot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0)
    throw Error(fmt::format("write_svg: cannot run graphviz 'dot' ({}); is graphviz installed and on PATH?",
                            std::strerror(rc)));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw Error(fmt::format("write_svg: waiting for 'dot' failed: {}", std::strerror(errno)));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    std::string err = read_file(err_file.path());
    while (!err.empty() && std::isspace(static_cast<unsigned char>(err.back()))) err.pop_back();
    throw Error(fmt::format("write_svg: 'dot -Tsvg -o {}' failed ({} {}): {}", path,
                            WIFEXITED(status) ? "exit code" : "signal",
                            WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), err));
  }
}

}  // namespace rlx::ir
