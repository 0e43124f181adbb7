// No function outside tests runs past 80 lines (STYLE.md: a function does one phase). Every
// .cc and .h of the source folders is read with its comments, string and character literals and
// preprocessor lines blanked; a function body is a brace block, outside any other function,
// whose header has a parameter list and is not a namespace, class, struct, enum or initialiser.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

namespace fs = std::filesystem;

constexpr int kMaxLines = 80;
const char* const kFolders[] = {"core",      "checkpoint", "data",  "observe", "graph", "planner",
                                "scheduler", "models",     "lower", "plan",    "comm",  "runtime",
                                "launch",    "loom",       "bench", "examples"};

bool ident(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// `src` with comments, literals and preprocessor lines replaced by spaces (newlines kept).
std::string code_only(const std::string& src) {
  std::string out = src;
  size_t i = 0;
  bool line_start = true;
  auto blank = [&](size_t from, size_t to) {
    for (size_t k = from; k < to && k < out.size(); ++k)
      if (out[k] != '\n') out[k] = ' ';
  };
  while (i < src.size()) {
    const char c = src[i];
    if (c == '\n') {
      line_start = true;
      ++i;
      continue;
    }
    if (line_start && c == '#') {  // a preprocessor line and its continuations
      size_t end = i;
      while (end < src.size() && !(src[end] == '\n' && src[end - 1] != '\\')) ++end;
      blank(i, end);
      i = end;
      continue;
    }
    if (!std::isspace(static_cast<unsigned char>(c))) line_start = false;
    if (c == '/' && i + 1 < src.size() && src[i + 1] == '/') {
      const size_t end = src.find('\n', i);
      blank(i, end == std::string::npos ? src.size() : end);
      i = end == std::string::npos ? src.size() : end;
    } else if (c == '/' && i + 1 < src.size() && src[i + 1] == '*') {
      const size_t end = src.find("*/", i + 2);
      const size_t stop = end == std::string::npos ? src.size() : end + 2;
      blank(i, stop);
      i = stop;
    } else if (c == 'R' && i + 1 < src.size() && src[i + 1] == '"' &&
               (i == 0 || !ident(src[i - 1]))) {
      const size_t open = src.find('(', i + 2);
      const std::string close = ")" + src.substr(i + 2, open - i - 2) + "\"";
      const size_t end = src.find(close, open);
      const size_t stop = end == std::string::npos ? src.size() : end + close.size();
      blank(i, stop);
      i = stop;
    } else if (c == '"' || (c == '\'' && (i == 0 || !ident(src[i - 1])))) {
      size_t k = i + 1;
      while (k < src.size() && src[k] != c && src[k] != '\n') k += src[k] == '\\' ? 2 : 1;
      blank(i, k + 1);
      i = k + 1;
    } else {
      ++i;
    }
  }
  return out;
}

std::string squeeze(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::isspace(static_cast<unsigned char>(c))) {
      if (!out.empty() && out.back() != ' ') out += ' ';
    } else {
      out += c;
    }
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (!out.empty() && out.front() == ' ') out.erase(0, 1);
  return out;
}

// Whether a block header opens a scope that holds declarations, not statements.
bool scope_header(std::string h) {
  if (h.rfind("template", 0) == 0) {  // skip template <...>
    int depth = 0;
    size_t k = h.find('<');
    for (; k != std::string::npos && k < h.size(); ++k) {
      if (h[k] == '<') ++depth;
      if (h[k] == '>' && --depth == 0) break;
    }
    h = k == std::string::npos || k >= h.size() ? std::string() : squeeze(h.substr(k + 1));
  }
  for (const char* word : {"namespace", "struct", "class", "enum", "union", "extern"}) {
    const size_t n = std::string(word).size();
    if (h.compare(0, n, word) == 0 && (h.size() == n || !ident(h[n]))) return true;
  }
  return false;
}

struct LongFunction {
  std::string where;
  int lines = 0;
};

std::vector<LongFunction> long_functions(const fs::path& file, const std::string& name) {
  std::ifstream in(file);
  std::stringstream text;
  text << in.rdbuf();
  const std::string src = code_only(text.str());
  enum Kind { kScope, kFunction, kBlock };
  struct Open {
    Kind kind;
    int line;
    std::string header;
  };
  std::vector<Open> stack;
  std::vector<LongFunction> out;
  size_t last = 0;
  int line = 1;
  for (size_t i = 0; i < src.size(); ++i) {
    const char c = src[i];
    if (c == '\n') {
      ++line;
    } else if (c == '{') {
      const std::string h = squeeze(src.substr(last, i - last));
      Kind kind = kBlock;
      bool in_function = false;
      for (const Open& o : stack) in_function = in_function || o.kind == kFunction;
      if (!in_function) {
        if (scope_header(h))
          kind = kScope;
        else if (h.find('(') != std::string::npos && (h.empty() || h.back() != '='))
          kind = kFunction;
      }
      stack.push_back({kind, line, h});
      last = i + 1;
    } else if (c == '}') {
      if (!stack.empty()) {
        const Open o = stack.back();
        stack.pop_back();
        const int lines = line - o.line + 1;
        if (o.kind == kFunction && lines > kMaxLines)
          out.push_back({name + ":" + std::to_string(o.line) + ": " +
                             o.header.substr(o.header.size() > 100 ? o.header.size() - 100 : 0),
                         lines});
      }
      last = i + 1;
    } else if (c == ';') {
      last = i + 1;
    }
  }
  return out;
}

TEST(Style, NoFunctionPastEightyLines) {
  const fs::path root = LOOM_SOURCE_DIR;
  int files = 0;
  std::string found;
  for (const char* folder : kFolders) {
    if (!fs::is_directory(root / folder)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root / folder)) {
      const std::string ext = entry.path().extension().string();
      if (!entry.is_regular_file() || (ext != ".cc" && ext != ".h")) continue;
      ++files;
      for (const LongFunction& f :
           long_functions(entry.path(), fs::relative(entry.path(), root).string()))
        found += "  " + f.where + " (" + std::to_string(f.lines) + " lines)\n";
    }
  }
  EXPECT_GT(files, 100);  // the folders were found
  EXPECT_TRUE(found.empty()) << "functions over " << kMaxLines << " lines:\n" << found;
}

// The scan itself: a long function is found, a long namespace, class or initialiser is not.
TEST(Style, TheScanFindsALongFunctionOnly) {
  const fs::path file = fs::path(testing::TempDir()) / "loom_style_probe.cc";
  std::string body;
  for (int i = 0; i < 120; ++i) body += "  x += 1;  // }\n";
  std::ofstream(file) << "#include <x>\nnamespace a {\nstruct S {\n  int f(int x) {\n"
                      << body << "    return x;\n  }\n};\nconst int kTable[] = {\n"
                      << std::string(120 * 3, ' ')
                      << "\n};\nint g(int x) {\n  const char* s = \"{\";\n"
                      << body << "  return x;\n}\n}  // namespace a\n";
  const auto found = long_functions(file, "probe.cc");
  ASSERT_EQ(found.size(), 2u);
  EXPECT_NE(found[0].where.find("int f(int x)"), std::string::npos) << found[0].where;
  EXPECT_NE(found[1].where.find("int g(int x)"), std::string::npos) << found[1].where;
  fs::remove(file);
}

}  // namespace
