#include "result_table.h"

#include <algorithm>

#include "cli_util.h"

namespace clattn::cli {

namespace {

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (const char ch : s) {
    if (ch == '"') q += '"';
    q += ch;
  }
  return q + "\"";
}

std::string md_field(const std::string& s) {
  std::string q;
  for (const char ch : s) {
    if (ch == '|') q += '\\';
    q += ch == '\n' ? ' ' : ch;
  }
  return q;
}

std::string pad(const std::string& s, int width, bool left) {
  const size_t w = static_cast<size_t>(std::max(width, 0));
  if (s.size() >= w) return s;
  return left ? s + std::string(w - s.size(), ' ') : std::string(w - s.size(), ' ') + s;
}

}  // namespace

ResultTable::ResultTable(std::string format, std::vector<Column> columns)
    : format_(std::move(format)), columns_(std::move(columns)) {
  usage_check(format_ == "text" || format_ == "md" || format_ == "csv" || format_ == "json" || format_ == "jsonl",
              "unknown output format '", format_, "' (text, md, csv, json, jsonl)");
}

std::string ResultTable::cell(const nlohmann::ordered_json& r, const Column& c, const char* none) const {
  if (!c.text_key.empty() && (format_ == "text" || format_ == "md"))
    if (const auto t = r.find(c.text_key); t != r.end() && t->is_string()) return t->get<std::string>();
  const auto it = r.find(c.key);
  if (it == r.end() || it->is_null()) return none;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_boolean()) return it->get<bool>() ? "true" : "false";
  if (!it->is_number()) return it->dump();
  char buf[64];
  if (c.percent && format_ != "csv")
    std::snprintf(buf, sizeof buf, "%.1f%%", 100.0 * it->get<double>());
  else if (it->is_number_integer() && c.format.empty())
    std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(it->get<int64_t>()));
  else
    std::snprintf(buf, sizeof buf, c.format.empty() ? "%g" : c.format.c_str(), it->get<double>());
  return buf;
}

const std::string* ResultTable::error_of(const nlohmann::ordered_json& r) {
  const auto it = r.find("error");
  return it != r.end() && it->is_string() ? it->get_ptr<const std::string*>() : nullptr;
}

void ResultTable::header() const {
  std::string line;
  if (format_ == "text") {
    for (const Column& c : columns_)
      if (!c.csv_only) line += (line.empty() ? "" : " ") + pad(c.title, c.width, c.left);
  } else if (format_ == "md") {
    std::string sep = "|";
    line = "|";
    for (const Column& c : columns_) {
      if (c.csv_only) continue;
      line += " " + md_field(c.title) + " |";
      sep += c.left ? " :--- |" : " ---: |";
    }
    line += "\n" + sep;
  } else if (format_ == "csv") {
    for (size_t i = 0; i < columns_.size(); ++i) line += (i ? "," : "") + csv_field(columns_[i].key);
  } else {
    return;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void ResultTable::row(const nlohmann::ordered_json& r) const {
  std::string line;
  const std::string* error = error_of(r);
  if (format_ == "text") {
    // A failed case: its labels, then the message in place of the numbers.
    for (const Column& c : columns_) {
      if (c.csv_only || (error && !c.label)) continue;
      line += (line.empty() ? "" : " ") + pad(cell(r, c, "-"), c.width, c.left);
    }
    if (error) line += " error: " + *error;
  } else if (format_ == "md") {
    line = "|";
    bool said = false;  // a failed case's message goes in its first cell that is not a label
    for (const Column& c : columns_) {
      if (c.csv_only) continue;
      std::string v = cell(r, c, "-");
      if (error && !c.label && !said) {
        v = "error: " + *error;
        said = true;
      }
      line += " " + md_field(v) + " |";
    }
  } else if (format_ == "csv") {
    for (size_t i = 0; i < columns_.size(); ++i) line += (i ? "," : "") + csv_field(cell(r, columns_[i], ""));
  } else if (format_ == "jsonl") {
    nlohmann::ordered_json plain = r;  // without the text forms
    for (const Column& c : columns_)
      if (!c.text_key.empty()) plain.erase(c.text_key);
    line = plain.dump();
  } else {
    return;
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

void ResultTable::end(const nlohmann::ordered_json& doc) const {
  if (format_ == "json") std::printf("%s\n", doc.dump(2).c_str());
  std::fflush(stdout);
}

}  // namespace clattn::cli
