// Test support: GPU tests skip, saying why, where this LibTorch has no CUDA or CUDA sees no
// device (scripts/gpu-check runs them on a GPU machine).
#pragma once

#include <gtest/gtest.h>

#include "runtime/device.h"

#define LOOM_NEED_GPU()                                                                 \
  do {                                                                                  \
    if (::loom::runtime::cuda_device_count() < 1)                                       \
      GTEST_SKIP() << "no usable GPU here (this LibTorch has no CUDA, or CUDA sees no " \
                      "device): scripts/gpu-check runs this on a GPU machine";          \
  } while (0)
