#include "launch/files.h"

#include <fstream>

namespace loom::cli {

Status write_file_atomically(const std::filesystem::path& path, const std::string& content) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return Error::at(path.string(), "cannot write '" + tmp.string() + "'");
    out << content;
    out.flush();
    if (!out) return Error::at(path.string(), "failed writing '" + tmp.string() + "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return Error::at(path.string(), "cannot rename '" + tmp.string() + "': " + ec.message());
  return Status::success();
}

}  // namespace loom::cli
