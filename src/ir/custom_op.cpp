#include "rlx/ir/custom_op.hpp"

#include <map>
#include <mutex>

#include "rlx/error.hpp"

namespace rlx::ir {

namespace {
struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<const OpExtension>, std::less<>> ops;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

void register_op(std::shared_ptr<const OpExtension> ext) {
  if (!ext) throw Error("register_op: null extension");
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.ops[std::string(ext->name())] = std::move(ext);
}

void register_op_strict(std::shared_ptr<const OpExtension> ext) {
  if (!ext) throw Error("register_op_strict: null extension");
  auto& r = registry();
  std::lock_guard lock(r.mu);
  auto [it, fresh] = r.ops.emplace(std::string(ext->name()), ext);
  if (!fresh) throw Error("register_op_strict: an op named '" + it->first + "' is already registered");
}

bool is_op_registered(std::string_view name) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  return r.ops.find(name) != r.ops.end();
}

std::vector<std::string> registered_op_names() {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, ext] : r.ops) names.push_back(name);
  return names;
}

std::shared_ptr<const OpExtension> find_op_extension(std::string_view name) {
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    if (auto it = r.ops.find(name); it != r.ops.end()) return it->second;
  }
  std::string known;
  for (const auto& n : registered_op_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("custom op '" + std::string(name) + "' is not registered (" +
              (known.empty() ? "none are" : "registered: " + known) + "); call rlx::ir::register_op first");
}

std::vector<AttrSpec> attr_schema_of(OpKind op, const Attrs& attrs) {
  std::vector<AttrSpec> schema = op_attr_schema(op);
  if (op == OpKind::Custom && attrs.has("op")) {
    auto ext = find_op_extension(attrs.get_str("op"));
    for (const auto& s : ext->attr_schema()) schema.push_back(s);
  }
  return schema;
}

NodeId Graph::custom_op(std::string_view name, Attrs attrs, std::vector<NodeId> inputs) {
  attrs.set("op", std::string(name));
  return add(OpKind::Custom, std::move(inputs), std::move(attrs));
}

std::optional<NodeId> Graph::try_custom_op(std::string_view name, Attrs attrs, std::vector<NodeId> inputs,
                                           std::string* error) {
  try {
    return custom_op(name, std::move(attrs), std::move(inputs));
  } catch (const Error& e) {
    if (error) *error = e.what();
    return std::nullopt;
  }
}

}  // namespace rlx::ir
