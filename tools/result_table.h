// Result rows in the -o formats of every command that prints results (bench, bench-model,
// variants): text (an aligned table), md (a Markdown table), csv (a header row, then one line per
// result), json (one document at the end) and jsonl (one JSON object per result). A row is a JSON
// object; each column reads one key of it and formats numbers with its printf format; null (a
// value that does not apply) prints "-" in the tables and nothing in csv. A row whose "error" key
// holds a string is a failed case: the tables print its label columns and the message.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace clattn::cli {

struct Column {
  std::string title;   // text and md header
  std::string key;     // the row's key, also the csv header
  std::string format;  // printf format of a number, e.g. "%.1f"; strings print as they are
  int width = 10;      // text: the column's width (right-aligned unless `left`)
  bool left = false;
  bool percent = false;  // a fraction shown as "12.3%" in text and md; csv keeps it with `format`
  bool label = false;  // names the case (spec, length, mode): kept in a failed case's table row
  bool csv_only = false;
  // text and md read this key instead when the row holds it (a mean with its range, a label with
  // a note), csv and jsonl the plain value under `key` (jsonl rows leave the text forms out).
  std::string text_key = "";
};

class ResultTable {
 public:
  // Throws a UsageError for an unknown format.
  ResultTable(std::string format, std::vector<Column> columns);
  const std::string& format() const { return format_; }
  // Where a command's preamble (machine, settings) goes: stdout under the text table, stderr for
  // the machine-readable formats, whose stdout holds their data only.
  FILE* preamble() const { return format_ == "text" ? stdout : stderr; }
  void header() const;
  void row(const nlohmann::ordered_json& r) const;
  // json: prints the whole document.
  void end(const nlohmann::ordered_json& doc) const;

 private:
  std::string cell(const nlohmann::ordered_json& r, const Column& c, const char* none) const;
  static const std::string* error_of(const nlohmann::ordered_json& r);  // a failed case's message
  std::string format_;
  std::vector<Column> columns_;
};

}  // namespace clattn::cli
