"""The names dataguard writes in an output folder's work area.

Why in ``io``: the output folder's safety rules (`dataguard.io.output`) must know which files
inside ``_work/`` are dataguard's to clean, and the run engine (`dataguard.run.workdir`) must
write exactly those; keeping the names here lets ``io`` stay below ``run``.
"""

from __future__ import annotations

import re

WORK = "_work"
# Every name dataguard writes inside _work/ (temp files included); cleaning removes only these.
WORK_FILE = re.compile(r"^(fingerprint|seg\d{2}|fit\d{2}|unit-\d{6}(\.rejected)?\.arrow|unit-\d{6}\.meta\.json|"
                       r"unit-\d{6}(\.s\d{2})?\.[a-z]+\.arrow|r\d-\d{5}\.([a-z]+\.arrow|done\.json)|"
                       r"\..+\.tmp-\d+)$")
