#include "size_classes.h"

#include <gtest/gtest.h>

namespace zico {
namespace {

TEST(SizeClasses, CoverEverySmallSizeWithBoundedWaste) {
  for (size_t bytes = 1; bytes <= kSmallMax; ++bytes) {
    const size_t cls = size_class_of(bytes);
    ASSERT_LT(cls, kNumSizeClasses);
    const size_t rounded = size_class_bytes(cls);
    ASSERT_GE(rounded, bytes);
    ASSERT_EQ(rounded % kBlockAlign, 0u);
    if (bytes > kMinBlock) {
      ASSERT_LE(rounded, bytes + bytes / 4 + kBlockAlign) << bytes;
    }
    if (cls > 0) {
      ASSERT_LT(size_class_bytes(cls - 1), bytes) << "not the smallest class that fits " << bytes;
    }
  }
}

// The allocator finds a block's slot by multiplying with a reciprocal instead
// of dividing; a wrong slot would hand out overlapping blocks.
TEST(SizeClasses, ReciprocalSlotEqualsDivisionOnEveryPageOffset) {
  for (size_t cls = 0; cls < kNumSizeClasses; ++cls) {
    const size_t size = size_class_bytes(cls);
    for (size_t offset = 0; offset < kSmallPageMax; offset += 256) {
      ASSERT_EQ(size_class_slot(cls, offset), offset / size) << "class " << size << " offset " << offset;
    }
    ASSERT_EQ(size_class_slot(cls, kSmallPageMax - 1), (kSmallPageMax - 1) / size);
  }
}

}  // namespace
}  // namespace zico
