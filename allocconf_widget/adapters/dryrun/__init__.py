"""The dry run's torch machinery: the user's step on fake tensors, recorded, nothing real touched.

:mod:`.run` is the orchestrator (``DryRun``, ``DryRunTrace``); :mod:`.ports` states what its
parts may touch of each other. This package and ``adapters/torch_private.py`` are the only
places that name private torch APIs (``tests/unit/test_layering.py``); ``app/dryrun`` is the
use case that drives it.
"""
