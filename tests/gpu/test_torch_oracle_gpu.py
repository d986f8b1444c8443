"""Differential test against a CUDA build of torch: every key, not just the generic ones.

With ``libc10_cuda`` loaded, torch's runtime setter runs the generic parser
*and* the CUDA parser and rejects unknown keys, so it is an oracle for the
whole option set of that release (``backend`` excluded: the setter asserts
on any backend other than the load-time one, which is lifecycle, not grammar).
The strings are judged in a separate interpreter so the setter's state never
leaks into other tests. Same two properties as the CPU test:
never accept what torch rejects; accept every well-formed string torch accepts.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap

import pytest

from allocconf_widget import AllocConfError, parse_conf
from allocconf_widget.core.config import options as opt
from allocconf_widget.core.versions import parse_version
from tests.oracle_strings import make_case

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA build with a GPU"),
]

_JUDGE = textwrap.dedent("""
    import json, sys, torch
    setter = torch._C._accelerator_setAllocatorSettings
    out = []
    for text in json.load(sys.stdin):
        try:
            setter("large_segment_size_mb:20")
        except Exception:
            pass
        try:
            setter(text); out.append(True)
        except Exception:
            out.append(False)
    print(json.dumps(out))
""")


def test_every_key_against_the_cuda_parser():
    version = parse_version(torch.__version__)
    keys = [s.name for s in opt.options_for(version) if s.name != "backend"]
    rng = random.Random(2026)
    cases = [make_case(rng, keys) for _ in range(4000)]
    proc = subprocess.run([sys.executable, "-c", _JUDGE], input=json.dumps([c.text for c in cases]),
                          capture_output=True, text=True, check=True, timeout=600)
    verdicts = json.loads(proc.stdout.strip().splitlines()[-1])
    ours_only, theirs_only = [], []
    for case, theirs in zip(cases, verdicts, strict=True):
        try:
            parse_conf(case.text, version, warn=False)
            ours = True
        except AllocConfError:
            ours = False
        if ours and not theirs:
            ours_only.append(case.text)
        if case.well_formed and theirs and not ours:
            theirs_only.append(case.text)
    print(f"\n{len(cases)} strings, keys {keys}, torch {torch.__version__}: "
          f"torch accepted {sum(verdicts)}")
    assert sum(verdicts) > 500 and len(cases) - sum(verdicts) > 500
    assert ours_only == [], ours_only[:20]
    assert theirs_only == [], theirs_only[:20]
