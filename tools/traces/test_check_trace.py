#!/usr/bin/env python3
"""check_trace.py must accept a valid trace and reject each thing docs/trace-format.md rejects.

    python3 tools/traces/test_check_trace.py
"""

from __future__ import annotations

import gzip
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_trace  # noqa: E402

VALID = """zicoum-trace 1
meta model tiny
meta command python3 make_tiny.py --batch 2
meta source meta
meta batch 2
meta iterations 2
meta timing made up
a 0 1024 0 param -1
i 0 0
a 1 64 0 input -1
a 2 256 0 act 0
o 0 0 4000 mm 0,1 2
a 3 256 4000 temp 1
o 1 4000 4000 relu 2 3
f 1 8000
f 3 8000
o 2 8000 4000 add_.Tensor 0,2 0
f 2 12000
i 1 12000
o 3 12000 0 empty - -
end 13
"""


class CheckTraceTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, text: str, raw: bytes | None = None) -> str:
        path = os.path.join(self.dir.name, "t.ztrace.gz")
        with open(path, "wb") as f:
            f.write(raw if raw is not None else gzip.compress(text.encode()))
        return path

    def rejects(self, text: str, problem: str, line: int | None = None, raw: bytes | None = None):
        with self.assertRaises(check_trace.TraceError) as ctx:
            check_trace.check(self.write(text, raw))
        self.assertIn(problem, str(ctx.exception))
        if line is not None:
            self.assertEqual(ctx.exception.line, line)

    def test_valid(self):
        s = check_trace.check(self.write(VALID))
        self.assertEqual((s["records"], s["ops"], s["blocks"], s["iterations"]), (13, 4, 4, 2))
        self.assertEqual(s["peak"], 1024 + 64 + 256 + 256)

    def test_magic_and_version(self):
        self.rejects(VALID.replace("zicoum-trace 1", "ztrace 1"), "missing magic", 1)
        self.rejects(VALID.replace("zicoum-trace 1", "zicoum-trace 2"), "unknown version", 1)

    def test_record_shape(self):
        self.rejects(VALID.replace("f 1 8000", "x 1 8000"), "unknown record type", 15)
        self.rejects(VALID.replace("f 1 8000", "f 1 8000 9"), "fields", 15)
        self.rejects(VALID.replace("f 1 8000", "f 1  8000"), "fields", 15)
        self.rejects(VALID.replace("f 1 8000", "f +1 8000"), "malformed integer", 15)
        self.rejects(VALID.replace("f 1 8000", "f -1 8000"), "malformed integer", 15)

    def test_allocations(self):
        self.rejects(VALID.replace("a 1 64 0 input -1", "a 1 0 0 input -1"), "size of zero", 10)
        self.rejects(VALID.replace("a 1 64 0 input -1", "a 1 64 0 weights -1"), "unknown category", 10)
        self.rejects(VALID.replace("a 1 64 0 input -1", "a 0 64 0 input -1"), "allocated twice", 10)
        self.rejects(VALID.replace("a 2 256 0 act 0", "a 2 256 0 act 1"), "neither -1 nor", 11)

    def test_frees_and_liveness(self):
        self.rejects(VALID.replace("f 3 8000", "f 1 8000"), "not live", 16)
        self.rejects(VALID.replace("f 2 12000", "f 9 12000"), "not live", 18)
        self.rejects(VALID.replace("o 2 8000 4000 add_.Tensor 0,2 0", "o 2 8000 4000 add_.Tensor 0,3 0"),
                     "not live", 17)

    def test_sequences_and_time(self):
        self.rejects(VALID.replace("o 1 4000", "o 2 4000"), "out of sequence", 14)
        self.rejects(VALID.replace("i 1 12000", "i 2 12000"), "out of sequence", 19)
        self.rejects(VALID.replace("f 3 8000", "f 3 7999"), "backwards", 16)

    def test_meta(self):
        self.rejects(VALID.replace("meta timing made up\n", ""), "missing required meta", 7)
        self.rejects(VALID.replace("i 1 12000\n", "i 1 12000\nmeta late yes\n"), "meta after", 20)

    def test_end(self):
        self.rejects(VALID.replace("end 13", "end 12"), "end count", 21)
        self.rejects(VALID.replace("end 13\n", ""), "missing end", 20)
        self.rejects(VALID + "f 0 12000\n", "after the end", 22)

    def test_gzip(self):
        data = gzip.compress(VALID.encode())
        self.rejects("", "gzip", raw=data[:-12])
        self.rejects("", "gzip", raw=data[:10] + bytes(b ^ 0xFF for b in data[10:30]) + data[30:])

    def test_capture_conventions(self):
        # An op's allocations must come right before it and be among its writes.
        self.rejects(VALID.replace("o 0 0 4000 mm 0,1 2", "o 0 0 4000 mm 0,1 -"), "not among its writes", 11)
        self.rejects(VALID.replace("a 2 256 0 act 0\n", "a 2 256 0 act 0\nf 1 0\n"), "does not follow", 11)
        self.rejects(VALID.replace("meta iterations 2", "meta iterations 3"), "meta iterations")


if __name__ == "__main__":
    unittest.main()
