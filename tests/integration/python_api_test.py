"""The zicoum Python package against the real libzicoum on the sim backend.

Usage: python_api_test.py [SIZES_H [LIBRARY]], with PYTHONPATH=<build>/python,
ZICO_BACKEND=sim and ZICO_BUDGET=64MiB (CTest sets them). SIZES_H lets the
test check zicoum.SIZE_FORM against kSizeForm; LIBRARY is the library the
package should find by itself.
"""

import ctypes
import os
import re
import subprocess
import sys
import unittest

MiB = 1 << 20
ARGS = sys.argv[1:]

# Other ZICO_* variables from the caller's shell (chunk size, sim capacity)
# would change how many allocations fit; the budget and backend are the test's.
for _name in [n for n in os.environ if n.startswith("ZICO_") and n not in ("ZICO_LIBRARY",)]:
    del os.environ[_name]
os.environ.update(ZICO_BACKEND="sim", ZICO_BUDGET="64MiB")

import zicoum  # noqa: E402  (after the environment is settled)


class ParseSizeTest(unittest.TestCase):
    def test_accepted_forms(self):
        for text, expected in [("4096", 4096), ("0", 0), ("512B", 512), ("1KiB", 1024), ("64MiB", 64 * MiB),
                               ("64m", 64 * MiB), ("2GiB", 2 << 30), ("6g", 6 << 30), ("1.5GB", 1_500_000_000),
                               ("1KB", 1000), ("1TiB", 1 << 40), ("64Mi", 64 * MiB), ("20Gi", 20 << 30),
                               ("512Ki", 512 << 10), ("1Ti", 1 << 40)]:
            with self.subTest(text=text):
                self.assertEqual(zicoum.parse_size(text), expected)

    def test_errors_name_the_text_and_the_form(self):
        for text in ["", "12XB", "MiB", "-1GiB", "1 GiB extra", "99999999999TiB", "1\0GiB"]:
            with self.subTest(text=text):
                with self.assertRaises(ValueError) as caught:
                    zicoum.parse_size(text)
                self.assertIn(f"'{text}'", str(caught.exception))
                self.assertIn(zicoum.SIZE_FORM, str(caught.exception))

    def test_rejects_non_strings(self):
        with self.assertRaises(TypeError):
            zicoum.parse_size(64)

    @unittest.skipUnless(ARGS, "no path to umm/sizes.h given")
    def test_form_matches_the_library(self):
        with open(ARGS[0]) as header:
            match = re.search(r"kSizeForm\s*=\s*((?:\s*\"[^\"]*\")+);", header.read())
        self.assertIsNotNone(match, "kSizeForm not found in sizes.h")
        self.assertEqual("".join(re.findall(r"\"([^\"]*)\"", match.group(1))), zicoum.SIZE_FORM)


class LibraryTest(unittest.TestCase):
    @unittest.skipUnless(len(ARGS) > 1 and "ZICO_LIBRARY" not in os.environ, "no expected library given")
    def test_finds_the_build_tree_library_without_environment(self):
        self.assertEqual(os.path.realpath(zicoum.library_path()), os.path.realpath(ARGS[1]))

    def test_status_string(self):
        self.assertTrue(zicoum.status_string(zicoum.Status.OUT_OF_MEMORY))

    def test_bad_device_raises_zico_error(self):
        with self.assertRaises(zicoum.ZicoError) as caught:
            zicoum.stats(device=1000)
        self.assertIn(caught.exception.status, (zicoum.Status.INVALID_VALUE, zicoum.Status.NO_DEVICE))

    def test_mark_iteration_is_counted(self):
        before = zicoum.stats()["iterations"]
        zicoum.mark_iteration()
        self.assertEqual(zicoum.stats()["iterations"], before + 1)


class StartFailureTest(unittest.TestCase):
    def test_the_reason_is_printed_once(self):
        # A process of its own: libzicoum starts once per process. The reason
        # is the exception's; the library's log line of it is not printed too.
        program = ("import zicoum\n"
                   "try:\n"
                   "    zicoum.stats()\n"
                   "except zicoum.ZicoError as error:\n"
                   "    print(error)\n")
        environment = dict(os.environ, ZICO_BUDGET="12XB")
        run = subprocess.run([sys.executable, "-c", program], env=environment, capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("ZICO_BUDGET='12XB'", run.stdout)
        self.assertNotIn("12XB", run.stderr)


class BudgetTest(unittest.TestCase):
    def setUp(self):
        self.lib = ctypes.CDLL(zicoum.library_path())
        self.lib.zico_torch_malloc.restype = ctypes.c_void_p
        self.lib.zico_torch_malloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.lib.zico_torch_free.restype = None
        self.lib.zico_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
        self.lib.zico_malloc.restype = ctypes.c_int
        self.lib.zico_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_int,
                                         ctypes.c_void_p]
        self.lib.zico_free.restype = ctypes.c_int
        self.lib.zico_free.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    # zico_torch_malloc signals out-of-memory with a C++ exception, which ctypes
    # cannot catch, so the fill-to-the-budget loop uses the C API.
    def allocate_until_full(self):
        pointers = []
        while len(pointers) < 1000:  # far past the budget: a runaway guard, not a limit
            pointer = ctypes.c_void_p()
            status = self.lib.zico_malloc(ctypes.byref(pointer), MiB, 0, None)
            if status == zicoum.Status.OUT_OF_MEMORY:
                return pointers
            self.assertEqual(status, zicoum.Status.OK)
            pointers.append(pointer.value)
        self.fail(f"{len(pointers)} MiB allocated under a 64 MiB budget")

    def free_all(self, pointers):
        for pointer in pointers:
            self.assertEqual(self.lib.zico_free(pointer, None), zicoum.Status.OK)

    def test_budget_caps_allocations_and_memory_holds_data(self):
        self.assertEqual(zicoum.stats()["budget_bytes"], 64 * MiB)
        pointers = self.allocate_until_full()
        try:
            self.assertTrue(60 <= len(pointers) <= 64, f"{len(pointers)} x 1 MiB fit in 64 MiB")
            self.assertGreaterEqual(zicoum.stats()["failed_allocations"], 1)
            self.assertEqual(len(set(pointers)), len(pointers))
            for i, pointer in enumerate(pointers):
                pattern = bytes([i % 251]) * 64
                ctypes.memmove(pointer, pattern, len(pattern))  # first bytes
                ctypes.memmove(pointer + MiB - len(pattern), pattern, len(pattern))  # last bytes
            for i, pointer in enumerate(pointers):
                pattern = bytes([i % 251]) * 64
                self.assertEqual(ctypes.string_at(pointer, len(pattern)), pattern, f"allocation {i}, start")
                self.assertEqual(ctypes.string_at(pointer + MiB - len(pattern), len(pattern)), pattern,
                                 f"allocation {i}, end")
        finally:
            self.free_all(pointers)

        self.assertEqual(zicoum.stats()["allocated_bytes"], 0)
        again = self.allocate_until_full()
        self.free_all(again)
        self.assertTrue(60 <= len(again) <= 64, f"{len(again)} x 1 MiB fit after freeing everything")

    def test_suspend_and_resume_keep_the_data(self):
        pointer = ctypes.c_void_p()
        self.assertEqual(self.lib.zico_malloc(ctypes.byref(pointer), 3 * MiB, 0, None), zicoum.Status.OK)
        ctypes.memmove(pointer.value, b"zicoum" * 100, 600)
        zicoum.suspend(device=0, to="host")
        self.assertEqual(zicoum.stats()["mapped_bytes"], 0)
        other = ctypes.c_void_p()
        self.assertEqual(self.lib.zico_malloc(ctypes.byref(other), MiB, 0, None), zicoum.Status.SUSPENDED)
        with self.assertRaises(zicoum.ZicoError) as caught:
            zicoum.suspend(device=0)
        self.assertEqual(caught.exception.status, zicoum.Status.SUSPENDED)
        zicoum.resume(device=0)
        self.assertEqual(ctypes.string_at(pointer.value, 600), b"zicoum" * 100)
        zicoum.suspend(device=0, to="nvme")
        zicoum.resume(device=0)
        self.assertEqual(ctypes.string_at(pointer.value, 600), b"zicoum" * 100)
        self.assertEqual(self.lib.zico_free(pointer, None), zicoum.Status.OK)
        with self.assertRaises(ValueError):
            zicoum.suspend(to="tape")

    def test_record_stream_checks_the_pointer(self):
        pointer = ctypes.c_void_p()
        self.assertEqual(self.lib.zico_malloc(ctypes.byref(pointer), 3 * MiB, 0, None), zicoum.Status.OK)
        zicoum.record_stream(pointer.value, 0x5000)
        for bad, says in ((pointer.value + 512, "not the start of a live allocation"),
                          (id(self), "not allocated by zicoum")):
            with self.assertRaises(zicoum.ZicoError) as caught:
                zicoum.record_stream(bad, 0x5000)
            self.assertEqual(caught.exception.status, zicoum.Status.INVALID_VALUE)
            self.assertIn(says, str(caught.exception))
        with self.assertRaises(zicoum.ZicoError) as caught:
            zicoum.record_stream(pointer.value, 2)  # cudaStreamPerThread
        self.assertIn("cudaStreamPerThread", str(caught.exception))
        self.assertEqual(self.lib.zico_free(pointer, None), zicoum.Status.OK)
        with self.assertRaises(zicoum.ZicoError):
            zicoum.record_stream(pointer.value, 0x5000)  # freed

    def test_empty_cache_keeps_within_budget(self):
        pointer = self.lib.zico_torch_malloc(MiB, 0, None)
        self.assertTrue(pointer)
        self.lib.zico_torch_free(pointer, MiB, 0, None)
        zicoum.empty_cache()
        self.assertLessEqual(zicoum.stats()["mapped_bytes"], 64 * MiB)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
