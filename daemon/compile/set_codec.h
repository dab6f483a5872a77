// The compiled set as the compile helper writes it for the root spawner
// (daemon/wire/compiled.h has the format and the spawner's decoder).
#pragma once

#include <string>

#include "daemon/wire/compiled.h"

namespace tsb::spawn {

std::string encode_compiled_set(const CompiledSet& s);

}  // namespace tsb::spawn
